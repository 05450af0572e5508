"""Batch norm (and instance norm, which torch runs as a batch norm of one sample) on
spatially sharded inputs, every aten variant eager and compiled code reaches.

Train mode: per-channel mean and variance over the batch and every rank's rows
(`moments.global_moments`), the output through torch's own kernel with those statistics,
the running statistics updated as one process would (unbiased variance from the global
count). Eval mode: the running statistics, no communication. Backward: the two per-channel
sums (of the gradient, and of the gradient times the normalized input) are global, one
all-reduce; the weight and bias gradients are those sums, replicated.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from dt_core.dtensors import as_dtensor
from dt_core.kit import op_name
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard

from .common import laid_out_like, local, replicated_like, sharded_or_fallback, shards_spatial, wrap
from .layout import NormLayout, norm_layout
from .moments import accumulation_dtype, global_moments, global_sums

aten = torch.ops.aten

# forward overloads: (train mode: the argument naming it, or fixed; how the running
# statistics change: "in_place", "returned" (functional variants) or "none"; whether a
# reserve tensor is returned too)
FORWARD = {
    "native_batch_norm.default": ("training", "in_place", 0),
    "_native_batch_norm_legit.default": ("training", "in_place", 0),
    "_native_batch_norm_legit.no_stats": ("training", "none", 0),
    "_native_batch_norm_legit_functional.default": ("training", "returned", 0),
    "_native_batch_norm_legit_no_training.default": (False, "none", 0),
    "_batch_norm_with_update.default": (True, "in_place", 1),
    "_batch_norm_with_update_functional.default": (True, "returned", 1),
    "_batch_norm_no_update.default": (False, "none", 1),
}


def takes_forward(args: tuple, kwargs: dict) -> bool:
    """The calls dt-conv takes: the input has a spatial dim sharded."""
    return bool(args) and shards_spatial(args[0])


def takes_backward(args: tuple, kwargs: dict) -> bool:
    """The backward calls dt-conv takes: the forward's input has a spatial dim sharded."""
    return len(args) > 1 and shards_spatial(args[1])


def _layout(x: DTensor) -> NormLayout:
    reduced = [d for d in range(x.ndim) if d != 1]
    return norm_layout(x.device_mesh, x.shape, x.placements, reduced)


def _channel_placements(layout: NormLayout) -> list[Placement]:
    """A per-channel vector's placements: sharded where the input's channels are (an
    instance norm of a batch-sharded input, whose batch became channels), else replicated."""
    return [
        Shard(0) if isinstance(p, Shard) and p.dim == 1 else Replicate() for p in layout.placements
    ]


def _my_channels(value: Any, layout: NormLayout) -> Any:
    """This rank's channels of a replicated per-channel vector (a slice, no communication)."""
    if not isinstance(value, DTensor):
        return value
    return value.redistribute(layout.mesh, _channel_placements(layout)).to_local()


def _per_channel_result(t: torch.Tensor, layout: NormLayout) -> DTensor:
    """This rank's channels of a per-channel result, as a DTensor sharded like them."""
    return as_dtensor(t, layout.mesh, _channel_placements(layout), (layout.shape[1],))


def _all_channels(t: torch.Tensor, layout: NormLayout) -> torch.Tensor:
    """Every channel of a per-channel result (gathered over the mesh dims sharding them)."""
    if all(isinstance(p, Replicate) for p in _channel_placements(layout)):
        return t
    whole = [Replicate()] * layout.mesh.ndim
    return _per_channel_result(t, layout).redistribute(layout.mesh, whole).to_local()


def _channels(t: torch.Tensor, ndim: int) -> torch.Tensor:
    """A per-channel vector shaped to broadcast against an (N, C, *spatial) tensor."""
    return t.reshape(1, -1, *([1] * (ndim - 2)))


def _plan(values: dict[str, Any]) -> NormLayout:
    return _layout(values["input"])


def forward(op_call: Any, args: tuple, kwargs: dict) -> Any:
    return sharded_or_fallback(op_call, args, kwargs, _plan, _forward)


def _forward(op_call: Any, values: dict[str, Any], layout: NormLayout) -> Any:
    x: DTensor = values["input"]
    training_from, update, extra = FORWARD[op_name(op_call)]
    training = bool(values[training_from]) if isinstance(training_from, str) else training_from
    weight, bias = _my_channels(values["weight"], layout), _my_channels(values["bias"], layout)
    running_mean, running_var = local(values.get("running_mean")), local(values.get("running_var"))
    eps, momentum = float(values["eps"]), values["momentum"]
    xl = x.to_local()
    acc = accumulation_dtype(xl.dtype)
    if training or running_mean is None:
        mean, var = global_moments(xl, layout)
        mean, var = mean.reshape(-1), var.reshape(-1)
    else:
        mean = _my_channels(values["running_mean"], layout).to(acc)
        var = _my_channels(values["running_var"], layout).to(acc)
    out = F.batch_norm(xl, mean, var, weight, bias, training=False, eps=eps)
    results: list[Any] = [wrap(out, layout)]
    if training:
        invstd = torch.rsqrt(var + eps)
        results += [_per_channel_result(mean, layout), _per_channel_result(invstd, layout)]
    else:  # eval mode saves nothing, as torch's kernels
        empty = xl.new_empty((0,), dtype=acc)
        results += [replicated_like(empty, layout), replicated_like(empty.clone(), layout)]
    if extra:
        results.append(replicated_like(xl.new_empty((0,), dtype=torch.uint8), layout))
    if training and running_mean is not None and update != "none":
        count = layout.count
        unbiased = _all_channels(var, layout) * (count / max(count - 1, 1))
        batch_mean = _all_channels(mean, layout).to(running_mean.dtype)
        new_mean = (1 - momentum) * running_mean + momentum * batch_mean
        new_var = (1 - momentum) * running_var + momentum * unbiased.to(running_var.dtype)
        if update == "in_place":
            with torch.no_grad():
                running_mean.copy_(new_mean)
                running_var.copy_(new_var)
        else:
            results += [replicated_like(new_mean, layout), replicated_like(new_var, layout)]
    elif update == "returned":  # new tensors, never the inputs (functional ops)
        results += [values["running_mean"].clone(), values["running_var"].clone()]
    return tuple(results)


def backward(op_call: Any, args: tuple, kwargs: dict) -> Any:
    return sharded_or_fallback(op_call, args, kwargs, _plan, _backward)


def _backward(op_call: Any, values: dict[str, Any], layout: NormLayout) -> Any:
    x: DTensor = values["input"]
    grad = laid_out_like(values["grad_out"], x)
    dy, xl = local(grad), x.to_local()
    acc = accumulation_dtype(xl.dtype)
    train = bool(values["train"] if "train" in values else values["update"])
    eps = float(values["eps"])
    weight = _my_channels(values["weight"], layout)
    mask = list(values["output_mask"])
    if train:
        mean = _my_channels(values["save_mean"], layout)
        invstd = _my_channels(
            values["save_invstd"] if "save_invstd" in values else values["save_var"], layout
        )
    else:
        mean = _my_channels(values["running_mean"], layout).to(acc)
        invstd = torch.rsqrt(_my_channels(values["running_var"], layout).to(acc) + eps)
    nd = xl.ndim
    dy_acc = dy.to(acc)
    xhat = (xl.to(acc) - _channels(mean, nd)) * _channels(invstd, nd)
    reduced = layout.reduced
    sum_dy, sum_dy_xhat = global_sums(
        [dy_acc.sum(reduced, keepdim=True), (dy_acc * xhat).sum(reduced, keepdim=True)], layout
    )
    scale = _channels(invstd, nd) if weight is None else _channels(invstd * weight.to(acc), nd)
    grad_input = None
    if mask[0]:
        if train:
            count = layout.count
            gi = scale * (dy_acc - sum_dy / count - xhat * (sum_dy_xhat / count))
        else:
            gi = scale * dy_acc
        grad_input = wrap(gi.to(xl.dtype), layout)
    param_dtype = weight.dtype if weight is not None else xl.dtype
    grad_weight = (
        replicated_like(_all_channels(sum_dy_xhat.reshape(-1), layout).to(param_dtype), layout)
        if mask[1]
        else None
    )
    grad_bias = (
        replicated_like(_all_channels(sum_dy.reshape(-1), layout).to(param_dtype), layout)
        if mask[2]
        else None
    )
    return grad_input, grad_weight, grad_bias
