"""Find the FSDP collectives of a post-grad graph: what the bucketing pass may merge.

Its own module because deciding which collectives are FSDP's (and which block each
belongs to) is a question of reading the graph, apart from planning buckets and rewriting.
Only collectives on the groups simple_fsdp sharded over count (groups.py).

FSDP all-gather: its input derives from one graph input (the parameter shard, maybe
cast or padded; or only constants, for an empty shard) and no collective. FSDP
reduce-scatter: its waited result flows only to graph outputs through single-input ops
(the gradient's way out).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import fx

from dt_fsdp_passes.graph_utils import (
    ALL_GATHER,
    ALL_REDUCE,
    COLLECTIVES,
    REDUCE_SCATTER,
    WAIT,
    ancestors,
    is_call,
    nbytes,
    single_wait,
    val,
)
from dt_fsdp_passes.groups import is_fsdp_group, is_replicate_group


@dataclass
class Collective:
    """One FSDP collective: the collective node, its wait, and what bucketing needs."""

    node: fx.Node
    wait: fx.Node
    input: fx.Node
    group_name: str
    group_size: int
    dtype: torch.dtype
    reduce_op: str | None
    wire_bytes: int  # gathered (all-gather) or full (reduce-scatter) bytes
    module_key: str | None


class _Args(NamedTuple):
    """A functional collective's arguments, whatever its schema: the input, the reduce op
    (None for an all-gather), the group size (1 where the schema has none) and group."""

    input: fx.Node
    reduce_op: str | None
    group_size: int
    group_name: str


def _collective_args(node: fx.Node, names: tuple[str, ...]) -> _Args:
    """Bind `node`'s positional and keyword arguments to `names` (input first)."""
    args = list(node.args)
    args += [node.kwargs[name] for name in names[len(args) :]]
    bound = dict(zip(names, args, strict=True))
    source, size = bound["input"], bound.get("group_size", 1)
    if not isinstance(source, fx.Node) or not isinstance(size, int):
        raise TypeError(f"dt_fsdp_passes: unexpected {node.target} arguments {node.args}")
    op = bound.get("reduce_op")
    return _Args(source, None if op is None else str(op), size, str(bound["group_name"]))


_ARG_NAMES = {
    ALL_GATHER: ("input", "group_size", "group_name"),
    REDUCE_SCATTER: ("input", "reduce_op", "group_size", "group_name"),
    ALL_REDUCE: ("input", "reduce_op", "group_name"),
}


_ROOT = re.compile(r"^[LG]\[[^\]]*\]")
_WRAPPER_PARTS = {"_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module", "module"}


def _module_key(node: fx.Node) -> str | None:
    """The block a collective belongs to: below the root module, the path down to the first
    ModuleList / Sequential index (`layers.0`, `encoder.layers.3`), else the top-level child.

    Read from the module path Dynamo records in node meta (`L['self'].layers.0.fc1`, or
    `fwd_nn_module_stack` on backward nodes); wrapper attributes are skipped.
    """
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    entries = list(stack.values())
    leaf = entries[-1][0] if isinstance(entries[-1], tuple) else str(entries[-1])
    parts = _ROOT.sub("", leaf).split(".")
    if "__self__" in parts:  # a wrapped forward: L['original'].__self__.layers.0 ...
        parts = parts[len(parts) - parts[::-1].index("__self__") :]
    parts = [p for p in parts if p and p not in _WRAPPER_PARTS]
    if not parts:
        return "<root>"
    # The block: down to the first ModuleList / Sequential index (`encoder.layers.3`),
    # else the top-level child.
    index = next((i for i, p in enumerate(parts) if p.isdigit()), None)
    return ".".join(parts[: index + 1] if index is not None else parts[:1])


def _from_one_input(node: fx.Node) -> bool:
    """Derives from at most one graph input, through no collective.

    "At most": a rank whose shard is empty may build its (padding-only) input from
    constants, and every rank must classify the same collectives as FSDP ones.
    """
    found = ancestors(node)
    placeholders = [n for n in found if n.op == "placeholder"]
    if len(placeholders) > 1:
        return False
    return not any(n.op == "call_function" and n.target in COLLECTIVES + (WAIT,) for n in found)


def _flows_only_to_outputs(wait: fx.Node) -> bool:
    if not wait.users:
        return False
    stack, seen = [wait], set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for user in node.users:
            if user.op == "output":
                continue
            if len(user.all_input_nodes) != 1:
                return False
            stack.append(user)
    return True


def _find(
    graph: fx.Graph,
    target: Any,
    on_group: Callable[[str], bool],
    qualifies: Callable[[fx.Node, fx.Node, torch.Tensor, _Args], bool],
) -> list[Collective]:
    """Collectives `target` on a group `on_group` accepts, with a single wait and a tensor
    input, that `qualifies(node, wait, input value, args)`; in graph order."""
    found = []
    for node in graph.nodes:
        if not is_call(node, target):
            continue
        args = _collective_args(node, _ARG_NAMES[target])
        wait = single_wait(node)
        value = val(args.input)
        if not on_group(args.group_name) or wait is None or not isinstance(value, torch.Tensor):
            continue
        if not qualifies(node, wait, value, args):
            continue
        # Bucket sizes count gathered bytes: an all-gather's output, a reduction's input.
        wire = nbytes(val(node)) if target is ALL_GATHER else nbytes(value)
        found.append(
            Collective(
                node,
                wait,
                args.input,
                args.group_name,
                args.group_size,
                value.dtype,
                args.reduce_op,
                wire,
                _module_key(node),
            )
        )
    return found


def find_fsdp_all_gathers(graph: fx.Graph) -> list[Collective]:
    """FSDP parameter gathers: on an FSDP group, from one graph input (the shard)."""
    return _find(
        graph,
        ALL_GATHER,
        is_fsdp_group,
        lambda node, wait, value, args: value.dim() > 0 and _from_one_input(node),
    )


def find_fsdp_reduce_scatters(graph: fx.Graph) -> list[Collective]:
    """FSDP gradient reduce-scatters: on an FSDP group, the result only leaving the graph."""
    return _find(
        graph,
        REDUCE_SCATTER,
        is_fsdp_group,
        lambda node, wait, value, args: (
            value.dim() > 0
            and value.shape[0] % args.group_size == 0
            and _flows_only_to_outputs(wait)
        ),
    )


def find_hsdp_all_reduces(graph: fx.Graph) -> list[Collective]:
    """HSDP gradient all-reduces: on a replicate group simple_fsdp registered, their waited
    result flowing only to graph outputs (the reduced shard gradient's way out)."""
    return _find(
        graph,
        ALL_REDUCE,
        is_replicate_group,
        lambda node, wait, value, args: _flows_only_to_outputs(wait),
    )
