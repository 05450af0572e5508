"""What a multi-rank run reports when ranks raise, die, hang or finish out of step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple


@dataclass(frozen=True)
class RankError:
    """An exception raised on a rank, kept as text: the exception may not unpickle here."""

    type_name: str
    message: str
    traceback: str


class StepCounts(NamedTuple):
    """Operations a rank had issued per process group (by name) when its task began, and
    when it was found stuck; and the last few it issued (`recent_operations`)."""

    start: dict[str, int]
    now: dict[str, int]
    recent: list[dict[str, Any]]


class RankFailure(Exception):
    """Some ranks raised, died or did not answer in time.

    Deliberately not an AssertionError: the cause may be a crash or a hang, not a check.
    """

    def __init__(
        self,
        world_size: int,
        errors: dict[int, RankError],
        dead: dict[int, str],
        stuck: list[int],
        stuck_reason: str,
        stacks: dict[int, str] | None = None,
        step_counts: dict[int, StepCounts] | None = None,
    ) -> None:
        self.world_size = world_size
        self.errors = errors
        self.dead = dead
        self.stuck = stuck
        self.stuck_reason = stuck_reason
        self.stacks = stacks or {}
        self.step_counts = step_counts or {}
        lines = []
        for rank in sorted(errors):
            err = errors[rank]
            # The first line of the message heads the block; the traceback ends with all of it.
            summary = err.message.strip().partition("\n")[0]
            lines.append(f"rank {rank}: {err.type_name}" + (f": {summary}" if summary else ""))
            lines.append(_indent(err.traceback.rstrip()))
        lines += [f"rank {rank}: {how}" for rank, how in sorted(dead.items())]
        for rank in stuck:
            lines.append(f"rank {rank}: stuck, {stuck_reason}")
            if rank in self.step_counts:
                lines.append(_indent(_issued_in_task(self.step_counts[rank])))
                if self.step_counts[rank].recent:
                    lines.append(_indent(_recent(self.step_counts[rank].recent)))
            if self.stacks.get(rank):
                lines.append(_indent(f"where it was (its Python threads):\n{self.stacks[rank]}"))
        if len(self.step_counts) > 1:
            lines.append(_indent(_compare_stuck(self.step_counts)))
        failed = len(errors) + len(dead) + len(stuck)
        lines.append(f"({failed} of {world_size} ranks failed)")
        super().__init__("\n".join(lines))

    def __reduce__(self) -> tuple[Any, ...]:
        fields = (self.world_size, self.errors, self.dead, self.stuck, self.stuck_reason)
        return type(self), (*fields, self.stacks, self.step_counts)


class WorldReplacedWarning(UserWarning):
    """A task's ranks finished with different operation counts on a group they share, so
    the harness replaced the world before the next task."""


def out_of_step_report(counts: dict[int, dict[str, int]]) -> str:
    """Which groups the ranks issued different numbers of operations on (empty if none).

    A collective issued on some ranks only (say one raised before it, the others after
    issuing it) stays pending, and the world's next task would pair with it: a hang or
    another call's data. Point-to-point operations count too, and a matched pattern may
    issue different numbers per rank (a ring that skips empty blocks), so a difference is
    a reason to replace the world, not proof of a fault."""
    lines = []
    for name, per_rank in _groups_apart(counts).items():
        issued = ", ".join(f"rank {rank}: {n}" for rank, n in sorted(per_rank.items()))
        lines.append(f"  process group {name!r}: {issued}")
    if not lines:
        return ""
    head = "the ranks issued different numbers of operations (collectives and sends):"
    tail = (
        "the world is replaced, so no operation left pending pairs with the next task's "
        "(expected after uneven point-to-point patterns; a collective issued on some "
        "ranks only would hang that task)"
    )
    return "\n".join([head, *lines, tail])


def _groups_apart(counts: dict[int, dict[str, int]]) -> dict[str, dict[int, int]]:
    """Group name -> {rank: operations issued}, for the groups (sorted by name) on which
    the ranks' counts differ."""
    by_group: dict[str, dict[int, int]] = {}
    for rank, groups in counts.items():
        for name, count in groups.items():
            by_group.setdefault(name, {})[rank] = count
    return {
        name: per_rank
        for name, per_rank in sorted(by_group.items())
        if len(set(per_rank.values())) > 1
    }


def _issued_in_task(counts: StepCounts) -> str:
    """One line: the operations this rank issued on each group during the task so far."""
    parts = [
        f"{name!r}: {now - counts.start.get(name, 0)} (total {now})"
        for name, now in sorted(counts.now.items())
    ]
    return "operations issued in this task, per process group: " + (", ".join(parts) or "none")


def _recent(operations: list[dict[str, Any]]) -> str:
    """The last operations a rank issued, oldest first, one a line."""
    lines = ["its last operations (torch's flight recorder), the newest last:"]
    for op in operations:
        kind = "point-to-point #" if op.get("p2p") else "#"
        lines.append(f"  {kind}{op['seq']} on group {op['group']!r}: {op['op']} {op['sizes']}")
    return "\n".join(lines)


def _compare_stuck(step_counts: dict[int, StepCounts]) -> str:
    """Whether the stuck ranks are at the same operation of each group they share: if so,
    they wait in matching operations (a transport stall, or the same op everywhere); if
    not, one rank issued an operation the others have not (or never will)."""
    apart = list(_groups_apart({rank: counts.now for rank, counts in step_counts.items()}))
    if apart:
        return f"the stuck ranks have issued different numbers of operations on {apart}"
    return "the stuck ranks have issued the same number of operations on every group they share"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
