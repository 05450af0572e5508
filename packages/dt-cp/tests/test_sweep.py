"""Hypothesis sweep: random lengths (uneven, tiny, empty shards), heads, GQA, masks,
algorithms, balancers (documents included), ring chunk and kernel piece sizes (tiny, so
blocks travel in several chunks), BlockMask sparsity; SDPA and flex, forward and
dq/dk/dv against one process.

Examples are derandomized so every rank draws the same ones (they run collectives).
"""

from __future__ import annotations

import pytest
from cp_cases import SweepCase, run_all, sweep
from dt_core.testing import cpu_mesh


def sweep_cases(world: int) -> None:
    from hypothesis import strategies as st

    mesh = cpu_mesh(world)

    def check(case: SweepCase, chunk_rows: int) -> str | None:
        return case.compare(mesh, f"{case.name} chunk={chunk_rows}", chunk_rows=chunk_rows)

    chunks = st.sampled_from([512, 1, 3])
    run_all([("sweep", lambda: sweep(24, check, chunk_rows=chunks))])


@pytest.mark.ranks(2, 4)
def test_sweep(world_size: int) -> None:
    sweep_cases(world_size)
