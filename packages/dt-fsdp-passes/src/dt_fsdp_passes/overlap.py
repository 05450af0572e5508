"""Reorder a bucketed graph so FSDP communication overlaps compute, on any backend.

All-gathers: bucket k+1 is issued right after bucket k's wait (so it travels while bucket
k's compute runs: one bucket of prefetch) and every wait moves to just before the first
real (non-view) use of its result. Reduce-scatters: each wait moves to just before the
next reduce-scatter is issued (the last one to the end), so it travels while the next
gradients are computed. Collectives keep their original issue order, which is the same on
every rank; if the reorder would change it, the graph is left as it was.

Moves are accepted bucket by bucket while the estimated peak memory (cost_model) stays
within the bound, and the whole reorder only if the estimated step time improves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import fx

from dt_fsdp_passes.cost_model import (
    VIEW_TARGETS,
    Machine,
    estimate_peak_bytes,
    estimate_seconds,
)
from dt_fsdp_passes.graph_utils import (
    ALL_GATHER,
    COLLECTIVES,
    REDUCE_SCATTER,
    WAIT,
    apply_order,
    is_call,
    nbytes,
    planned_order,
    val,
)

EPS = 1e-3


def _need_index(wait: fx.Node, index: dict[fx.Node, int]) -> int:
    """Position of the first non-view node that reads the waited result."""
    best = len(index)
    stack = list(wait.users)
    seen: set[fx.Node] = set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op == "call_function" and node.target in VIEW_TARGETS:
            stack.extend(node.users)
        else:
            best = min(best, index[node])
    return best


def _producers(node: fx.Node, index: dict[fx.Node, int], floor: int) -> list[fx.Node]:
    """Non-input ancestors of `node` placed after position `floor` (they move with it)."""
    out, stack, seen = [], list(node.all_input_nodes), set()
    while stack:
        current = stack.pop()
        if current in seen or current.op == "placeholder" or index[current] <= floor:
            continue
        seen.add(current)
        out.append(current)
        stack.extend(current.all_input_nodes)
    return out


def _candidate_moves(
    nodes: list[fx.Node], gathers: list[fx.Node], scatters: list[fx.Node]
) -> list[dict[fx.Node, float]]:
    """One priority patch per bucket: gathers prefetch one ahead, waits go late."""
    index = {n: i for i, n in enumerate(nodes)}
    moves: list[dict[fx.Node, float]] = []
    previous_wait_priority: float | None = None
    for gather in gathers:
        wait = next(iter(gather.users))
        patch: dict[fx.Node, float] = {}
        wait_priority = _need_index(wait, index) - 0.5
        patch[wait] = wait_priority
        if previous_wait_priority is not None:
            issue = min(float(index[gather]), previous_wait_priority + EPS)
            floor = -1
            for producer in _producers(gather, index, floor):
                patch[producer] = min(float(index[producer]), issue)
            patch[gather] = issue
        previous_wait_priority = wait_priority
        moves.append(patch)
    for i, scatter in enumerate(scatters):
        wait = next(iter(scatter.users))
        later = scatters[i + 1] if i + 1 < len(scatters) else None
        target = index[later] - 0.5 if later is not None else len(nodes) - 1.5
        if target > index[wait]:
            moves.append({wait: target})
    return moves


def _issue_order(order: Sequence[fx.Node]) -> list[fx.Node]:
    return [n for n in order if n.op == "call_function" and n.target in COLLECTIVES]


def overlap_graph(
    graph: fx.Graph,
    fsdp_collectives: set[fx.Node],
    max_extra_bytes: float | None,
    machine: Machine | None = None,
    pin: bool = True,
) -> dict[str, Any]:
    """Reorder in place around the FSDP collectives given; returns estimates and decisions."""
    machine = machine or Machine()
    nodes = list(graph.nodes)
    fsdp_nodes = [n for n in nodes if n in fsdp_collectives and _single_wait(n)]
    fsdp = set(fsdp_nodes)
    gathers = [n for n in fsdp_nodes if n.target is ALL_GATHER]
    scatters = [n for n in fsdp_nodes if n.target is REDUCE_SCATTER]
    stats: dict[str, Any] = {"overlap_applied": False}
    if not gathers and not scatters:
        return stats
    base_time = estimate_seconds(nodes, machine)
    base_peak = estimate_peak_bytes(nodes)
    if max_extra_bytes is None:
        sizes = [_wire(n) for n in gathers + scatters]
        max_extra_bytes = max(sizes, default=0)
    bound = base_peak + max_extra_bytes
    issue = _issue_order(nodes)
    accepted: dict[fx.Node, float] = {}
    order = nodes
    for patch in _candidate_moves(nodes, gathers, scatters):
        trial = {**accepted, **patch}
        trial_order = planned_order(nodes, trial)
        if _issue_order(trial_order) != issue:
            continue
        if estimate_peak_bytes(trial_order) > bound:
            continue
        accepted, order = trial, trial_order
    new_time = estimate_seconds(order, machine)
    stats.update(
        estimated_seconds_before=base_time,
        estimated_seconds_after=new_time,
        estimated_peak_bytes_before=base_peak,
        estimated_peak_bytes_after=estimate_peak_bytes(order),
        moves_accepted=len(accepted),
    )
    if accepted and new_time < base_time:
        apply_order(graph, order)
        if _issue_order(list(graph.nodes)) != issue:  # pragma: no cover - defensive
            raise RuntimeError("dt_fsdp_passes: reorder changed the collective issue order")
        pins = _pins(order, [n for n in accepted if n in fsdp or _is_wait_of(n, fsdp)])
        if pin:  # else Inductor's memory-driven scheduler moves gathers back to their waits
            from dt_core.compat.tracing import order_after

            order_after(graph, pins)
        stats["overlap_applied"] = True
        stats["pinned_nodes"] = len(pins) if pin else 0
    return stats


def _is_compute(node: fx.Node) -> bool:
    return (
        node.op == "call_function"
        and node.target not in VIEW_TARGETS
        and node.target not in COLLECTIVES
        and node.target is not WAIT
    )


def _is_wait_of(node: fx.Node, collectives: set[fx.Node]) -> bool:
    return is_call(node, WAIT) and node.args[0] in collectives


def _pins(order: list[fx.Node], moved: list[fx.Node]) -> dict[fx.Node, list[fx.Node]]:
    """Control dependencies that keep the chosen overlap through Inductor's scheduler:
    the first compute after a moved collective waits for its issue, and a moved wait
    comes after the compute just before it."""
    index = {n: i for i, n in enumerate(order)}
    pins: dict[fx.Node, list[fx.Node]] = {}
    for node in moved:
        i = index[node]
        if node.target is WAIT:
            before = next((n for n in reversed(order[:i]) if _is_compute(n)), None)
            if before is not None:
                pins.setdefault(node, []).append(before)
        else:
            after = next((n for n in order[i + 1 :] if _is_compute(n)), None)
            if after is not None:
                pins.setdefault(after, []).append(node)
    return pins


def _single_wait(node: fx.Node) -> bool:
    users = list(node.users)
    return len(users) == 1 and is_call(users[0], WAIT)


def _wire(node: fx.Node) -> int:
    return max(nbytes(val(node)), *(nbytes(val(a)) for a in node.all_input_nodes))


__all__ = ["overlap_graph"]
