"""Plan buckets: which adjacent FSDP collectives share one collective.

Its own module because the plan is pure bookkeeping over the found collectives (no graph
is touched), which is what the tests check on hand-made sequences. Only collectives
adjacent in the sequence, on the same group, with the same dtype (and reduce op) share a
bucket, and the grouping depends only on the sequence and the shapes, which are the same
on every rank, so every rank issues the same collectives in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dt_fsdp_passes.fsdp_collectives import Collective


@dataclass
class Bucket:
    kind: str  # "all_gather" | "reduce_scatter"
    members: list[Collective] = field(default_factory=list)

    @property
    def wire_bytes(self) -> int:
        return sum(m.wire_bytes for m in self.members)


def _compatible(a: Collective, b: Collective) -> bool:
    """Can share one collective: same group, dtype and reduce op."""
    return (a.group_name, a.group_size, a.dtype, a.reduce_op) == (
        b.group_name,
        b.group_size,
        b.dtype,
        b.reduce_op,
    )


Joins = Callable[["Bucket", Sequence[Collective]], bool]  # may this run join that bucket?


def _join_adjacent(kind: str, runs: Sequence[Sequence[Collective]], joins: Joins) -> list[Bucket]:
    """Walk the runs in order; a run joins the open bucket when compatible and `joins` says so."""
    buckets: list[Bucket] = []
    for run in runs:
        current = buckets[-1] if buckets else None
        if current is not None and _compatible(current.members[-1], run[0]) and joins(current, run):
            current.members.extend(run)
        else:
            buckets.append(Bucket(kind, list(run)))
    return buckets


def _same_block(bucket: Bucket, run: Sequence[Collective]) -> bool:
    key = run[0].module_key
    return key is not None and key == bucket.members[-1].module_key


def _within(cap_bytes: float) -> Joins:
    return lambda bucket, run: bucket.wire_bytes + sum(c.wire_bytes for c in run) <= cap_bytes


def plan_buckets(
    collectives: Sequence[Collective], kind: str, mode: str, cap_bytes: float
) -> list[Bucket]:
    """Split the sequence into buckets of adjacent compatible collectives.

    size: greedy up to `cap_bytes`. module: one bucket per block. auto: one bucket per
    block, then neighbouring blocks merged while the bucket stays within the largest
    block's bytes, so no bucket gathers more than the largest block does on its own: the
    unit FSDP2 gathers with one `fully_shard` per block, which bounds peak memory alike.
    """
    singles = [[c] for c in collectives]
    if mode == "size":
        return _join_adjacent(kind, singles, _within(cap_bytes))
    blocks = _join_adjacent(kind, singles, _same_block)
    if mode == "module":
        return blocks
    largest = max((b.wire_bytes for b in blocks), default=0)
    return _join_adjacent(kind, [b.members for b in blocks], _within(largest))
