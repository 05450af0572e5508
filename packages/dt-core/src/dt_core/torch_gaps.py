"""The built-in `torch-gaps` plugin: what an older torch of the window lacks and a newer
one has, filled in as the newer one does, and only where this torch lacks it.

Listed by `dt-plugins list` like any plugin and installed through the same path, so
`deactivate()` takes it out again. On a torch that has every piece (2.13 on) it
contributes only what no torch of the window registers (PReLU's, below); on 2.11 and
2.12 it fills what the plugins would otherwise miss.
Each piece is found by looking at torch's tables, never by version number:

- a sharding strategy for `aten.detach_` (torch has one from 2.13 on): on 2.11 and 2.12
  an autograd Function applied inside a DTensor op handler, such as `redistribute` of a
  weight that requires grad, detaches its output in place, and DTensor refused it
  ("aten.detach_.default does not have a sharding strategy registered");
- sharding strategies for interpolation and its backward (torch has them from 2.13 on,
  2.12 only for the forward ops, 2.11 for a few): the forward ops work on the spatial
  dims, so a batch or channel shard passes through; being linear, forward and backward
  keep a pending sum. A backward op's arguments name the input's whole size, which a
  shard's local call would contradict, so its shards are gathered first. dt-conv's halo
  path covers shards of the spatial dims; these cover the rest, which torch computes.
- sharding strategies for pooling (torch has them from 2.12 on, 2.11 none): the same
  rules for the dims before the pooled ones; a pending sum passes the linear ones.
- a sharding strategy for `aten.flip` (torch has one from 2.12 on), which `cumsum`'s
  backward calls: shards of the dims it does not flip stay, a pending sum passes.
- `constant_pad_nd`'s strategy again, where torch registers it without a cache key
  (2.11): DTensor then gives a second pad of the same input the first pad's shape.

And what no torch of the window registers:

- sharding strategies for PReLU (MONAI's default activation), `aten._prelu_kernel` and
  its backward: element-wise, so any shard of the input stays, the weight sliced along
  the dim it spans (channels) or replicated where it broadcasts; the backward is linear
  in the gradient, so a pending sum passes. Torch alone raises in the backward ("no
  sharding strategy"). For the forward it derives a strategy from the op's
  decomposition, which on 2.11 refuses every shard the weight's reshape meets and so
  gathers the whole activation without a word (2.12 on keep the shard); one explicit
  strategy gives every torch of the window the same answer.

And where torch alone is silently wrong:

- batch norm in train mode on a channel-sharded input leaves the module's running
  statistics unchanged (torch updates a redistributed copy): an op handler that takes
  those calls, and only those, runs each rank's channels and gathers the updated
  statistics (`channel_batch_norm`), and the backward on the same layouts (torch 2.11
  and 2.12 have no strategy for it). It shares the ops with plugins' handlers for other
  placements (dt-conv takes the spatially sharded calls).
"""

from __future__ import annotations

from typing import Any

from .contributions import OpHandler, ShardingStrategy
from .hookspecs import hookimpl

DT_API = ">=1.0,<2"

# Every interpolation op torch 2.13 gives a batch / channel / pending-sum strategy.
INTERPOLATION_OPS = tuple(
    f"{name}{suffix}"
    for name in (
        "upsample_nearest1d",
        "upsample_nearest2d",
        "upsample_nearest3d",
        "_upsample_nearest_exact1d",
        "_upsample_nearest_exact2d",
        "_upsample_nearest_exact3d",
        "_upsample_bilinear2d_aa",
        "_upsample_bicubic2d_aa",
        "upsample_bicubic2d",
        "upsample_bilinear2d",
        "upsample_linear1d",
        "upsample_trilinear3d",
    )
    for suffix in ("", "_backward")
)


# Pooling ops torch 2.12 gives strategies, and whether each is linear (a pending sum
# passes through). Backward ops take the gradient first; their other tensors are the
# forward's input (and indices), which a pending-sum gradient needs whole.
POOL_OPS = {
    "max_pool1d_with_indices": False,
    "max_pool2d_with_indices": False,
    "max_pool3d_with_indices": False,
    "max_pool2d_with_indices_backward": True,
    "avg_pool1d": True,
    "avg_pool2d": True,
    "avg_pool3d": True,
    "adaptive_avg_pool1d": True,
    "_adaptive_avg_pool2d": True,
    "_adaptive_avg_pool2d_backward": True,
    "_adaptive_avg_pool3d": True,
    "adaptive_max_pool1d": False,
    "adaptive_max_pool2d": False,
    "adaptive_max_pool3d": False,
}


def _same_layout_in_and_out(args: tuple, layouts: list[Any]) -> list[tuple[list, list]]:
    """For each of `layouts`: the first argument (the tensor in) and the tensor out laid
    out so, the other arguments (sizes, scales) not tensors."""
    rest = [None] * (len(args) - 1)
    return [([p], [p, *rest]) for p in layouts]


def interpolation_placements(*args: Any, **kwargs: Any) -> list[tuple[list, list]]:
    """One mesh dim of an interpolation op: in and out share a batch or channel shard, a
    pending sum or average, or are replicated."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    layouts = [Shard(0), Shard(1), Partial("sum"), Partial("avg"), Replicate()]
    return _same_layout_in_and_out(args, layouts)


def interpolation_backward_placements(*args: Any, **kwargs: Any) -> list[tuple[list, list]]:
    """One mesh dim of an interpolation backward op: its size arguments are global, so
    only layouts whose local shape is the global one (replicated, a pending sum)."""
    from torch.distributed.tensor import Partial, Replicate

    return _same_layout_in_and_out(args, [Partial("sum"), Partial("avg"), Replicate()])


def _is_spec(arg: object) -> bool:
    return hasattr(arg, "placements") and hasattr(arg, "ndim")


def pool_placements(pooled_dims: int, outputs: int, linear: bool) -> Any:
    """The placements function of a pooling op that pools the last `pooled_dims` dims and
    returns `outputs` tensors: every tensor shards a dim before the pooled ones alike, or
    is replicated; for a linear op the first tensor (input or gradient) may also be a
    pending sum, the others (a backward's forward input, indices) replicated."""

    def placements(*args: Any, **kwargs: Any) -> list[tuple[list, list]]:
        from torch.distributed.tensor import Partial, Replicate, Shard

        tensors = [i for i, arg in enumerate(args) if _is_spec(arg)]
        ndim = args[tensors[0]].ndim

        def layout(first: Any, rest: Any, out: Any) -> tuple[list, list]:
            inputs = [None] * len(args)
            for i in tensors:
                inputs[i] = first if i == tensors[0] else rest
            return [out] * outputs, inputs

        found = [layout(Shard(d), Shard(d), Shard(d)) for d in range(ndim - pooled_dims)]
        found.append(layout(Replicate(), Replicate(), Replicate()))
        if linear:
            found += [layout(p, Replicate(), p) for p in (Partial("sum"), Partial("avg"))]
        return found

    return placements


def constant_pad_placements(*args: Any, **kwargs: Any) -> list[tuple[list, list]]:
    """`constant_pad_nd(input, pad, value)`: a shard of an unpadded dim stays; a pending
    sum stays through a zero pad (padding with 0 commutes with the sum)."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    spec, pad = args[0], args[1]
    value = args[2] if len(args) > 2 else kwargs.get("value", 0)
    rest = [None] * (len(args) - 1)
    layouts: list[Any] = [Shard(d) for d in range(spec.ndim - len(pad) // 2)]
    layouts.append(Replicate())
    if value == 0:
        layouts.append(Partial("sum"))
    return [([p], [p, *rest]) for p in layouts]


def flip_placements(*args: Any, **kwargs: Any) -> list[tuple[list, list]]:
    """`flip(input, dims)`: a shard of a dim not flipped stays; flipping is linear."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    spec, dims = args[0], args[1] if len(args) > 1 else kwargs["dims"]
    flipped = {d % spec.ndim for d in dims}
    layouts: list[Any] = [Shard(d) for d in range(spec.ndim) if d not in flipped]
    layouts += [Replicate(), Partial("sum"), Partial("avg")]
    return [([p], [p, None]) for p in layouts]


def _prelu_weight_layout(x: Any, weight: Any, d: int) -> Any:
    """The weight's placement beside an input sharded along `d`: sharded alike along a
    dim it spans (the channels), replicated along one it broadcasts on. The weight comes
    shaped to broadcast from the right (`(C, 1, 1)` beside `(N, C, H, W)`)."""
    from torch.distributed.tensor import Replicate, Shard

    wd = d - (x.ndim - weight.ndim)
    spans = wd >= 0 and weight.shape[wd] == x.shape[d] and x.shape[d] != 1
    return Shard(wd) if spans else Replicate()


def prelu_placements(*args: Any, **kwargs: Any) -> list[tuple[list, list]]:
    """`_prelu_kernel(input, weight)`: element-wise, so a shard of any input dim stays on
    the output, the weight laid out as `_prelu_weight_layout` says; not linear, so a
    pending sum is reduced first."""
    from torch.distributed.tensor import Replicate, Shard

    x, weight = args[0], args[1]
    layouts: list[tuple[list, list]] = [
        ([Shard(d)], [Shard(d), _prelu_weight_layout(x, weight, d)]) for d in range(x.ndim)
    ]
    layouts.append(([Replicate()], [Replicate(), Replicate()]))
    return layouts


def prelu_backward_placements(*args: Any, **kwargs: Any) -> list[tuple[list, list]]:
    """`_prelu_kernel_backward(grad, input, weight) -> (grad_input, grad_weight)`, both
    outputs shaped like the input: a shard of any input dim stays on the gradient, the
    input and both outputs; the weight is sharded alike along a dim it spans, replicated
    along one it broadcasts on; a pending-sum gradient passes (both outputs are linear in
    it) with input and weight replicated."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    x, weight = args[1], args[2]
    layouts: list[tuple[list, list]] = []
    for d in range(x.ndim):
        w = _prelu_weight_layout(x, weight, d)
        layouts.append(([Shard(d), Shard(d)], [Shard(d), Shard(d), w]))
    layouts.append(([Replicate(), Replicate()], [Replicate(), Replicate(), Replicate()]))
    for p in (Partial("sum"), Partial("avg")):
        layouts.append(([p, p], [p, Replicate(), Replicate()]))
    return layouts


def _pooled_dims(name: str) -> int:
    return next(n for n in (1, 2, 3) if f"{n}d" in name)


@hookimpl
def dt_sharding_strategies() -> list[ShardingStrategy]:
    import torch

    from .compat import sharding_rules

    gaps = sharding_rules.missing_identity_strategies()
    for name in INTERPOLATION_OPS:
        packet = getattr(torch.ops.aten, name, None)
        op = getattr(packet, "default", None)
        if op is not None and not sharding_rules.has_sharding_entry(op):
            backward = name.endswith("_backward")
            placements = interpolation_backward_placements if backward else interpolation_placements
            gaps.append(ShardingStrategy(op, placements, kind="placements"))
    for name, linear in POOL_OPS.items():
        op = getattr(getattr(torch.ops.aten, name, None), "default", None)
        if op is not None and not sharding_rules.has_sharding_entry(op):
            outputs = len(op._schema.returns)
            pool = pool_placements(_pooled_dims(name), outputs, linear)
            gaps.append(ShardingStrategy(op, pool, kind="placements"))
    flip = torch.ops.aten.flip.default
    if not sharding_rules.has_sharding_entry(flip):
        gaps.append(ShardingStrategy(flip, flip_placements, kind="placements"))
    prelu = {
        torch.ops.aten._prelu_kernel.default: prelu_placements,
        torch.ops.aten._prelu_kernel_backward.default: prelu_backward_placements,
    }
    for op, placements in prelu.items():
        if not sharding_rules.has_sharding_entry(op):
            gaps.append(ShardingStrategy(op, placements, kind="placements"))
    pad = torch.ops.aten.constant_pad_nd.default
    if sharding_rules.lacks_cache_key(pad):
        gaps.append(ShardingStrategy(pad, constant_pad_placements, kind="placements"))
    return gaps


@hookimpl
def dt_op_handlers() -> list[OpHandler]:
    from . import channel_batch_norm

    forward = [
        OpHandler(op, channel_batch_norm.handle, takes=channel_batch_norm.takes_for(op))
        for op in channel_batch_norm.ops()
    ]
    backward = [
        OpHandler(
            op,
            channel_batch_norm.handle_backward,
            takes=channel_batch_norm.backward_takes_for(op),
        )
        for op in channel_batch_norm.ops(channel_batch_norm.BACKWARD)
    ]
    return forward + backward
