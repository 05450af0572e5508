"""`F.pad` on sharded dims: constant (also negative, i.e. cropping), reflect, replicate,
circular.

Padded output rows are owned by the chunk rule of the padded size, so the result is a
proper `Shard` DTensor; each rank's window is its output rows read as virtual input
rows, which the halo exchange fills with the padding mode (reflected or clamped rows
may come from a neighbour on thin shards; circular rows wrap around the ring, so the
first rank reads the last rank's rows). Unsharded dims are padded by torch's own op.

Circular padding is composite in torch (`aten::_pad_circular` decomposes into slices and
copies before DTensor sees it), so it cannot be a DTensor handler: `circular_pad` is
called from the plugin's autograd kernel for that op and brings its own backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from dt_core.kit import Unsupported, bind_positional, replicated_fallback
from torch.distributed.tensor import DTensor

from .. import ranks
from ..engine import windows
from ..engine.geometry import Affine, DimSplit, Fill
from ..engine.plan import Splitter, plan_spatial
from ..static_sizes import keeps_batch, static_sizes
from ..validate import raise_like_torch, simulated_ranks

# torch's pad on the unsharded dims, and its adjoint (grad, window, rest) -> window grad
LocalPad = Callable[[torch.Tensor, list[int]], torch.Tensor]
LocalVjp = Callable[[torch.Tensor, torch.Tensor, list[int]], torch.Tensor]


def _pairs(pad: Sequence[int], ndim: int) -> dict[int, tuple[int, int]]:
    """{tensor dim: (left, right)} from torch's last-dim-first pad list."""
    return {ndim - 1 - i: (pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)}


def _window_op(
    x: DTensor,
    in_shape: Sequence[int],
    pad: Sequence[int],
    fill: Fill,
    local_pad: LocalPad,
    local_vjp: LocalVjp,
    value: float = 0.0,
) -> windows.WindowOp:
    """The pad as a halo op; `Unsupported` where the sharded path cannot be exact."""
    ndim = len(in_shape)
    if len(pad) % 2 or len(pad) // 2 > ndim:
        raise Unsupported("malformed padding")
    pairs = _pairs(pad, ndim)
    out_shape = list(in_shape)
    for dim, (left, right) in pairs.items():
        out_shape[dim] = in_shape[dim] + left + right
        if out_shape[dim] < 0 or in_shape[dim] + min(left, 0) + min(right, 0) < 0:
            raise Unsupported("negative output size")  # the fallback raises torch's own error
        if fill == "reflect" and max(left, right) >= in_shape[dim]:
            raise Unsupported("reflect padding not smaller than the input")
        if fill != "constant" and (min(left, right) < 0 or in_shape[dim] == 0):
            raise Unsupported("negative or empty non-constant padding")

    def splitter(dim: int) -> Splitter:
        left, _ = pairs[dim]
        reach = Affine(1, -left, 1)
        return lambda mesh_dim, parts: DimSplit(
            dim, mesh_dim, parts, in_shape[dim], out_shape[dim], reach, fill
        )

    plan = plan_spatial(x, out_shape, {d: splitter(d) for d in pairs}, in_shape=in_shape)
    sharded = {s.dim for s in plan.splits}
    rest = list(pad)
    for dim in sharded:
        i = ndim - 1 - dim
        rest[2 * i] = rest[2 * i + 1] = 0

    def local(window: torch.Tensor) -> torch.Tensor:
        return local_pad(window, rest) if any(rest) else window.clone()

    def vjp(window: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        return local_vjp(grad, window, rest) if any(rest) else grad

    return windows.WindowOp(plan, local, vjp, fill_value=value)


def constant_pad(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    x_arg, pad_arg, value_arg = bind_positional(op_call, args, kwargs)
    # types as aten.constant_pad_nd's schema declares them
    x, pad = cast(DTensor, x_arg), cast(list[int], pad_arg)
    value = float(cast(float, value_arg)) if value_arg is not None else 0.0

    def local(t: torch.Tensor, rest: list[int]) -> torch.Tensor:
        return op_call(t, rest, value)

    def vjp(grad: torch.Tensor, window: torch.Tensor, rest: list[int]) -> torch.Tensor:
        return op_call(grad, [-p for p in rest], 0.0)

    try:
        op = _window_op(x, x.shape, pad, "constant", local, vjp, value)
    except Unsupported as exc:
        return replicated_fallback("conv", str(exc), op_call, [x, pad, value], like=(x,))
    return windows.forward(op, x)


def _mode(name: str) -> Fill:
    return "reflect" if name.startswith("reflection") else "replicate"


def mode_pad(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    x_arg, pad_arg = bind_positional(op_call, args, kwargs)
    x, pad = cast(DTensor, x_arg), cast(list[int], pad_arg)  # as the pad op's schema says
    try:
        op = _window_op(x, x.shape, pad, _mode(op_call.__name__), *_torch_pad(op_call))
    except Unsupported as exc:
        return replicated_fallback("conv", str(exc), op_call, [x, pad], like=(x,))
    return windows.forward(op, x)


def mode_pad_backward(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    grad_arg, x_arg, pad_arg = bind_positional(op_call, args, kwargs)
    # types as the pad backward op's schema declares them
    grad, x, pad = cast(DTensor, grad_arg), cast(DTensor, x_arg), cast(list[int], pad_arg)
    forward_op = getattr(torch.ops.aten, op_call.__name__.split(".")[0].replace("_backward", ""))
    try:
        op = _window_op(x, x.shape, pad, _mode(op_call.__name__), *_torch_pad(forward_op.default))
    except Unsupported as exc:
        return replicated_fallback("conv", str(exc), op_call, [grad, x, pad], like=(x,))
    return windows.backward(op, grad, None, x.shape)


def _torch_pad(op: torch._ops.OpOverload) -> tuple[LocalPad, LocalVjp]:
    """torch's own pad op and its backward kernel, for the unsharded dims."""
    name = op.__name__.split(".")[0]
    back = getattr(torch.ops.aten, f"{name}_backward").default
    return (lambda t, rest: op(t, rest)), (lambda g, window, rest: back(g, window, rest))


def _decompose_circular(t: torch.Tensor, pad: Sequence[int]) -> torch.Tensor:
    """torch's own circular padding (its composite decomposition)."""
    return torch.ops.aten._pad_circular.default.decompose(t, list(pad))


def _circular_vjp(grad: torch.Tensor, window: torch.Tensor, rest: list[int]) -> torch.Tensor:
    """The adjoint of torch's circular padding on the unsharded dims (it is linear)."""
    with torch.enable_grad():
        probe = torch.zeros_like(window, requires_grad=True)
        (out,) = torch.autograd.grad(_decompose_circular(probe, rest), probe, grad)
    return out


class _CircularPad(torch.autograd.Function):
    """Circular padding with the halo path in forward and its adjoint in backward."""

    @staticmethod
    def forward(ctx: Any, x: DTensor, op: windows.WindowOp) -> DTensor:
        # ctx: torch's FunctionCtx, which takes whatever attributes forward leaves for backward
        ctx.op, ctx.in_shape = op, tuple(x.shape)
        return windows.forward(op, x)

    @staticmethod
    def backward(ctx: Any, grad: DTensor) -> tuple[DTensor, None]:
        return windows.backward(ctx.op, grad, None, ctx.in_shape), None


def circular_pad(x: DTensor, pad: Sequence[int]) -> torch.Tensor:
    """`_pad_circular` for a DTensor: halo path where exact, else torch's own (gathers)."""
    pad = list(pad)
    x = static_sizes(x, keep_batch=keeps_batch(x, len(pad) // 2))
    raise_like_torch(torch.ops.aten._pad_circular.default, (x, pad), {})
    if simulated_ranks((x,), {}) and not ranks.simulated():
        return _decompose_circular(x, pad)  # LocalTensors outside their mode: torch's own
    try:
        op = _window_op(x, x.shape, pad, "circular", _decompose_circular, _circular_vjp)
    except Unsupported as exc:
        from dt_core.kit import warn_fallback

        warn_fallback("conv", "circular pad", str(exc))
        return _decompose_circular(x, pad)
    return _CircularPad.apply(x, op)
