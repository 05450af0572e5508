"""Max and average pooling (2-D and 3-D aten ops; 1-D reaches them unsqueezed).

Pooling windows are convolution windows, so a sharded dim exchanges the same halos; the
window is filled with -inf (max) or zeros (average) where torch pads implicitly. The
average divides window sums by torch's own divisor, computed per dim from global
positions (it is a product over dims), so edge windows divide exactly as unsharded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import cast

import torch
from dt_core.dtensors import as_dtensor
from dt_core.kit import Unsupported, bind_positional, replicated_fallback
from torch.distributed.tensor import DTensor

from .. import ranks
from ..engine import windows
from ..engine.geometry import conv_split, expand
from ..engine.plan import SpatialPlan, Splitter, plan_spatial

aten = torch.ops.aten


def pool_out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's pooling output length (a window may not start in the right padding)."""
    span = size + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _plan(
    x: DTensor, n: int, kernel: list, stride: list, padding: list, dilation: list, ceil: bool
) -> SpatialPlan:
    """The pooling's plan; `Unsupported` where the sharded path cannot be exact."""
    if x.ndim != n + 2:
        raise Unsupported("unbatched input")
    first = x.ndim - n
    sizes = [
        pool_out_size(x.shape[first + i], kernel[i], stride[i], padding[i], dilation[i], ceil)
        for i in range(n)
    ]
    if min(sizes) < 1:
        raise Unsupported("empty pooling output")

    def splitter(i: int) -> Splitter:
        dim = first + i
        args = (x.shape[dim], kernel[i], stride[i], padding[i], dilation[i], sizes[i])
        return lambda mesh_dim, parts: conv_split(dim, mesh_dim, parts, *args)

    out_shape = (*x.shape[:first], *sizes)
    return plan_spatial(x, out_shape, {first + i: splitter(i) for i in range(n)})


def _args(n: int, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int]) -> tuple:
    kernel = expand(kernel, n)
    stride = expand(stride, n) if len(stride) else list(kernel)
    return kernel, stride, expand(padding, n)


def _bound(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[list, DTensor, int]:
    """The op's arguments by its schema, the pooled input (the first argument, or the second
    after the output gradient in backward ops; a Tensor) and the number of pooled dims."""
    values = bind_positional(op_call, args, kwargs)
    x = values[1] if "backward" in op_call.__name__ else values[0]
    return values, cast(DTensor, x), 2 if "2d" in op_call.__name__ else 3


def _local_padding(plan: SpatialPlan, padding: list[int], n: int, ndim: int) -> list[int]:
    local = list(padding)
    for s in plan.splits:
        local[s.dim - (ndim - n)] = 0
    return local


# ---- max pooling -------------------------------------------------------------------


def _max_op(
    x: DTensor, n: int, args: list
) -> tuple[windows.WindowOp, Callable[[torch.Tensor], tuple]]:
    """The planned op, and the local pool returning (values, window-local indices)."""
    kernel, stride, padding = _args(n, args[1], args[2], args[3])
    dilation, ceil = expand(args[4], n), bool(args[5])
    plan = _plan(x, n, kernel, stride, padding, dilation, ceil)
    pool = aten.max_pool2d_with_indices if n == 2 else aten.max_pool3d_with_indices
    back = (
        aten.max_pool2d_with_indices_backward if n == 2 else aten.max_pool3d_with_indices_backward
    )
    pad = _local_padding(plan, padding, n, x.ndim)

    def pool_both(window: torch.Tensor) -> tuple:
        return pool(window, kernel, stride, pad, dilation, ceil)

    def local(window: torch.Tensor) -> torch.Tensor:
        return pool_both(window)[0]

    def vjp(window: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        indices = pool_both(window)[1]
        return back(grad, window, kernel, stride, pad, dilation, ceil, indices)

    op = windows.WindowOp(plan, local, vjp, fill_value=-math.inf, grad_reads_input=True)
    return op, pool_both


def max_pool_with_indices(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    """Values and global flat indices, both laid out like the input (one halo exchange)."""
    values, x, n = _bound(op_call, args, kwargs)
    try:
        op, pool_both = _max_op(x, n, values)
    except Unsupported as exc:
        return replicated_fallback("conv", str(exc), op_call, values, like=(x, x))
    plan = op.plan
    with torch.no_grad():
        local = x.to_local()
        window = windows.gather_windows(plan, local, op.fill_value)

        def block(window: torch.Tensor, local: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            shape = windows.local_shape(plan, plan.out_shape, local.shape)
            if window.numel() == 0 or 0 in shape:
                idx = torch.zeros(shape, dtype=torch.int64, device=window.device)
                return window.new_zeros(shape), idx
            out, idx = pool_both(window)
            return out, _global_indices(plan, idx, window.shape, x.shape, n)

        out, idx = ranks.each_rank(plan.mesh, block, window, local)
    return (
        as_dtensor(out, plan.mesh, plan.placements, plan.out_shape),
        as_dtensor(idx, plan.mesh, plan.placements, plan.out_shape),
    )


def _global_indices(
    plan: SpatialPlan,
    idx: torch.Tensor,
    window_shape: Sequence[int],
    global_shape: Sequence[int],
    n: int,
) -> torch.Tensor:
    """Flat indices into the window's spatial block -> flat indices into the global one."""
    first = len(global_shape) - n
    offsets = [0] * n
    for s in plan.splits:
        offsets[s.dim - first] = s.needed(plan.local_rank(s))[0]
    coords = []
    for size in reversed(window_shape[first:]):
        coords.append(idx % size)
        idx = idx // size
    coords.reverse()
    flat = torch.zeros_like(idx)
    for i in range(n):
        flat = flat * global_shape[first + i] + coords[i] + offsets[i]
    return flat


def max_pool_with_indices_backward(
    op_call: torch._ops.OpOverload, args: tuple, kwargs: dict
) -> object:
    values, x, n = _bound(op_call, args, kwargs)
    try:
        op, _ = _max_op(x, n, values[1:])  # the forward's arguments follow the gradient
    except Unsupported as exc:
        return replicated_fallback("conv", str(exc), op_call, values, like=(x,))
    return windows.backward(op, cast(DTensor, values[0]), x, x.shape)


# ---- average pooling -----------------------------------------------------------------


def _divisors(size: int, out: int, k: int, s: int, p: int, include_pad: bool) -> list[int]:
    """torch's per-dim divisor factor of each output row (product over dims = divisor)."""
    result = []
    for o in range(out):
        start = o * s - p
        end = min(start + k, size + p)
        if not include_pad:
            start, end = max(start, 0), min(end, size)
        result.append(end - start)
    return result


def _avg_op(x: DTensor, n: int, values: list) -> windows.WindowOp:
    kernel, stride, padding = _args(n, values[1], values[2], values[3])
    ceil, include_pad, override = bool(values[4]), bool(values[5]), values[6]
    plan = _plan(x, n, kernel, stride, padding, [1] * n, ceil)
    pool = aten.avg_pool2d if n == 2 else aten.avg_pool3d
    pad = _local_padding(plan, padding, n, x.ndim)
    first, ndim, x_shape = x.ndim - n, x.ndim, tuple(x.shape)
    rows_per_dim = [
        _divisors(
            x_shape[first + i],
            plan.out_shape[first + i],
            kernel[i],
            stride[i],
            padding[i],
            include_pad,
        )
        for i in range(n)
    ]
    back = aten.avg_pool2d_backward if n == 2 else aten.avg_pool3d_backward

    def divide_by(t: torch.Tensor) -> torch.Tensor:
        """Divide by torch's divisors of this rank's output rows (per-rank code)."""
        owned = {s.dim: s.owned_out(plan.local_rank(s)) for s in plan.splits}
        d = torch.ones((), dtype=t.dtype, device=t.device)
        for i, rows in enumerate(rows_per_dim):
            lo, hi = owned.get(first + i, (0, len(rows)))
            shape = [1] * ndim
            shape[first + i] = hi - lo
            d = d * torch.tensor(rows[lo:hi], dtype=t.dtype, device=t.device).reshape(shape)
        return t / d

    def local(window: torch.Tensor) -> torch.Tensor:
        if override is not None:
            return pool(window, kernel, stride, pad, ceil, True, override)
        return divide_by(pool(window, kernel, stride, pad, ceil, True, 1))

    def vjp(window: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        if override is not None:
            return back(grad, window, kernel, stride, pad, ceil, True, override)
        return back(divide_by(grad), window, kernel, stride, pad, ceil, True, 1)

    return windows.WindowOp(plan, local, vjp, fill_value=0.0)


def avg_pool(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    values, x, n = _bound(op_call, args, kwargs)
    try:
        op = _avg_op(x, n, values)
    except Unsupported as exc:
        return replicated_fallback("conv", str(exc), op_call, values, like=(x,))
    return windows.forward(op, x)


def avg_pool_backward(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    values, x, n = _bound(op_call, args, kwargs)
    try:
        op = _avg_op(x, n, values[1:])  # the forward's arguments follow the gradient
    except Unsupported as exc:
        return replicated_fallback("conv", str(exc), op_call, values, like=(x,))
    return windows.backward(op, cast(DTensor, values[0]), None, x.shape)
