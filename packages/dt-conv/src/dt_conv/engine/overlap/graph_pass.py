"""Inductor post-grad pass: the halo's wait stays after the compute that overlaps it.

dt-conv's handlers start each halo all-to-all, run the interior compute, then wait (the
eager overlap), and the traced FX graph keeps that order. Inductor's scheduler does not:
it may fuse the interior conv's inputs (e.g. the weight's layout conversion) into the
kernel that assembles the window after the wait, so the interior conv waits for the
halo; in backward it computed the weight gradient before starting the exchange that
should travel during it. This pass makes each convolution issued between a halo's start
and its wait depend on the start, and the wait on them (torch's control_deps), which
Inductor keeps in order and never fuses across.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dt_core.compat.tracing import order_after

WAIT = "_c10d_functional.wait_tensor.default"
ALL_TO_ALL = "_c10d_functional.all_to_all_single.default"
OVERLAPPED = ("aten.convolution.default", "aten.convolution_backward.default")


def _halo_waits(graph: Any) -> list[tuple[Any, Any]]:
    """(start, wait) of every all-to-all whose wait is its only user."""
    pairs = []
    for n in graph.nodes:
        if n.op == "call_function" and str(n.target) == WAIT and n.args:
            start = n.args[0]
            if str(getattr(start, "target", "")) == ALL_TO_ALL and len(start.users) == 1:
                pairs.append((start, n))
    return pairs


def keep_halo_waits_after_interior(graph: Any) -> None:
    """Order the convolutions between each halo start and its wait after the start, and
    the wait after them."""
    extra: dict[Any, Sequence[Any]] = {}
    for start, wait in _halo_waits(graph):
        node, convs = start.next, []
        while node is not wait:
            if node.op == "call_function" and str(node.target) in OVERLAPPED:
                convs.append(node)
                extra[node] = [*extra.get(node, ()), start]
            node = node.next
        if convs:
            extra[wait] = [*extra.get(wait, ()), *convs]
    order_after(graph, extra)
