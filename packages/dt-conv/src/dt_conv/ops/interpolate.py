"""`F.interpolate` (nearest, nearest-exact, linear, bilinear, trilinear) on sharded dims.

Interpolation is separable: along each dim, output row `o` reads input rows `i0[o]` and
`i1[o]` with weights `w0[o]`, `w1[o]`. Those tables come from torch itself — its 1-D op
applied to an index ramp (nearest) or an identity matrix (linear) — so the sharded
result uses torch's own index and weight arithmetic, including scale factors and
align_corners. A rank computes its owned output rows from a halo window of input rows.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
from dt_core.compat.tracing import no_dispatch_modes
from dt_core.kit import Unsupported, bind_positional, replicated_fallback
from torch.distributed.tensor import DTensor

from ..engine import windows
from ..engine.geometry import DimSplit, Table
from ..engine.plan import SpatialPlan, Splitter, plan_spatial

aten = torch.ops.aten

PROBES = {
    "nearest": aten.upsample_nearest1d.default,
    "nearest_exact": aten._upsample_nearest_exact1d.default,
    "linear": aten.upsample_linear1d.default,
}


@dataclass(frozen=True)
class DimTable:
    """Per output row: two source rows and their weights (nearest: one row, weight 1)."""

    i0: tuple[int, ...]
    i1: tuple[int, ...]
    w0: tuple[float, ...]
    w1: tuple[float, ...]
    linear: bool

    def reach(self) -> Table:
        return Table(
            tuple(min(a, b) for a, b in zip(self.i0, self.i1, strict=True)),
            tuple(max(a, b) + 1 for a, b in zip(self.i0, self.i1, strict=True)),
        )


@functools.lru_cache(maxsize=256)
def dim_table(
    kind: str,
    size: int,
    out: int,
    align_corners: bool | None,
    scale: float | None,
    dtype: torch.dtype,
) -> DimTable:
    """torch's own source rows and weights for one dim, read off its 1-D kernel: a ramp
    through nearest gives the source rows, an identity through linear the weights (run on
    real probe tensors even while tracing: the table is metadata, not graph)."""
    probe_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    with no_dispatch_modes():
        if kind != "linear":
            ramp = torch.arange(size, dtype=probe_dtype).reshape(1, 1, size)
            src = PROBES[kind](ramp, [out], scale).reshape(out).long().tolist()
            ones = (1.0,) * out
            return DimTable(tuple(src), tuple(src), ones, (0.0,) * out, False)
        eye = torch.eye(size, dtype=probe_dtype).reshape(size, 1, size)
        weights = PROBES["linear"](eye, [out], bool(align_corners), scale).reshape(size, out)
        i0 = (weights != 0).to(torch.int8).argmax(0)
        i1 = torch.clamp(i0 + 1, max=size - 1)
        cols = torch.arange(out)
        w0 = weights[i0, cols]
        w1 = torch.where(i1 != i0, weights[i1, cols], torch.zeros_like(w0))
        return DimTable(
            tuple(i0.tolist()), tuple(i1.tolist()), tuple(w0.tolist()), tuple(w1.tolist()), True
        )


def _rows_of(
    table: DimTable, rows: tuple[int, int], start: int, like: torch.Tensor, dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(i0, i1) relative to a window starting at input row `start`, and (w0, w1) shaped
    to broadcast along `dim` of `like`, for output rows `rows`."""
    lo, hi = rows
    idx0 = torch.tensor(table.i0[lo:hi], device=like.device) - start
    idx1 = torch.tensor(table.i1[lo:hi], device=like.device) - start
    shape = [1] * like.ndim
    shape[dim] = hi - lo
    w0 = torch.tensor(table.w0[lo:hi], dtype=like.dtype, device=like.device).reshape(shape)
    w1 = torch.tensor(table.w1[lo:hi], dtype=like.dtype, device=like.device).reshape(shape)
    return idx0, idx1, w0, w1


def _apply(
    window: torch.Tensor, dim: int, table: DimTable, rows: tuple[int, int], start: int
) -> torch.Tensor:
    """Output rows `rows` along `dim` from a window whose first row is input row `start`."""
    idx0, idx1, w0, w1 = _rows_of(table, rows, start, window, dim)
    picked = window.index_select(dim, idx0)
    if not table.linear:
        return picked
    return picked * w0 + window.index_select(dim, idx1) * w1


def _kind(name: str) -> str:
    if "nearest_exact" in name:
        return "nearest_exact"
    return "nearest" if "nearest" in name else "linear"


def _window_op(
    x: DTensor,
    name: str,
    in_shape: Sequence[int],
    out_sizes: Sequence[int],
    align_corners: bool | None,
    scales: Sequence[float | None],
) -> windows.WindowOp:
    """The interpolation as a halo op; `Unsupported` where the sharded path cannot be exact."""
    n = len(out_sizes)
    if len(in_shape) != n + 2:
        raise Unsupported("unexpected input rank")
    kind, first = _kind(name), len(in_shape) - n
    tables = [
        dim_table(kind, in_shape[first + i], out_sizes[i], align_corners, scales[i], x.dtype)
        for i in range(n)
    ]

    def splitter(i: int) -> Splitter:
        dim, table = first + i, tables[i]
        return lambda mesh_dim, parts: DimSplit(
            dim, mesh_dim, parts, in_shape[dim], out_sizes[i], table.reach()
        )

    out_shape = (*in_shape[:first], *out_sizes)
    plan = plan_spatial(x, out_shape, {first + i: splitter(i) for i in range(n)}, in_shape=in_shape)
    local, vjp = _local_fns(plan, tables, first)
    return windows.WindowOp(plan, local, vjp)


def _local_fns(
    plan: SpatialPlan, tables: list[DimTable], first: int
) -> tuple[windows.LocalFn, windows.LocalVjp]:
    """This rank's output block from its window, and the adjoint of that map."""
    split_of = {s.dim: s for s in plan.splits}

    def rows(i: int) -> tuple[tuple[int, int], int]:
        split = split_of.get(first + i)
        if split is None:
            return (0, len(tables[i].i0)), 0
        rank = plan.local_rank(split)
        return split.owned_out(rank), split.needed(rank)[0]

    def local(window: torch.Tensor) -> torch.Tensor:
        out = window
        for i, table in enumerate(tables):
            out = _apply(out, first + i, table, *rows(i))
        return out

    def vjp(window: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        for i in reversed(range(len(tables))):
            grad = _adjoint(grad, first + i, tables[i], *rows(i), window.shape[first + i])
        return grad

    return local, vjp


def _adjoint(
    grad: torch.Tensor, dim: int, table: DimTable, rows: tuple[int, int], start: int, size: int
) -> torch.Tensor:
    """Transpose of `_apply`: scatter-add each output row's gradient to its sources."""
    shape = list(grad.shape)
    shape[dim] = size
    out = grad.new_zeros(shape)
    idx0, idx1, w0, w1 = _rows_of(table, rows, start, grad, dim)
    if not table.linear:
        return out.index_add_(dim, idx0, grad)
    out.index_add_(dim, idx0, grad * w0)
    return out.index_add_(dim, idx1, grad * w1)


def _split_args(name: str, values: list, backward: bool) -> tuple:
    """(output_size, input_size or None, align_corners or None, scales) of an upsample op."""
    rest = values[2:] if not backward else values[3:]
    in_size = values[2] if backward else None
    if _kind(name) == "linear":
        return values[1], in_size, rest[0], list(rest[1:])
    return values[1], in_size, None, list(rest)


def upsample(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    values = bind_positional(op_call, args, kwargs)
    x, name = cast(DTensor, values[0]), op_call.__name__  # schema: Tensor
    out_size, _, align, scales = _split_args(name, values, backward=False)
    try:
        op = _window_op(x, name, x.shape, out_size, align, scales)
    except Unsupported as exc:
        return replicated_fallback("conv", str(exc), op_call, values, like=(x,))
    if not op.plan.splits:  # nothing sharded along the op's dims: torch's own kernel
        local = op_call(x.to_local(), *values[1:])
        return windows.as_dtensor(local, op.plan.mesh, op.plan.placements, op.plan.out_shape)
    return windows.forward(op, x)


def upsample_backward(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    values = bind_positional(op_call, args, kwargs)
    grad, name = cast(DTensor, values[0]), op_call.__name__  # schema: Tensor
    out_size, in_size, align, scales = _split_args(name, values, backward=True)
    try:
        op = _window_op(grad, name, in_size, out_size, align, scales)
    except Unsupported as exc:
        return replicated_fallback("conv", str(exc), op_call, values, like=(grad,))
    if not op.plan.splits:  # only non-op dims sharded: torch's kernel on local sizes
        g = grad.to_local()
        local_in = list(in_size)
        for mesh_dim in op.plan.free_mesh_dims:
            dim = windows.shard_dim(op.plan.placements[mesh_dim]) % len(in_size)
            local_in[dim] = g.shape[dim]
        local = op_call(g, values[1], local_in, *values[3:])
        return windows.as_dtensor(local, op.plan.mesh, op.plan.placements, in_size)
    return windows.backward(op, grad, None, in_size)
