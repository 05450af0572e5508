"""Rewrite the graph: replace each planned bucket's collectives by one.

Its own module because the graph surgery (new nodes, their fake values and meta, moving
producers and users around the merged collective) is apart from finding and planning.

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
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from dt_fsdp_passes.bucket_plan import Bucket
from dt_fsdp_passes.graph_utils import (
    ALL_GATHER,
    ALL_REDUCE,
    REDUCE_SCATTER,
    WAIT,
    ancestors,
    set_fake_val,
    val,
)

aten = torch.ops.aten


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
