"""FX helpers shared by the passes: collective recognition, fake values, stable reordering."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import fx

c10d = torch.ops._c10d_functional
ALL_GATHER = c10d.all_gather_into_tensor.default
REDUCE_SCATTER = c10d.reduce_scatter_tensor.default
WAIT = c10d.wait_tensor.default
ALL_REDUCE = c10d.all_reduce.default
COLLECTIVES = (
    ALL_GATHER,
    REDUCE_SCATTER,
    c10d.all_reduce.default,
    c10d.all_to_all_single.default,
)


def is_call(node: fx.Node, target: Any) -> bool:
    return node.op == "call_function" and node.target is target


def val(node: fx.Node) -> Any:
    return node.meta.get("val")


def nbytes(value: Any) -> int:
    """Bytes of a (fake) tensor, or of a tuple/list of them; 0 for anything else."""
    if isinstance(value, torch.Tensor):
        numel = value.numel()
        # Symbolic sizes (SymInt) have no fixed byte count; count them as 0.
        return numel * value.element_size() if type(numel) is int else 0
    if isinstance(value, (tuple, list)):
        return sum(nbytes(v) for v in value)
    return 0


def single_wait(node: fx.Node) -> fx.Node | None:
    """The one wait_tensor consuming a collective's result, if that is its only user."""
    users = list(node.users)
    if len(users) == 1 and is_call(users[0], WAIT):
        return users[0]
    return None


def ancestors(node: fx.Node) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = list(node.all_input_nodes)
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(current.all_input_nodes)
    return seen


def set_fake_val(node: fx.Node, fake_mode: Any) -> None:
    """Fill node.meta["val"] by running its target on the fake values of its inputs."""
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
    with fake_mode:
        node.meta["val"] = node.target(*args, **kwargs)  # type: ignore[operator]  # call_function nodes


def fake_mode_of(graph: fx.Graph) -> Any:
    from dt_fsdp_passes.compat import fake_mode_for

    return fake_mode_for(val(n) for n in graph.nodes if isinstance(val(n), torch.Tensor))


def planned_order(nodes: list[fx.Node], priority: dict[fx.Node, float]) -> list[fx.Node]:
    """A topological order of `nodes` that follows `priority`.

    Nodes without an entry keep their position index as priority; among ready nodes the
    smallest priority goes first (ties: original order), so untouched nodes keep their
    relative order unless a moved input delays them. Placeholders stay first and the
    output node last.
    """
    index = {n: i for i, n in enumerate(nodes)}

    def key(n: fx.Node) -> tuple[float, int]:
        if n.op == "placeholder":
            return (-math.inf, index[n])
        if n.op == "output":
            return (math.inf, index[n])
        return (priority.get(n, float(index[n])), index[n])

    pending = {n: len(set(n.all_input_nodes)) for n in nodes}
    ready = [(key(n), n) for n in nodes if pending[n] == 0]
    heapq.heapify(ready)
    order: list[fx.Node] = []
    while ready:
        _, node = heapq.heappop(ready)
        order.append(node)
        for user in node.users:
            pending[user] -= 1
            if pending[user] == 0:
                heapq.heappush(ready, (key(user), user))
    if len(order) != len(nodes):
        raise RuntimeError("dt_fsdp_passes: graph has a cycle; cannot reorder")
    return order


def apply_order(graph: fx.Graph, order: list[fx.Node]) -> None:
    """Move the graph's nodes into `order` (a permutation of them)."""
    if order == list(graph.nodes):
        return
    cursor = order[0]
    for node in order[1:]:
        cursor.append(node)  # moves `node` right after `cursor`
        cursor = node


def topo_valid(nodes: Iterable[fx.Node]) -> bool:
    """Every node's inputs come before it (a check for tests and debugging)."""
    seen: set[fx.Node] = set()
    for node in nodes:
        if any(inp not in seen for inp in node.all_input_nodes):
            return False
        seen.add(node)
    return True


def count_calls(graph: fx.Graph, target: Callable[..., Any]) -> int:
    return sum(1 for n in graph.nodes if is_call(n, target))
