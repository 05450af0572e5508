"""The simulated-rank sweep at scale: 2 to 64 ranks in one process (LocalTensorMode).

`test_sweep_local.py` draws its cases on 2-8 ranks; this file draws the same cases
(`cp_cases.sweep`: SDPA and flex with mask_mod or a BlockMask, every balancer, document
cuts of random lengths, GQA, causal or not, windows, both algorithms, tiny kernel pieces,
lengths 1-19, so uneven shards and, past 19 ranks, mostly empty ones) on 2-64 ranks,
plus one explicit case on each of 16, 32 and 64 ranks. Each case: forward and dq/dk/dv
of every simulated rank against one plain process, or a refusal by a named dt-cp error;
an AssertionError, any other error or a FallbackWarning fails.

With at most one position per rank every balancer's layout is the identity, so the
16-rank case holds more positions than ranks (head-tail a real permutation there; it is
what catches a broken head-tail layout past 8 ranks). On 32 and 64 ranks that costs
tens of seconds per case, so there such cases run from `DT_SWEEP_SCALE=2` on.

Cost: a simulated rank costs time in every op, and the work grows with the square of the
world (every rank's query ranges against every rank's key ranges; `shard_sequence`'s
permutation built per simulated rank), so lengths and head dims stay tiny, and a
BlockMask case draws at most 16 ranks (its sparsity lookups add a factor of the world).
`DT_SWEEP_SCALE=N` multiplies the random examples.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import pytest
from cp_cases import SweepCase, sweep
from dt_core.kit import FallbackWarning
from dt_core.testing.sweeps import sweep_examples, sweep_scale

# A larger twin of test_sweep_local.py's 2-8 ranks, which every release runs: CI runs
# this one on one release (tools/run_cell.py).
pytestmark = pytest.mark.ci_once

BUDGET = 3  # random examples in CI (times DT_SWEEP_SCALE)
MOST_RANKS = 64
BLOCK_MASK_MOST_RANKS = 16


def _worlds():
    """2-64 ranks, each octave (2-4, 4-8, ..., 32-64) as likely: a few draws reach the
    large worlds while most stay affordable."""
    from hypothesis import strategies as st

    return st.integers(1, 5).flatmap(lambda b: st.integers(2**b, min(2 ** (b + 1), MOST_RANKS)))


# dt-cp refuses what it cannot do with an error of its own, its message prefixed so.
NAMED = ("dt-cp:", "dt_cp:")


@dataclass(frozen=True)
class _Documents(SweepCase):
    """A case with its document lengths given outright (empty documents included)."""

    given: tuple[int, ...] = ()

    @property
    def documents(self) -> tuple[int, ...] | None:
        return self.given if self.balancer == "document" else None


def _case(documents: tuple[int, ...] | None = None, **fields: Any) -> SweepCase:
    defaults = dict(
        seq=19,
        kv_heads=1,
        gqa=True,
        causal=True,
        window=3,
        algorithm="allgather",
        balancer="head_tail",
        cuts=[],
        api="sdpa",
        piece_rows=1024,
        seed=0,
    )
    if documents is not None:
        return _Documents(**{**defaults, **fields}, given=documents)
    return SweepCase(**{**defaults, **fields})


# One explicit case per large world, on top of the random draws. 16 ranks, 19 positions:
# 9 ranks hold 2, one holds 1, six none, so head-tail is a real permutation; flex with a
# sliding causal window, GQA.
LARGE_WORLDS = [
    pytest.param(16, _case(api="flex", seed=1), id="16ranks"),
    # 32 ranks, 13 positions: 19 empty shards, documents with empty ones (which the
    # drawn cuts never give), SDPA, not causal, the ring (under LocalTensorMode the
    # all-gather runs, said once).
    pytest.param(
        32,
        _case(seq=13, causal=False, algorithm="ring", balancer="document", documents=(0, 5, 0, 8)),
        id="32ranks",
    ),
    # 64 ranks, 13 positions: 51 empty shards, GQA 4/2, causal.
    pytest.param(64, _case(seq=13, kv_heads=2, balancer="none", seed=3), id="64ranks"),
]

# From DT_SWEEP_SCALE=2 on (tens of seconds each): more positions than ranks on 32
# and 64 ranks, so document and head-tail layouts are real permutations there too.
SCALED_WORLDS = [
    pytest.param(
        32,
        _case(seq=37, causal=False, balancer="document", cuts=[5, 5, 22], seed=2),
        id="32ranks-37",
    ),
    pytest.param(64, _case(seq=70, seed=4), id="64ranks-70"),
]


def _check(case: SweepCase, world: int, refused: list[str]) -> str | None:
    """`case` on `world` simulated ranks: None if exact (or refused by a named dt-cp
    error, noted in `refused`), else what went wrong."""
    name = f"P={world} {case.name}"
    try:
        return case.compare(None, name, simulated=world)
    except AssertionError as error:  # never a refusal: an internal check failed
        return f"{name}: AssertionError: {error}"
    except Exception as error:
        if str(error).startswith(NAMED):
            refused.append(f"{name}: {type(error).__name__}: {error}")
            return None
        return f"{name}: unnamed {type(error).__name__}: {error}"


def _exact_without_fallback(run) -> tuple[str | None, list[str]]:
    """`run(refused)`'s failure (or None) and the refusals, failing on a FallbackWarning."""
    import dt_cp.plan

    refused: list[str] = []
    dt_cp.plan.reset_warnings()  # a fallback warned earlier in the session warns again
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        failure = run(refused)
    fell_back = sorted({str(w.message) for w in caught if issubclass(w.category, FallbackWarning)})
    assert not fell_back, f"unexpected fallback: {fell_back}"
    return failure, refused


def test_sweep_2_to_64_simulated_ranks() -> None:
    ran: list[int] = []

    def run(refused: list[str]) -> str | None:
        def check(case: SweepCase, world: int) -> str | None:
            if case.api == "flex_block_mask" and world > BLOCK_MASK_MOST_RANKS:
                world = 2 + (world - 2) % (BLOCK_MASK_MOST_RANKS - 1)  # 2-16, still drawn
            ran.append(world)
            return _check(case, world, refused)

        return sweep(sweep_examples(BUDGET), check, world=_worlds())

    failure, refused = _exact_without_fallback(run)
    assert failure is None, failure
    assert len(refused) < len(ran), f"every case refused: {refused}"


@pytest.mark.parametrize(("world", "case"), LARGE_WORLDS)
def test_large_world(world: int, case: SweepCase) -> None:
    failure, refused = _exact_without_fallback(lambda refused: _check(case, world, refused))
    assert not refused, refused  # these cases are within what dt-cp does
    assert failure is None, failure


@pytest.mark.parametrize(("world", "case"), SCALED_WORLDS)
def test_large_world_long_sequence(world: int, case: SweepCase) -> None:
    if sweep_scale() < 2:
        pytest.skip("DT_SWEEP_SCALE>=2 only (tens of seconds each)")
    test_large_world(world, case)
