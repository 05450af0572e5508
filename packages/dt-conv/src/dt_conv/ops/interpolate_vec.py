"""`F.interpolate`'s entry ops (`upsample_*.vec`) for DTensors, traceable.

The `.vec` overloads are composite: eagerly they call the `.default` op, which reaches
DTensor and dt-conv's handler. While tracing, torch's Python dispatcher instead runs its
Python decompositions, which break the op into index arithmetic on the DTensor (plain
index tensors mixed with DTensors: an error, or gathers). dt-conv registers an autograd
kernel for the `.vec` overloads: DTensors go to the `.default` op below autograd (so no
decomposition runs) inside an autograd.Function whose backward is the op's own
`_backward` op (dt-conv's handler); every other tensor gets torch's own composite
kernel, chosen as torch chooses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from dt_core.compat.tracing import below_autograd, run_torch_composite
from torch.distributed.tensor import DTensor

from ..handled_ops import UPSAMPLE

# the ops whose `.vec` overload takes align_corners (every mode but the nearest ones)
LINEAR = tuple(name for name in UPSAMPLE if "nearest" not in name)
NEAREST = tuple(name for name in UPSAMPLE if "nearest" in name)
VEC_OPS = LINEAR + NEAREST


def _sizes(
    x: DTensor, output_size: Sequence[int] | None, scale_factors: Sequence[float] | None
) -> tuple[list[int], list[float | None]]:
    """Output size and per-dim scales as the `.vec` overloads compute them."""
    spatial = list(x.shape[2:])
    if output_size is not None:
        return list(output_size), [None] * len(spatial)
    assert scale_factors is not None  # torch's own check ran first (validate)
    return [int(s * f) for s, f in zip(spatial, scale_factors, strict=True)], list(scale_factors)


class _Upsample(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: DTensor, name: str, size: list, flags: list, scales: list
    ) -> torch.Tensor:
        # ctx: torch's FunctionCtx, which takes whatever attributes forward leaves for backward
        ctx.saved = (name, size, list(x.shape), flags, scales)
        with below_autograd():
            return getattr(torch.ops.aten, name).default(x, size, *flags, *scales)

    @staticmethod
    def backward(ctx: Any, grad: DTensor) -> tuple[torch.Tensor, None, None, None, None]:
        name, size, in_size, flags, scales = ctx.saved
        back = getattr(torch.ops.aten, f"{name}_backward").default
        return back(grad, size, in_size, *flags, *scales), None, None, None, None


def upsample_vec(name: str, x: torch.Tensor, *args: object) -> torch.Tensor:
    """Kernel of `aten::<name>.vec` at the autograd keys."""
    op = getattr(torch.ops.aten, name).vec
    if not isinstance(x, DTensor):
        return run_torch_composite(op, x, *args)
    if name in LINEAR:
        output_size, align_corners, scale_factors = args
        flags: list = [align_corners]
    else:
        output_size, scale_factors = args
        flags = []
    from ..static_sizes import static_sizes
    from ..validate import raise_like_torch

    x = static_sizes(x, keep_batch=True)  # interpolate takes batched input only
    raise_like_torch(op, (x, *args), {})
    # types as the `.vec` schemas declare them
    size, scales = _sizes(
        x,
        cast("Sequence[int] | None", output_size),
        cast("Sequence[float] | None", scale_factors),
    )
    return _Upsample.apply(x, name, size, flags, scales)
