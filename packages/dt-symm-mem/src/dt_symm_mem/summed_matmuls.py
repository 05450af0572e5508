"""Inductor post-grad pass, run before the micro-pipeline fusion: a reduce-scatter of a
SUM of matmuls becomes ONE fused op, `dt_symm_mem::fused_matmuls_reduce_scatter` (CPU
groups only), which computes each destination's chunk of every product and adds them.

Why: in backward, the input gradient of a SwiGLU FFN (and of attention's q/k/v
projections) is `g1 @ W1 + g3 @ W3 (+ ...)`, summed before the sequence-parallel
reduce-scatter. torch's matcher looks for a reduce-scatter fed by one matmul and finds
none there, so those reduce-scatters stay exposed.

The first form of this pass joined the terms into one matmul over the concatenated inner
dimension (`cat([A1, A2], -1) @ cat([B1, B2], 0)`) and left the rest to torch's fused op.
Exact, but the `cat` copies every A once per call: on 2 CPU ranks, at 2 x 2048x2048 @
2048x128 fp32, the join alone took 31 ms and the joined, fused call 65 ms against 52 ms
for the unfused sum (2026-11-26). The fused op without the join needs no copy: the same
products and adds as the unfused graph, chunk by chunk into shared memory.

Only sums whose every term is a single-use matmul (2-D `mm`, or torch's N-D form
`reshape -> mm -> reshape`) of one dtype and shape are fused; anything else is left as
it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from dt_symm_mem import compat
from dt_symm_mem.settings import settings

aten = torch.ops.aten


@dataclass(frozen=True)
class _Term:
    """One summand `a @ b`: `a` is 2-D (plain mm) or N-D (reshaped to rows for the mm)."""

    a: Any
    b: Any
    nodes: tuple[Any, ...]  # the term's own nodes, output first: removed once unused


def _val(node: Any) -> Any:
    return node.meta.get("val") if hasattr(node, "meta") else None


def _term(node: Any) -> _Term | None:
    """`node` as a single-use matmul term, or None."""
    if len(node.users) != 1:
        return None
    if node.target is aten.mm.default:
        return _Term(node.args[0], node.args[1], (node,))
    if node.target is not aten.reshape.default:
        return None
    mm = node.args[0]
    if getattr(mm, "target", None) is not aten.mm.default or len(mm.users) != 1:
        return None
    rows = mm.args[0]
    if getattr(rows, "target", None) is not aten.reshape.default:
        return None
    a, out, flat = _val(rows.args[0]), _val(node), _val(rows)
    if a is None or out is None or flat is None:
        return None
    lead = tuple(a.shape[:-1])
    # torch's N-D form: rows = a viewed as [prod(lead), K], out = mm viewed as [*lead, N]
    if tuple(out.shape[:-1]) != lead or tuple(flat.shape) != (math.prod(lead), a.shape[-1]):
        return None
    return _Term(rows.args[0], mm.args[1], (node, mm, rows))


def _add_tree(node: Any, root: bool = True) -> tuple[list[Any], list[Any]] | None:
    """(leaves, inner adds) of the add tree rooted at `node`, whose inner adds are
    single-use; None when `node` is no add or a leaf is not a graph node."""
    if node.target is not aten.add.Tensor or node.kwargs.get("alpha", 1) != 1:
        return None if root else ([node], [])
    if not root and len(node.users) != 1:
        return [node], []
    leaves: list[Any] = []
    inner: list[Any] = [] if root else [node]
    for arg in node.args[:2]:
        if not isinstance(arg, torch.fx.Node):
            return None
        below = _add_tree(arg, root=False)
        if below is None:
            return None
        leaves.extend(below[0])
        inner.extend(below[1])
    return leaves, inner


def _mergeable(terms: list[_Term], out: Any) -> bool:
    """Same form, dtype and rows for every term, and their sum is `out`'s shape."""
    vals = [(_val(t.a), _val(t.b)) for t in terms]
    if any(a is None or b is None or b.dim() != 2 for a, b in vals):
        return False
    nd = [len(t.nodes) == 3 for t in terms]
    if len(set(nd)) != 1 or (not nd[0] and any(a.dim() != 2 for a, _ in vals)):
        return False
    first_a, first_b = vals[0]
    return all(
        a.dtype == first_a.dtype == b.dtype
        and a.device == first_a.device
        and tuple(a.shape[:-1]) == tuple(first_a.shape[:-1])
        and a.shape[-1] == b.shape[0]
        and b.shape[1] == first_b.shape[1]
        for a, b in vals
    ) and tuple(out.shape) == (*first_a.shape[:-1], first_b.shape[1])


def _example(arg: Any) -> Any:
    if isinstance(arg, torch.fx.Node):
        return _val(arg)
    if isinstance(arg, list):
        return [_example(a) for a in arg]
    return arg


def fuse_summed_reduce_scatter(graph: Any, match: Any) -> bool:
    """Replace the reduce-scatter `match` by one fused op if its input is a sum whose every
    term is a matmul; False (graph untouched) otherwise."""
    root, group_name = compat.reduce_scatter_match_parts(match)
    tree = _add_tree(root)
    if tree is None:
        return False
    leaves, inner_adds = tree
    terms = [_term(leaf) for leaf in leaves]
    out = _val(root)
    if out is None or any(t is None for t in terms):
        return False
    found = [t for t in terms if t is not None]
    if not _mergeable(found, out):
        return False
    reduce_op, scatter_dim = compat.reduce_scatter_match_reduction(match)
    args = ([t.a for t in found], [t.b for t in found], reduce_op, scatter_dim, group_name)
    op = torch.ops.dt_symm_mem.fused_matmuls_reduce_scatter.default
    with graph.inserting_before(compat.reduce_scatter_match_start(match)):
        fused = graph.call_function(op, args)
    fused.meta["val"] = op(*(_example(a) for a in args))  # fake kernel on the fake values
    compat.replace_reduce_scatter_match(match, fused)
    _erase_unused([root, *inner_adds, *(n for t in found for n in t.nodes)])
    return True


def _erase_unused(nodes: list[Any]) -> None:
    """Erase the nodes that nothing uses any more (users before their inputs)."""
    pending = list(nodes)
    while pending:
        unused = [n for n in pending if not n.users]
        if not unused:
            return
        for node in unused:
            node.graph.erase_node(node)
            pending.remove(node)


def _fusion_follows(input_node: Any) -> bool:
    """Fuse only where this plugin's kernel runs the fused op: CPU groups.

    Accelerator graphs are left as torch made them: the op has no CUDA kernel, and the
    join torch's own fused op would need (cat + one matmul) took 1.05-1.32x the time of
    the two matmuls and the add on an H100 (2026-11-26) at LLM shapes in bf16 (8192 x
    2x7168 x 4096: 1.46 vs 1.23 ms), which the reduce-scatter's overlap would have to pay
    back; that is unmeasured (it needs 2 GPUs)."""
    value = _val(input_node)
    current = settings.current()
    if value is None or not (current.merge_summed_matmuls and current.compile_pass):
        return False
    return value.device.type == "cpu"


def merge_summed_matmuls_before_reduce_scatter(graph: Any) -> None:
    """The pass: every CPU reduce-scatter fed by a sum of matmuls becomes one fused op."""
    for match in compat.find_reduce_scatter_matches(graph):
        input_node, _ = compat.reduce_scatter_match_parts(match)
        if _fusion_follows(input_node):
            fuse_summed_reduce_scatter(graph, match)
