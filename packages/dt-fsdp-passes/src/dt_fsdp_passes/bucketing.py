"""Bucket SimpleFSDP's per-parameter all-gathers and reduce-scatters in a post-grad graph.

Only collectives on the groups simple_fsdp sharded over count (groups.py).

FSDP all-gather: its input derives from one graph input (the parameter shard, maybe
cast or padded; or only constants, for an empty shard) and no collective. FSDP
reduce-scatter: its waited result flows only to graph outputs through single-input ops
(the gradient's way out). Only collectives adjacent in that sequence, on the same group,
with the same dtype (and reduce op) share a bucket, and the grouping depends only on
the sequence and the shapes, which are the same on every rank, so every rank issues the
same collectives in the same order.

All-gather bucket: cat(flat shards) -> one all_gather -> view [world, total] -> per
parameter [world, n_i] slice -> reshape to [world * s_i, ...], exactly what each
per-parameter all-gather returned (rank-major concatenation of shards).
Reduce-scatter bucket: each full gradient [world * c_i, ...] is viewed [world, m_i]
(row r = rank r's chunk), the views are concatenated along dim 1, so rank r's chunk of
the flat buffer is its chunks of every gradient in turn; one reduce_scatter, then
split [m_i] and view [c_i, ...]. Uneven Shard(0) is padded by DTensor before the
collective, so every collective here already has equal per-rank chunks.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
    set_fake_val,
    single_wait,
    val,
)
from dt_fsdp_passes.groups import is_fsdp_group, is_replicate_group

aten = torch.ops.aten
FSDP_META = "dt_fsdp_collective"  # node.meta flag: an FSDP collective (bucketed or not)
MB = 1024 * 1024


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


@dataclass
class Bucket:
    kind: str  # "all_gather" | "reduce_scatter"
    members: list[Collective] = field(default_factory=list)

    @property
    def wire_bytes(self) -> int:
        return sum(m.wire_bytes for m in self.members)


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


def _copy_meta(new: fx.Node, like: fx.Node) -> None:
    for key in ("nn_module_stack", "fwd_nn_module_stack", "stack_trace", "seq_nr"):
        if key in like.meta:
            new.meta[key] = like.meta[key]


def _emit(graph: fx.Graph, fake_mode: Any, like: fx.Node, target: Any, *args: Any) -> fx.Node:
    node = graph.call_function(target, tuple(args))
    set_fake_val(node, fake_mode)
    _copy_meta(node, like)
    return node


def merge_all_gathers(graph: fx.Graph, bucket: Bucket, fake_mode: Any) -> fx.Node:
    """Replace the bucket's all-gathers by one; returns the new all-gather node."""
    members = bucket.members
    first = members[0]
    world = first.group_size
    # The shards' producers (casts, padding) depend only on graph inputs: move them ahead.
    where = _positions(graph)
    start = where[first.node]
    moved = set()
    for m in members:
        moved |= {a for a in ancestors(m.node) if a.op != "placeholder" and where[a] > start}
    for node in [n for n in graph.nodes if n in moved]:
        first.node.prepend(node)
    with graph.inserting_before(first.node):
        flats = [
            _emit(graph, fake_mode, m.node, aten.reshape.default, m.input, [-1]) for m in members
        ]
        numels = [int(val(f).numel()) for f in flats]
        flat = (
            flats[0]
            if len(flats) == 1
            else _emit(graph, fake_mode, first.node, aten.cat.default, flats)
        )
        gather = _emit(graph, fake_mode, first.node, ALL_GATHER, flat, world, first.group_name)
    where = _positions(graph)
    first_wait = min((m.wait for m in members), key=where.__getitem__)
    with graph.inserting_before(first_wait):
        wait = _emit(graph, fake_mode, first.wait, WAIT, gather)
        grid = _emit(graph, fake_mode, first.wait, aten.reshape.default, wait, [world, sum(numels)])
        pieces = _emit(graph, fake_mode, first.wait, aten.split_with_sizes.default, grid, numels, 1)
        for i, m in enumerate(members):
            piece = graph.call_function(operator.getitem, (pieces, i))
            piece.meta["val"] = val(pieces)[i]
            shape = list(val(m.node).shape)
            out = _emit(graph, fake_mode, m.wait, aten.reshape.default, piece, shape)
            m.wait.replace_all_uses_with(out)
    for m in members:
        graph.erase_node(m.wait)
        graph.erase_node(m.node)
    return gather


Emit = Callable[..., fx.Node]  # emit(like, target, *args): one new node, placed in order


def merge_reduce_scatters(graph: fx.Graph, bucket: Bucket, fake_mode: Any) -> fx.Node:
    """Replace the bucket's reduce-scatters by one; returns the new reduce-scatter node."""
    first = bucket.members[0]
    world = first.group_size

    def reduce_scatter(emit: Emit) -> tuple[fx.Node, list[int]]:
        # Each member's rows per destination rank, side by side: one row block per rank.
        rows = [emit(m.node, aten.reshape.default, m.input, [world, -1]) for m in bucket.members]
        widths = [int(val(r).shape[1]) for r in rows]
        grid = rows[0] if len(rows) == 1 else emit(first.node, aten.cat.default, rows, 1)
        flat = emit(first.node, aten.reshape.default, grid, [-1])
        scatter = emit(first.node, REDUCE_SCATTER, flat, first.reduce_op, world, first.group_name)
        return scatter, widths

    return _merge_reductions(graph, bucket, fake_mode, reduce_scatter)


def merge_all_reduces(graph: fx.Graph, bucket: Bucket, fake_mode: Any) -> fx.Node:
    """Replace the bucket's all-reduces by one over the concatenated flat inputs."""
    first = bucket.members[0]

    def all_reduce(emit: Emit) -> tuple[fx.Node, list[int]]:
        flats = [emit(m.node, aten.reshape.default, m.input, [-1]) for m in bucket.members]
        numels = [int(val(f).numel()) for f in flats]
        flat = flats[0] if len(flats) == 1 else emit(first.node, aten.cat.default, flats)
        return emit(first.node, ALL_REDUCE, flat, first.reduce_op, first.group_name), numels

    return _merge_reductions(graph, bucket, fake_mode, all_reduce)


def _merge_reductions(
    graph: fx.Graph,
    bucket: Bucket,
    fake_mode: Any,
    collective: Callable[[Emit], tuple[fx.Node, list[int]]],
) -> fx.Node:
    """Shared by the reduce-scatter and all-reduce buckets: after the last member, run
    `collective` (one collective over every member's input, and each member's size in its
    result), wait once, split, and hand each member's users their piece. Everything that
    used a member's result (views, casts) moves after the new wait."""
    members = bucket.members
    first = members[0]
    where = _positions(graph)
    last = max((m.node for m in members), key=where.__getitem__)
    downstream: list[fx.Node] = []
    for m in members:
        stack = list(m.wait.users)
        while stack:
            node = stack.pop()
            if node.op != "output" and node not in downstream:
                downstream.append(node)
                stack.extend(node.users)
    with graph.inserting_before(last.next):
        nodes: list[fx.Node] = []

        def emit(like: fx.Node, target: Any, *args: Any) -> fx.Node:
            nodes.append(_emit(graph, fake_mode, like, target, *args))
            return nodes[-1]

        merged, sizes = collective(emit)
        wait = emit(first.wait, WAIT, merged)
        pieces = emit(first.wait, aten.split_with_sizes.default, wait, sizes)
        outs = []
        for i, m in enumerate(members):
            piece = graph.call_function(operator.getitem, (pieces, i))
            piece.meta["val"] = val(pieces)[i]
            nodes.append(piece)
            outs.append(emit(m.wait, aten.reshape.default, piece, list(val(m.wait).shape)))
    cursor = nodes[-1]
    for m, out in zip(members, outs, strict=True):
        m.wait.replace_all_uses_with(out)
    for node in sorted(downstream, key=where.__getitem__):
        cursor.append(node)
        cursor = node
    for m in members:
        graph.erase_node(m.wait)
        graph.erase_node(m.node)
    return merged


def _positions(graph: fx.Graph) -> dict[fx.Node, int]:
    return {n: i for i, n in enumerate(graph.nodes)}


def _merge_each(
    graph: fx.Graph,
    buckets: list[Bucket],
    merge: Callable[[fx.Graph, Bucket, Any], fx.Node],
    fake_mode: Any,
) -> None:
    """Merge each bucket of several collectives into one; flag what remains (the merged
    collective, or a bucket's only member) as FSDP's, for the overlap pass."""
    for bucket in buckets:
        node = bucket.members[0].node
        if len(bucket.members) > 1:
            node = merge(graph, bucket, fake_mode)
        node.meta[FSDP_META] = True


def bucket_graph(
    graph: fx.Graph, mode: str, cap_mb: float, fake_mode: Any, log: Callable[[str], None]
) -> dict[str, Any]:
    """Bucket FSDP all-gathers and reduce-scatters; returns counts for the pass's stats."""
    gathers = find_fsdp_all_gathers(graph)
    scatters = find_fsdp_reduce_scatters(graph)
    stats: dict[str, Any] = {
        "all_gather_before": len(gathers),
        "reduce_scatter_before": len(scatters),
    }
    keys = [c.module_key for c in gathers + scatters]
    if (mode == "module" and None in keys) or (mode == "auto" and keys and set(keys) == {None}):
        log(
            "module structure missing from the graph's node meta; bucketing by size "
            f"(bucket_cap_mb={cap_mb:g}) instead of mode={mode!r}"
        )
        mode = "size"
    cap_bytes = cap_mb * MB
    ag_buckets = plan_buckets(gathers, "all_gather", mode, cap_bytes)
    rs_buckets = plan_buckets(scatters, "reduce_scatter", mode, cap_bytes)
    _merge_each(graph, ag_buckets, merge_all_gathers, fake_mode)
    _merge_each(graph, rs_buckets, merge_reduce_scatters, fake_mode)
    # HSDP: found after the reduce-scatters are merged (their outputs feed these).
    reduces = find_hsdp_all_reduces(graph)
    ar_buckets = plan_buckets(reduces, "all_reduce", mode, cap_bytes)
    _merge_each(graph, ar_buckets, merge_all_reduces, fake_mode)
    stats["all_reduce_before"] = len(reduces)
    stats["all_reduce_after"] = len(ar_buckets)
    stats["all_gather_after"] = len(ag_buckets)
    stats["reduce_scatter_after"] = len(rs_buckets)
    stats["all_gather_bucket_bytes"] = [b.wire_bytes for b in ag_buckets]
    stats["reduce_scatter_bucket_bytes"] = [b.wire_bytes for b in rs_buckets]
    stats["bucket_modules"] = [sorted({str(m.module_key) for m in b.members}) for b in ag_buckets]
    return stats


__all__ = ["Bucket", "Collective", "bucket_graph", "plan_buckets"]
