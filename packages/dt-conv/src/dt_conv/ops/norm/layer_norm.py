"""Layer norm over trailing dims of which one or more is sharded (a norm over (C, H, W)
of a spatially sharded image, or over a sharded feature dim).

Statistics reduce over the normalized dims and every rank's part of them; the weight and
bias, shaped like the normalized dims, are sliced like the input (no communication).
Backward: the two sums per normalized row are global (one all-reduce); the weight and
bias gradients sum over the leading dims, and over the ranks sharding those, then are
gathered whole.
"""

from __future__ import annotations

from typing import Any

import torch
from dt_core.dtensors import as_dtensor
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard

from .common import laid_out_like, local, sharded_or_fallback, wrap
from .layout import NormLayout, norm_layout, shards_any
from .moments import accumulation_dtype, global_moments, global_sums

OPS = ("native_layer_norm.default", "native_layer_norm_backward.default")


def _first_normalized(x: DTensor, normalized_shape: Any) -> int:
    return x.ndim - len(normalized_shape)


def takes_forward(args: tuple, kwargs: dict) -> bool:
    """The calls dt-conv takes: a normalized dim of the input is sharded."""
    if len(args) < 2 or not isinstance(args[0], DTensor):
        return False
    x = args[0]
    return shards_any(x.placements, range(_first_normalized(x, args[1]), x.ndim))


def takes_backward(args: tuple, kwargs: dict) -> bool:
    if len(args) < 3 or not isinstance(args[1], DTensor):
        return False
    x = args[1]
    return shards_any(x.placements, range(_first_normalized(x, args[2]), x.ndim))


def _layout(x: DTensor, normalized_shape: Any) -> NormLayout:
    first = _first_normalized(x, normalized_shape)
    return norm_layout(x.device_mesh, x.shape, x.placements, range(first, x.ndim))


def _param_placements(x: DTensor, first: int, leading: Placement) -> list[Placement]:
    """A parameter's placements: sliced like the normalized dims it spans; `leading` on
    mesh dims sharding a leading dim."""
    out: list[Placement] = []
    for p in x.placements:
        if isinstance(p, Shard):
            out.append(Shard(p.dim - first) if p.dim >= first else leading)
        else:
            out.append(Replicate())
    return out


def _sliced(param: Any, x: DTensor, first: int) -> Any:
    """This rank's slice of a replicated parameter, laid out like x's normalized dims."""
    if not isinstance(param, DTensor):
        return param
    return param.redistribute(x.device_mesh, _param_placements(x, first, Replicate())).to_local()


def _plan(values: dict[str, Any]) -> NormLayout:
    return _layout(values["input"], values["normalized_shape"])


def forward(op_call: Any, args: tuple, kwargs: dict) -> Any:
    return sharded_or_fallback(op_call, args, kwargs, _plan, _forward)


def _forward(op_call: Any, values: dict[str, Any], layout: NormLayout) -> Any:
    x: DTensor = values["input"]
    shape = values["normalized_shape"]
    first = _first_normalized(x, shape)
    xl = x.to_local()
    acc = accumulation_dtype(xl.dtype)
    xa = xl.to(acc)
    mean, var = global_moments(xa, layout)
    rstd = torch.rsqrt(var + float(values["eps"]))
    out = (xa - mean) * rstd
    weight, bias = _sliced(values["weight"], x, first), _sliced(values["bias"], x, first)
    if weight is not None:
        out = out * weight.to(acc)
    if bias is not None:
        out = out + bias.to(acc)
    stat = layout.stat_placements(Replicate())
    return (
        wrap(out.to(xl.dtype), layout),
        wrap(mean, layout, stat, layout.stat_shape()),
        wrap(rstd, layout, stat, layout.stat_shape()),
    )


def backward(op_call: Any, args: tuple, kwargs: dict) -> Any:
    return sharded_or_fallback(op_call, args, kwargs, _plan, _backward)


def _backward(op_call: Any, values: dict[str, Any], layout: NormLayout) -> Any:
    x: DTensor = values["input"]
    shape = values["normalized_shape"]
    first = _first_normalized(x, shape)
    grad = laid_out_like(values["grad_out"], x)
    xl = x.to_local()
    acc = accumulation_dtype(xl.dtype)
    dy = local(grad).to(acc)
    xhat = (xl.to(acc) - local(values["mean"])) * local(values["rstd"])
    weight = _sliced(values["weight"], x, first)
    g = dy if weight is None else dy * weight.to(acc)
    reduced = layout.reduced
    mask = list(values["output_mask"])
    grad_input = None
    if mask[0]:
        s1, s2 = global_sums(
            [g.sum(reduced, keepdim=True), (g * xhat).sum(reduced, keepdim=True)], layout
        )
        count = layout.count
        gi = local(values["rstd"]) * (g - s1 / count - xhat * (s2 / count))
        grad_input = wrap(gi.to(xl.dtype), layout)
    param = values["weight"] if values["weight"] is not None else values["bias"]
    dtype = param.dtype if param is not None else xl.dtype
    leading = tuple(range(first))
    grads = []
    for wanted, part in ((mask[1], dy * xhat), (mask[2], dy)):
        grads.append(_param_grad(part.sum(leading), x, first, shape, dtype) if wanted else None)
    return grad_input, grads[0], grads[1]


def _param_grad(
    part: torch.Tensor, x: DTensor, first: int, shape: Any, dtype: torch.dtype
) -> DTensor:
    """A parameter gradient from this rank's partial sum over its leading rows: summed
    over the ranks sharding leading dims, gathered over those sharding normalized dims."""
    pending = as_dtensor(
        part.to(dtype), x.device_mesh, _param_placements(x, first, Partial()), tuple(shape)
    )
    return pending.redistribute(x.device_mesh, [Replicate()] * x.device_mesh.ndim)
