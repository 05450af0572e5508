"""The custom sequence collectives pass opcheck, and attention traces under torch.compile."""

from __future__ import annotations

import pytest
import torch
from dt_core.testing import cpu_mesh


@pytest.mark.ranks(2)
def test_opcheck_and_autograd_of_sequence_collectives() -> None:
    import torch.distributed as dist

    mesh = cpu_mesh(2)
    group = mesh.get_group(0).group_name
    rank = dist.get_rank()
    sizes = [3, 2]  # uneven
    x = torch.randn(2, 3, sizes[rank], 4, dtype=torch.float64) + rank
    full = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    gather = torch.ops.dt_cp.all_gather_seq.default
    scatter = torch.ops.dt_cp.reduce_scatter_seq.default
    torch.library.opcheck(gather, (x, 2, sizes, group))
    torch.library.opcheck(scatter, (full, 2, sizes, group))

    # Values: gathered rows are every rank's rows in order; scatter sums and slices.
    gathered = gather(x, 2, sizes, group)
    pieces = [torch.empty(2, 3, 3, 4, dtype=torch.float64) for _ in range(2)]
    padded = torch.cat([x, x.new_zeros(2, 3, 3 - sizes[rank], 4)], 2)
    dist.all_gather(pieces, padded)
    assert torch.equal(gathered, torch.cat([pieces[0][:, :, :3], pieces[1][:, :, :2]], 2))
    total = full.clone()
    dist.all_reduce(total)
    start = sum(sizes[:rank])
    assert torch.equal(scatter(full, 2, sizes, group), total[:, :, start : start + sizes[rank]])

    # Autograd: d(all_gather)/dx is the reduce-scatter of the upstream gradient.
    xg = x.clone().requires_grad_()
    weight = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    (gather(xg, 2, sizes, group) * weight).sum().backward()
    wsum = weight.clone()
    dist.all_reduce(wsum)
    assert torch.equal(xg.grad, wsum[:, :, start : start + sizes[rank]])


@pytest.mark.ranks(2)
def test_compiled_forward_matches_eager_reference() -> None:
    import warnings

    import dt_cp
    import torch.nn.functional as F

    mesh = cpu_mesh(2)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 10, 8, generator=gen) for _ in "qkv")
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    qd, kd, vd = (dt_cp.shard_sequence(t, mesh, 2) for t in (q, k, v))

    @torch.compile(backend="aot_eager", fullgraph=True, dynamic=False)
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    torch.compiler.reset()
    from dt_cp.plan import reset_warnings

    reset_warnings()
    with warnings.catch_warnings(record=True) as caught, dt_cp.settings(algorithm="ring"):
        warnings.simplefilter("always")
        got = attend(qd, kd, vd).full_tensor()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    messages = [str(w.message) for w in caught if "dt-cp" in str(w.message)]
    assert any("torch.compile" in m for m in messages), messages  # ring -> all-gather, said


@pytest.mark.ranks(2)
def test_reduce_scatter_through_the_backends_collective_keeps_each_ranks_rows() -> None:
    """The path for backends with a reduce-scatter (NCCL, the fake backend), run here on
    gloo's: each rank gets the sum of its own rows (the input was once concatenated along
    the sequence dim, which such backends split in the wrong place)."""
    import torch.distributed as dist
    from dt_cp import comm

    mesh = cpu_mesh(2)
    group = mesh.get_group(0).group_name
    rank = dist.get_rank()
    sizes = [3, 2]  # uneven: padded pieces
    full = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    total = full.clone()
    dist.all_reduce(total)
    start = sum(sizes[:rank])
    saved = dist.get_backend
    dist.get_backend = lambda group=None: "nccl"  # type: ignore[assignment]  # not gloo's path
    try:
        got = comm.reduce_scatter_seq(full, 2, sizes, group)
    finally:
        dist.get_backend = saved
    assert torch.equal(got, total[:, :, start : start + sizes[rank]])
