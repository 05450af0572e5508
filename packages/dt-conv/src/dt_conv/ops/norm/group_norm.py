"""Group norm on spatially sharded inputs (diffusers' and MONAI's normalization).

The input is viewed as (N, groups, channels per group, *spatial); each (sample, group)
statistic reduces over its channels and every rank's rows (`moments.global_moments`).
Backward: per (sample, channel) sums over the rows are global (one all-reduce), from
which the per-group sums and the input gradient follow locally; the weight and bias
gradients sum those over the batch, and over the ranks sharding it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

from .common import laid_out_like, local, sharded_or_fallback, shards_spatial, wrap
from .layout import NormLayout, norm_layout
from .moments import accumulation_dtype, global_moments, global_sums

OPS = ("native_group_norm.default", "native_group_norm_backward.default")


def takes_forward(args: tuple, kwargs: dict) -> bool:
    """The forward calls dt-conv takes: the input has a spatial dim sharded."""
    return bool(args) and shards_spatial(args[0])


def takes_backward(args: tuple, kwargs: dict) -> bool:
    """The backward calls dt-conv takes: the forward's input has a spatial dim sharded."""
    return len(args) > 1 and shards_spatial(args[1])


def _grouped(x: DTensor, groups: int) -> NormLayout:
    """The layout of x viewed as (N, groups, C // groups, *spatial), reducing per group."""
    n, c, *spatial = x.shape
    shape = (n, groups, c // groups, *spatial)
    placements = [
        Shard(p.dim + 1) if p.is_shard() and p.dim >= 2 else p  # type: ignore[attr-defined]
        for p in x.placements
    ]
    return norm_layout(
        x.device_mesh,
        shape,
        placements,
        range(2, len(shape)),
        blocked={1: "channels sharded as well as a spatial dim"},
    )


def _view(t: torch.Tensor, groups: int) -> torch.Tensor:
    n, c, *spatial = t.shape
    return t.reshape(n, groups, c // groups, *spatial)


def _per_group(t: torch.Tensor, ndim: int) -> torch.Tensor:
    """(N, groups) statistics shaped to broadcast against the grouped view."""
    return t.reshape(*t.shape[:2], *([1] * (ndim - 2)))


def _per_channel(t: torch.Tensor | None, groups: int, ndim: int) -> Any:
    return None if t is None else t.reshape(1, groups, -1, *([1] * (ndim - 3)))


def _plan(values: dict[str, Any]) -> NormLayout:
    return _grouped(values["input"], int(values["group"]))


def forward(op_call: Any, args: tuple, kwargs: dict) -> Any:
    return sharded_or_fallback(op_call, args, kwargs, _plan, _forward)


def _forward(op_call: Any, values: dict[str, Any], layout: NormLayout) -> Any:
    x: DTensor = values["input"]
    groups = int(values["group"])
    xl = x.to_local()
    acc = accumulation_dtype(xl.dtype)
    xv = _view(xl, groups).to(acc)
    mean, var = global_moments(xv, layout)
    rstd = torch.rsqrt(var + float(values["eps"]))
    out = (xv - mean) * rstd
    weight, bias = local(values["weight"]), local(values["bias"])
    if weight is not None:
        out = out * _per_channel(weight.to(acc), groups, xv.ndim)
    if bias is not None:
        out = out + _per_channel(bias.to(acc), groups, xv.ndim)
    stat = layout.stat_placements(Replicate())
    n = x.shape[0]
    return (
        wrap(out.reshape(xl.shape).to(xl.dtype), layout, x.placements, x.shape),
        wrap(mean.reshape(mean.shape[:2]), layout, stat, (n, groups)),
        wrap(rstd.reshape(rstd.shape[:2]), layout, stat, (n, groups)),
    )


def backward(op_call: Any, args: tuple, kwargs: dict) -> Any:
    return sharded_or_fallback(op_call, args, kwargs, _plan, _backward)


def _backward(op_call: Any, values: dict[str, Any], layout: NormLayout) -> Any:
    x: DTensor = values["input"]
    groups = int(values["group"])
    grad = laid_out_like(values["grad_out"], x)
    xl = x.to_local()
    acc = accumulation_dtype(xl.dtype)
    xv, dy = _view(xl, groups).to(acc), _view(local(grad), groups).to(acc)
    nd = xv.ndim
    mean, rstd = _per_group(local(values["mean"]), nd), _per_group(local(values["rstd"]), nd)
    xhat = (xv - mean) * rstd
    # per (sample, channel): sums over every rank's rows
    rows = NormLayout(layout.mesh, layout.shape, layout.placements, tuple(range(3, nd)))
    spatial = tuple(range(3, nd))
    sum_dy, sum_dy_xhat = global_sums(
        [dy.sum(spatial, keepdim=True), (dy * xhat).sum(spatial, keepdim=True)], rows
    )
    weight = local(values["weight"])
    w = 1 if weight is None else _per_channel(weight.to(acc), groups, nd)
    mask = list(values["output_mask"])
    grad_input = None
    if mask[0]:
        count = layout.count
        s1 = (w * sum_dy).sum(2, keepdim=True) / count
        s2 = (w * sum_dy_xhat).sum(2, keepdim=True) / count
        gi = rstd * (w * dy - s1 - xhat * s2)
        grad_input = wrap(gi.reshape(xl.shape).to(xl.dtype), layout, x.placements, x.shape)
    param_dtype = weight.dtype if weight is not None else xl.dtype
    grads = []
    for wanted, total in ((mask[1], sum_dy_xhat), (mask[2], sum_dy)):
        grads.append(_over_batch(total, x, param_dtype) if wanted else None)
    return grad_input, grads[0], grads[1]


def _over_batch(total: torch.Tensor, x: DTensor, dtype: torch.dtype) -> DTensor:
    """A per-channel parameter gradient: summed over this rank's samples, then over the
    mesh dims sharding the batch; replicated."""
    per_channel = total.sum(0).reshape(-1)
    batch = NormLayout(
        x.device_mesh,
        (x.shape[0], x.shape[1]),
        tuple(
            p if p.is_shard() and p.dim == 0 else Replicate()  # type: ignore[attr-defined]
            for p in x.placements
        ),
        (0,),
    )
    summed = global_sums([per_channel.reshape(1, -1)], batch)[0].reshape(-1)
    return wrap(summed.to(dtype), batch, [Replicate()] * x.device_mesh.ndim, summed.shape)
