"""Hypothesis sweep: random lengths (uneven, tiny, empty shards), heads, GQA, masks,
algorithms and balancers; SDPA and flex, forward and dq/dk/dv against one process.

Examples are derandomized so every rank draws the same ones (they run collectives).
"""

from __future__ import annotations

import pytest
from cp_cases import compare, run_all, sdpa
from dt_core.testing import cpu_mesh


def sweep(world: int) -> None:
    import dt_cp
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from test_flex import dense_reference

    mesh = cpu_mesh(world)
    failures: list[str] = []

    @given(
        seq=st.integers(1, 19),
        kv_heads=st.sampled_from([1, 2]),
        gqa=st.booleans(),
        causal=st.booleans(),
        window=st.integers(1, 6),
        algorithm=st.sampled_from(["ring", "allgather"]),
        balancer=st.sampled_from(["none", "head_tail"]),
        api=st.sampled_from(["sdpa", "flex"]),
        seed=st.integers(0, 100),
    )
    @settings(
        max_examples=16,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def one(seq, kv_heads, gqa, causal, window, algorithm, balancer, api, seed):
        heads = kv_heads * (2 if gqa else 1)
        shape = (1, heads, seq, 4)
        name = (
            f"{api} S={seq} H={heads}/{kv_heads} causal={causal} w={window} {algorithm} {balancer}"
        )
        with dt_cp.settings(algorithm=algorithm):
            if api == "sdpa":
                f = sdpa(is_causal=causal, enable_gqa=gqa)
                failure = compare(name, f, f, mesh, shape, kv_heads, seed, balancer)
            else:

                def mask(b, h, q, kv):
                    near = (q - kv).abs() < window
                    return near & (kv <= q) if causal else near

                def ours(q, k, v):
                    return dt_cp.flex_attention(q, k, v, mask_mod=mask, enable_gqa=gqa)

                ref = dense_reference(None, mask, gqa=gqa)
                failure = compare(name, ours, ref, mesh, shape, kv_heads, seed, balancer)
        if failure:
            failures.append(failure)

    run_all([("sweep", one)])
    assert not failures, failures


@pytest.mark.ranks(2)
def test_sweep_2_ranks() -> None:
    sweep(2)


@pytest.mark.ranks(4)
def test_sweep_4_ranks() -> None:
    sweep(4)
