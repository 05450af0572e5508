"""F.scaled_dot_product_attention on sequence-sharded DTensors equals the unsharded call.

Forward and dq/dk/dv in float64 against plain SDPA on one process; causal, non-causal,
attn_mask (bool and additive), scale, GQA, uneven lengths, ring and all-gather, with and
without head-tail load balancing, on 2 and 4 ranks. One world spawn, many cases.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from cp_cases import compare, row_limits, run_all, sdpa
from dt_core.testing import cpu_mesh


def sdpa_cases(world: int) -> None:
    mesh = cpu_mesh(world)
    gen = torch.Generator().manual_seed(1)
    cases = []
    for algorithm, balancer, (s, causal) in itertools.product(
        ("ring", "allgather"), ("none", "head_tail"), ((16, True), (13, True), (7, False))
    ):
        import dt_cp

        def run(algorithm=algorithm, balancer=balancer, s=s, causal=causal):
            with dt_cp.settings(algorithm=algorithm):
                name = f"{algorithm} {balancer} S={s} causal={causal}"
                return compare(
                    name,
                    sdpa(is_causal=causal),
                    sdpa(is_causal=causal),
                    mesh,
                    (2, 4, s, 8),
                    balancer=balancer,
                ) or compare(
                    name + " gqa",
                    sdpa(is_causal=causal, enable_gqa=True),
                    sdpa(is_causal=causal, enable_gqa=True),
                    mesh,
                    (1, 4, s, 8),
                    kv_heads=2,
                    balancer=balancer,
                )

        cases.append((f"{algorithm}-{balancer}-{s}", run))
    bool_mask = torch.rand(11, 11, generator=gen) > 0.3
    bool_mask[3] = False  # a fully masked row
    add_mask = torch.randn(2, 1, 11, 11, generator=gen, dtype=torch.float64)
    for algorithm, mask in itertools.product(("ring", "allgather"), (bool_mask, add_mask)):

        def run_mask(algorithm=algorithm, mask=mask):
            import dt_cp

            with dt_cp.settings(algorithm=algorithm):
                f = sdpa(attn_mask=mask, scale=0.3)
                return compare(f"{algorithm} mask {mask.dtype}", f, f, mesh, (2, 2, 11, 4))

        cases.append((f"mask-{algorithm}", run_mask))

    def small_kernel_calls():
        # Ranges cut into 3-row pieces (2-row ones against ring chunks of 2 rows): many
        # diagonal / full / skipped pairs per block; the ring's own block overlapping its
        # exchanges or not.
        import dt_cp
        import dt_cp.algorithms

        runs = (("ring", "head_tail", False), ("ring", "none", True), ("allgather", "none", True))
        default = dt_cp.algorithms.RING_OWN_BLOCK_OVERLAP
        with row_limits(piece_rows=3, chunk_rows=2, chunk_piece_rows=2):
            for algorithm, balancer, overlap in runs:
                dt_cp.algorithms.RING_OWN_BLOCK_OVERLAP = overlap
                try:
                    with dt_cp.settings(algorithm=algorithm):
                        for f in (sdpa(is_causal=True), sdpa(attn_mask=bool_mask)):
                            name = f"3-row pieces {algorithm} {balancer} overlap={overlap}"
                            shape = (1, 2, 11, 4)
                            failure = compare(name, f, f, mesh, shape, balancer=balancer)
                            if failure:
                                return failure
                finally:
                    dt_cp.algorithms.RING_OWN_BLOCK_OVERLAP = default
        return None

    cases.append(("small kernel calls", small_kernel_calls))
    run_all(cases)


@pytest.mark.ranks(2, 4)
def test_sdpa(world_size: int) -> None:
    sdpa_cases(world_size)
