"""`F.interpolate` (nearest, nearest-exact, linear, bilinear, bicubic, trilinear) on
sharded dims.

Interpolation is separable: along each dim, output row `o` reads a few input rows (its
taps: one for nearest, two for linear, four for cubic) with weights. Those tables come
from torch itself — its op applied to an index ramp (nearest) or an identity matrix
(linear, cubic) — so the sharded result uses torch's own index and weight arithmetic,
including scale factors, align_corners and the clamping of cubic taps at the borders. A
rank computes its owned output rows from a halo window of input rows. Antialiased modes
(`antialias=True`) read a footprint that grows with the downscale: they fall back to
replicated inputs with a warning.
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
    """Per output row: its source rows, one per tap (`taps[k][o]`), and their weights
    (`weights[k][o]`; nearest: one tap and no weights). A row with fewer taps than the
    table repeats its last source row with weight 0."""

    taps: tuple[tuple[int, ...], ...]
    weights: tuple[tuple[float, ...], ...] | None

    @property
    def rows(self) -> int:
        return len(self.taps[0])

    def reach(self) -> Table:
        return Table(
            tuple(min(rows) for rows in zip(*self.taps, strict=True)),
            tuple(max(rows) + 1 for rows in zip(*self.taps, strict=True)),
        )


TAPS = {"linear": 2, "cubic": 4}


def _weight_matrix(
    kind: str, size: int, out: int, align_corners: bool, scale: float | None, dtype: torch.dtype
) -> torch.Tensor:
    """(size, out): column o holds output row o's weight on each input row, from torch's
    kernel applied to an identity (cubic: the 2-D op on a width-1 image, whose width
    interpolation is the identity exactly)."""
    eye = torch.eye(size, dtype=dtype)
    if kind == "linear":
        line = aten.upsample_linear1d.default(
            eye.reshape(size, 1, size), [out], align_corners, scale
        )
        return line.reshape(size, out)
    image = eye.reshape(size, 1, size, 1)
    cubic = aten.upsample_bicubic2d.default(image, [out, 1], align_corners, scale, None)
    return cubic.reshape(size, out)


@functools.lru_cache(maxsize=256)
def dim_table(
    kind: str,
    size: int,
    out: int,
    align_corners: bool | None,
    scale: float | None,
    dtype: torch.dtype,
) -> DimTable:
    """torch's own source rows and weights for one dim, read off its kernel: a ramp
    through nearest gives the source rows, an identity through linear or cubic the
    weights (run on real probe tensors even while tracing: the table is metadata, not
    graph)."""
    probe_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    with no_dispatch_modes():
        if kind not in TAPS:
            ramp = torch.arange(size, dtype=probe_dtype).reshape(1, 1, size)
            src = PROBES[kind](ramp, [out], scale).reshape(out).long().tolist()
            return DimTable((tuple(src),), None)
        weights = _weight_matrix(kind, size, out, bool(align_corners), scale, probe_dtype)
        taps: list[list[int]] = [[] for _ in range(TAPS[kind])]
        values: list[list[float]] = [[] for _ in range(TAPS[kind])]
        for column in weights.t().tolist():
            rows = [i for i, w in enumerate(column) if w != 0] or [0]
            rows += [rows[-1]] * (TAPS[kind] - len(rows))
            for k, row in enumerate(rows):
                taps[k].append(row)
                duplicate = k > 0 and row == rows[k - 1]
                values[k].append(0.0 if duplicate else column[row])
        return DimTable(tuple(map(tuple, taps)), tuple(map(tuple, values)))


def _rows_of(
    table: DimTable, rows: tuple[int, int], start: int, like: torch.Tensor, dim: int
) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Per tap: source rows relative to a window starting at input row `start`, and the
    weights shaped to broadcast along `dim` of `like`, for output rows `rows`."""
    lo, hi = rows
    shape = [1] * like.ndim
    shape[dim] = hi - lo
    found = []
    for k, tap in enumerate(table.taps):
        index = torch.tensor(tap[lo:hi], device=like.device) - start
        weight = None
        if table.weights is not None:
            values = table.weights[k][lo:hi]
            weight = torch.tensor(values, dtype=like.dtype, device=like.device).reshape(shape)
        found.append((index, weight))
    return found


def _apply(
    window: torch.Tensor, dim: int, table: DimTable, rows: tuple[int, int], start: int
) -> torch.Tensor:
    """Output rows `rows` along `dim` from a window whose first row is input row `start`."""
    terms = [
        window.index_select(dim, index) * (1 if weight is None else weight)
        for index, weight in _rows_of(table, rows, start, window, dim)
    ]
    out = terms[0]
    for term in terms[1:]:
        out = out + term
    return out


def _kind(name: str) -> str:
    if "nearest_exact" in name:
        return "nearest_exact"
    if "nearest" in name:
        return "nearest"
    return "cubic" if "bicubic" in name else "linear"


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
    if name.split(".")[0].removesuffix("_backward").endswith("_aa"):
        raise Unsupported(
            "antialiased interpolation reads a footprint that grows with the downscale"
        )
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
            return (0, tables[i].rows), 0
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
    for index, weight in _rows_of(table, rows, start, grad, dim):
        out.index_add_(dim, index, grad if weight is None else grad * weight)
    return out


def _split_args(name: str, values: list, backward: bool) -> tuple:
    """(output_size, input_size or None, align_corners or None, scales) of an upsample op."""
    rest = values[2:] if not backward else values[3:]
    in_size = values[2] if backward else None
    if _kind(name) in TAPS:
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
