"""The correctness sweep in one process: torch's LocalTensorMode simulates 2-8 ranks.

Same cases as `test_sweep.py` (random lengths with uneven, tiny and empty shards, GQA,
causal, windows, both algorithms, every balancer, SDPA and flex with mask_mod or a
BlockMask, tiny kernel pieces), forward and dq/dk/dv of every simulated rank against one
plain process, plus world sizes no spawned test affords (3, 5-8). What only real
processes show (the ring's sends, overlap) stays in `test_sweep.py`.
"""

from __future__ import annotations

import warnings

import torch
from cp_cases import SweepCase, compare, make_qkv, sdpa, sweep
from dt_core.kit import FallbackWarning
from dt_core.testing import rank_values, simulated_ranks
from dt_core.testing.sweeps import sweep_examples


def test_sweep_simulated_ranks() -> None:
    from hypothesis import strategies as st

    def check(case: SweepCase, world: int) -> str | None:
        return case.compare(None, f"P={world} {case.name}", simulated=world)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        failures = sweep(sweep_examples(30), check, world=st.integers(2, 8))
    fell_back = sorted({str(w.message) for w in caught if issubclass(w.category, FallbackWarning)})
    assert not fell_back, fell_back
    assert failures is None, failures


def test_ring_under_local_tensor_mode_says_what_runs() -> None:
    """The ring cannot send under LocalTensorMode: the exact all-gather runs, said once."""
    import dt_cp.plan

    dt_cp.plan.reset_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = sdpa(is_causal=True)
        args = ("ring", f, f, None, (1, 2, 10, 4), 2, 0, "head_tail")
        failure = compare(*args, simulated=4, algorithm="ring")
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
