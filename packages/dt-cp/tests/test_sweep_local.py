"""The correctness sweep in one process: torch's LocalTensorMode simulates 2-8 ranks.

Same cases as `test_sweep.py` (random lengths with uneven, tiny and empty shards, GQA,
causal, windows, both algorithms, every balancer, SDPA and flex with mask_mod or a
BlockMask, tiny kernel pieces), forward and dq/dk/dv of every simulated rank against one
plain process, plus world sizes no spawned test affords (3, 5-8). What only real
processes show (the ring's sends, overlap) stays in `test_sweep.py`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from cp_cases import make_qkv, sdpa
from dt_core.kit import FallbackWarning
from dt_core.testing import rank_values, simulated_ranks


def compare_simulated(
    name: str,
    attend: Callable[..., torch.Tensor],
    reference: Callable[..., torch.Tensor],
    world: int,
    shape: tuple,
    kv_heads: int,
    seed: int,
    balancer: str,
    documents: tuple[int, ...] | None,
    algorithm: str,
    atol: float = 1e-10,
) -> str | None:
    """`attend` on DTensors sharded over `world` simulated ranks vs `reference` unsharded."""
    import dt_cp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard

    q, k, v, g = make_qkv(shape, kv_heads, seed)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    y_ref = reference(*ref)
    (y_ref * g).sum().backward()
    want = [y_ref.detach(), ref[0].grad, ref[1].grad, ref[2].grad]
    settings = dt_cp.settings(algorithm=algorithm, load_balancer=balancer, documents=documents)
    with simulated_ranks(world), settings:
        mesh = init_device_mesh("cpu", (world,))
        qd, kd, vd = (dt_cp.shard_sequence(t, mesh, 2).requires_grad_() for t in (q, k, v))
        y = attend(qd, kd, vd)
        if tuple(y.placements) != (Shard(2),):
            return f"{name}: output placements {y.placements}"
        (y * dt_cp.shard_sequence(g, mesh, 2)).sum().backward()
        got = [dt_cp.unshard_sequence(t, 2) for t in (y, qd.grad, kd.grad, vd.grad)]
    for label, value, expected in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        for rank, a in enumerate(rank_values(value, world)):
            if a.shape != expected.shape:
                return f"{name}: rank {rank} {label} shape {tuple(a.shape)}"
            err = (a - expected).abs().max().item() if a.numel() else 0.0
            if not err <= atol:
                return f"{name}: rank {rank} {label} max error {err:.3g}"
    return None


def test_sweep_simulated_ranks() -> None:
    import dt_cp
    import dt_cp.blocks
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from test_flex import dense_reference

    failures: list[str] = []

    @given(
        world=st.integers(2, 8),
        seq=st.integers(1, 19),
        kv_heads=st.sampled_from([1, 2]),
        gqa=st.booleans(),
        causal=st.booleans(),
        window=st.integers(1, 6),
        algorithm=st.sampled_from(["ring", "allgather"]),
        balancer=st.sampled_from(["none", "head_tail", "document"]),
        cuts=st.lists(st.integers(0, 19), max_size=3),
        api=st.sampled_from(["sdpa", "flex", "flex_block_mask"]),
        piece_rows=st.sampled_from([1024, 2, 5]),
        seed=st.integers(0, 100),
    )
    @settings(
        max_examples=30,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def one(
        world, seq, kv_heads, gqa, causal, window, algorithm, balancer, cuts, api, piece_rows, seed
    ):
        heads = kv_heads * (2 if gqa else 1)
        shape = (1, heads, seq, 4)
        bounds = sorted({0, seq, *(min(c, seq) for c in cuts)})
        docs = tuple(b - a for a, b in zip(bounds, bounds[1:])) if balancer == "document" else None
        name = (
            f"{api} P={world} S={seq} H={heads}/{kv_heads} causal={causal} w={window} "
            f"{algorithm} {balancer} docs={docs} piece={piece_rows}"
        )

        def mask(b, h, q, kv):
            near = (q - kv).abs() < window
            return near & (kv <= q) if causal else near

        if api == "sdpa":
            ours = reference = sdpa(is_causal=causal, enable_gqa=gqa)
        else:
            block_mask = None
            if api == "flex_block_mask":
                block_mask = dt_cp.create_block_mask(mask, None, None, seq, seq, BLOCK_SIZE=2)

            def ours(q, k, v):
                if block_mask is not None:
                    return dt_cp.flex_attention(q, k, v, block_mask=block_mask, enable_gqa=gqa)
                return dt_cp.flex_attention(q, k, v, mask_mod=mask, enable_gqa=gqa)

            reference = dense_reference(None, mask, gqa=gqa)
        saved = dt_cp.blocks.MAX_RANGE_ROWS
        dt_cp.blocks.MAX_RANGE_ROWS = dt_cp.blocks.SPARSE_RANGE_ROWS = piece_rows
        try:
            args = (world, shape, kv_heads, seed, balancer, docs, algorithm)
            failure = compare_simulated(name, ours, reference, *args)
        finally:
            dt_cp.blocks.MAX_RANGE_ROWS = saved
            dt_cp.blocks.SPARSE_RANGE_ROWS = 512
        if failure:
            failures.append(failure)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        one()
    fell_back = sorted({str(w.message) for w in caught if issubclass(w.category, FallbackWarning)})
    assert not fell_back, fell_back
    assert not failures, f"{len(failures)} cases wrong:\n" + "\n".join(failures)


def test_ring_under_local_tensor_mode_says_what_runs() -> None:
    """The ring cannot send under LocalTensorMode: the exact all-gather runs, said once."""
    import dt_cp.plan

    dt_cp.plan.reset_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        failure = compare_simulated(
            "ring",
            sdpa(is_causal=True),
            sdpa(is_causal=True),
            4,
            (1, 2, 10, 4),
            2,
            0,
            "head_tail",
            None,
            "ring",
        )
    assert failure is None, failure
    notes = [str(w.message) for w in caught if "LocalTensorMode" in str(w.message)]
    assert len(notes) == 1 and "all-gather" in notes[0], notes


def test_2d_mesh_batch_and_sequence_sharded() -> None:
    """Groups along the sequence's mesh dim: each simulated rank gathers from its own."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    q, k, v, g = make_qkv((4, 2, 7, 4), 2, 3)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    (F.scaled_dot_product_attention(*ref, is_causal=True) * g).sum().backward()
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for dims in ((2, 2), (2, 3), (3, 2)):
        placements = [Shard(0), Shard(2)] if dims[0] == 2 else [Shard(2), Shard(0)]
        world = dims[0] * dims[1]
        with simulated_ranks(world):
            mesh = init_device_mesh("cpu", dims)
            qd, kd, vd = (
                distribute_tensor(t, mesh, placements).requires_grad_() for t in (q, k, v)
            )
            y = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True)
            (y * distribute_tensor(g, mesh, placements)).sum().backward()
            got = [t.full_tensor() for t in (y, qd.grad, kd.grad, vd.grad)]
        expected = [want, ref[0].grad, ref[1].grad, ref[2].grad]
        for label, value, e in zip(("out", "dq", "dk", "dv"), got, expected, strict=True):
            for rank, a in enumerate(rank_values(value, world)):
                torch.testing.assert_close(a, e, atol=1e-10, rtol=0, msg=f"{dims} {label} {rank}")


def test_replicated_fallbacks_are_exact_on_simulated_ranks() -> None:
    """Mixed placements: SDPA and flex take the kit's replicated path there too, warned."""
    import dt_cp.plan
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    t = make_qkv((2, 3, 9, 4), 3, 0)[0]
    ref = t.clone().requires_grad_()
    want = F.scaled_dot_product_attention(ref, t, t, is_causal=True)
    want.sum().backward()
    dt_cp.plan.reset_warnings()
    with simulated_ranks(3), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mesh = init_device_mesh("cpu", (3,))
        q = distribute_tensor(t, mesh, [Shard(2)]).requires_grad_()
        k = distribute_tensor(t, mesh, [Replicate()])
        y = F.scaled_dot_product_attention(q, k, k, is_causal=True)
        y.sum().backward()
        flex = dt_cp.flex_attention(q, k, k, mask_mod=lambda b, h, i, j: j <= i)
        got = [y.full_tensor(), q.grad.full_tensor(), flex.full_tensor()]
    for value, expected in zip(got, (want, ref.grad, want), strict=True):
        for a in rank_values(value, 3):
            torch.testing.assert_close(a, expected.detach(), atol=1e-10, rtol=0)
    fell_back = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
    assert len(fell_back) == 3 and all("placements differ" in m for m in fell_back), fell_back
