"""Hypothesis sweep: random lengths (uneven, tiny, empty shards), heads, GQA, masks,
algorithms, balancers (documents included), ring chunk and kernel piece sizes (tiny, so
blocks travel in several chunks), BlockMask sparsity; SDPA and flex, forward and
dq/dk/dv against one process.

Examples are derandomized so every rank draws the same ones (they run collectives).
"""

from __future__ import annotations

import pytest
from cp_cases import compare, run_all, sdpa
from dt_core.testing import cpu_mesh


def sweep(world: int) -> None:
    import dt_cp
    import dt_cp.algorithms
    import dt_cp.blocks
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
        balancer=st.sampled_from(["none", "head_tail", "document"]),
        cuts=st.lists(st.integers(0, 19), max_size=3),
        api=st.sampled_from(["sdpa", "flex", "flex_block_mask"]),
        chunk_rows=st.sampled_from([512, 1, 3]),
        piece_rows=st.sampled_from([1024, 2, 5]),
        seed=st.integers(0, 100),
    )
    @settings(
        max_examples=24,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def one(
        seq,
        kv_heads,
        gqa,
        causal,
        window,
        algorithm,
        balancer,
        cuts,
        api,
        chunk_rows,
        piece_rows,
        seed,
    ):
        heads = kv_heads * (2 if gqa else 1)
        shape = (1, heads, seq, 4)
        bounds = sorted({0, seq, *(min(c, seq) for c in cuts)})
        docs = tuple(b - a for a, b in zip(bounds, bounds[1:])) if balancer == "document" else None
        name = (
            f"{api} S={seq} H={heads}/{kv_heads} causal={causal} w={window} {algorithm} "
            f"{balancer} docs={docs} chunk={chunk_rows} piece={piece_rows}"
        )
        saved = (dt_cp.algorithms.RING_CHUNK_ROWS, dt_cp.blocks.MAX_RANGE_ROWS)
        dt_cp.algorithms.RING_CHUNK_ROWS = chunk_rows
        dt_cp.blocks.MAX_RANGE_ROWS = dt_cp.blocks.SPARSE_RANGE_ROWS = piece_rows
        try:
            failure = run_one(
                name, shape, kv_heads, seed, balancer, docs, algorithm, api, causal, window, gqa
            )
        finally:
            dt_cp.algorithms.RING_CHUNK_ROWS = saved[0]
            dt_cp.blocks.MAX_RANGE_ROWS = saved[1]
            dt_cp.blocks.SPARSE_RANGE_ROWS = 512
        if failure:
            failures.append(failure)

    def run_one(name, shape, kv_heads, seed, balancer, docs, algorithm, api, causal, window, gqa):
        seq = shape[2]
        with dt_cp.settings(algorithm=algorithm):
            if api == "sdpa":
                f = sdpa(is_causal=causal, enable_gqa=gqa)
                return compare(name, f, f, mesh, shape, kv_heads, seed, balancer, documents=docs)

            def mask(b, h, q, kv):
                near = (q - kv).abs() < window
                return near & (kv <= q) if causal else near

            block_mask = None
            if api == "flex_block_mask":
                block_mask = dt_cp.create_block_mask(mask, None, None, seq, seq, BLOCK_SIZE=2)

            def ours(q, k, v):
                if block_mask is not None:
                    return dt_cp.flex_attention(q, k, v, block_mask=block_mask, enable_gqa=gqa)
                return dt_cp.flex_attention(q, k, v, mask_mod=mask, enable_gqa=gqa)

            ref = dense_reference(None, mask, gqa=gqa)
            return compare(name, ours, ref, mesh, shape, kv_heads, seed, balancer, documents=docs)

    run_all([("sweep", one)])
    assert not failures, failures


@pytest.mark.ranks(2)
def test_sweep_2_ranks() -> None:
    sweep(2)


@pytest.mark.ranks(4)
def test_sweep_4_ranks() -> None:
    sweep(4)
