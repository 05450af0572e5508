"""Batch norm in train mode on a channel-sharded input: the running statistics updated.

Torch's sharding strategy computes the output and gradients of a channel-sharded batch
norm right, but it hands the kernel a redistributed copy of the replicated running mean
and variance, so the kernel's in-place update lands in the copy and the module's running
statistics never change (checked on torch 2.11-2.15). Evaluating a model trained so is
silently wrong. Per-channel statistics need nothing from other channels, so each rank runs
the kernel on its own channels, with its slice of the weight, bias and running statistics,
and one all-gather of C numbers per statistic brings every rank the updated vectors.

A batch shard next to the channel one is gathered first (as torch's strategy does, the
batch statistics need every sample); spatial shards are dt-conv's, never taken here.

The backward ops are taken on the same layouts: each rank's channels need only their own
statistics, so the kernel runs on local channels with no communication beyond the batch
gather. Torch 2.11 and 2.12 have no batch-norm backward strategy (DTensor decomposes the
op there, seconds a step); on later releases the result is the same as torch's strategy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# Forward overloads: the argument naming train mode (or whether the op always trains),
# and whether the running statistics are updated in place, returned (functional
# variants, what compiled code reaches) or left alone.
UPDATING = {
    "native_batch_norm.default": ("training", "in_place"),
    "_native_batch_norm_legit.default": ("training", "in_place"),
    "_native_batch_norm_legit_functional.default": ("training", "returned"),
    "_batch_norm_with_update.default": (True, "in_place"),
    "_batch_norm_with_update_functional.default": (True, "returned"),
    "_native_batch_norm_legit_no_training.default": (False, "none"),
    "_batch_norm_no_update.default": (False, "none"),
}

# Backward overloads and their per-channel arguments (sliced to each rank's channels);
# both return (grad_input, grad_weight, grad_bias).
BACKWARD = {
    "native_batch_norm_backward.default": (
        "weight",
        "running_mean",
        "running_var",
        "save_mean",
        "save_invstd",
    ),
    "batch_norm_backward.default": (
        "weight",
        "running_mean",
        "running_var",
        "save_mean",
        "save_var",
    ),
}

BATCH, CHANNELS = 0, 1


def ops(names: Any = None) -> list[Any]:
    """The overloads this torch has, of those in `names` (default: `UPDATING`)."""
    found = []
    for name in UPDATING if names is None else names:
        packet_name, overload = name.split(".")
        packet = getattr(torch.ops.aten, packet_name, None)
        op = getattr(packet, overload, None) if packet is not None else None
        if op is not None:
            found.append(op)
    return found


def takes_for(op: Any) -> Callable[[tuple, dict], bool]:
    """The `takes` of `op`'s handler: running statistics that are replicated DTensors, and
    an input whose only shards are channel (and batch) shards. Eval-mode calls too: torch
    2.11 has no batch-norm strategy, and per channel they need no communication."""

    def takes(args: tuple, kwargs: dict) -> bool:
        from torch.distributed.tensor import DTensor

        from .kit.arguments import bind_arguments

        values = bind_arguments(op, args, kwargs)
        x, running_mean = values["input"], values["running_mean"]
        if not (isinstance(x, DTensor) and isinstance(running_mean, DTensor)):
            return False
        if not all(p.is_replicate() for p in running_mean.placements):
            return False
        return _channel_layout(x)

    return takes


def _channel_layout(x: Any) -> bool:
    """Whether DTensor `x`'s only shards are channel (some) and batch shards, none of the
    channel shards empty."""
    shards = [p for p in x.placements if not p.is_replicate()]
    if not any(p.is_shard(CHANNELS) for p in shards) or not all(
        p.is_shard(CHANNELS) or p.is_shard(BATCH) for p in shards
    ):
        return False
    sizes = zip(x.device_mesh.shape, x.placements, strict=True)
    pieces = [n for n, p in sizes if p.is_shard(CHANNELS)]
    return not _some_shard_empty(x.shape[CHANNELS], pieces)


def backward_takes_for(op: Any) -> Callable[[tuple, dict], bool]:
    """The `takes` of a backward op's handler: the input and its gradient DTensors on a
    channel layout `takes_for` takes, the per-channel arguments DTensors or None."""

    def takes(args: tuple, kwargs: dict) -> bool:
        from torch.distributed.tensor import DTensor

        from .kit.arguments import bind_arguments, op_name

        values = bind_arguments(op, args, kwargs)
        x, grad = values["input"], values["grad_out"]
        if not (isinstance(x, DTensor) and isinstance(grad, DTensor)):
            return False
        if not all(
            values[k] is None or isinstance(values[k], DTensor) for k in BACKWARD[op_name(op)]
        ):
            return False
        same_channels = [p.is_shard(CHANNELS) for p in grad.placements] == [
            p.is_shard(CHANNELS) for p in x.placements
        ]
        return same_channels and _channel_layout(x) and _channel_layout(grad)

    return takes


def handle_backward(op_call: Any, args: tuple, kwargs: dict) -> Any:
    """The backward on each rank's channels: grad_input laid out as the forward's output,
    grad_weight and grad_bias per channel (each rank's channels)."""
    from torch.distributed.tensor import DTensor, Replicate

    from .dtensors import as_dtensor
    from .kit.arguments import bind_arguments, op_name

    values: dict[str, Any] = bind_arguments(op_call, args, kwargs)
    per_channel_args = BACKWARD[op_name(op_call)]
    x: DTensor = values["input"]
    mesh = x.device_mesh
    placements, per_channel = _layouts(x.placements)
    channels = x.shape[CHANNELS]

    def mine(key: str, value: Any) -> Any:
        if not isinstance(value, DTensor):
            return value
        if key in ("input", "grad_out"):
            return value.redistribute(mesh, placements).to_local()
        if key in per_channel_args and value.shape == (channels,):
            return value.redistribute(mesh, per_channel).to_local()
        return value.redistribute(mesh, [Replicate()] * mesh.ndim).to_local()  # empty saves

    grad_input, grad_weight, grad_bias = op_call(*(mine(k, v) for k, v in values.items()))
    return (
        None if grad_input is None else as_dtensor(grad_input, mesh, placements, x.shape),
        *(
            None if t is None else as_dtensor(t, mesh, per_channel, (channels,))
            for t in (grad_weight, grad_bias)
        ),
    )


def _layouts(placements: Any) -> tuple[list[Any], list[Any]]:
    """(the input's placements with the batch gathered, those of a per-channel vector
    sharded like its channels): the layouts both handlers run on."""
    from torch.distributed.tensor import Replicate, Shard

    gathered = [Replicate() if p.is_shard(BATCH) else p for p in placements]
    return gathered, [Shard(0) if p.is_shard(CHANNELS) else Replicate() for p in gathered]


def _some_shard_empty(channels: int, pieces: list[int]) -> bool:
    """Whether splitting `channels` as `Shard` does (torch.chunk's ceil-sized chunks), over
    mesh dims of `pieces` ranks in turn, leaves some rank none. Those calls stay torch's:
    its batch-norm kernels refuse an empty input (forward) or crash on one (backward)."""
    sizes = [channels]
    for n in pieces:
        split = []
        for size in sizes:
            chunk = -(-size // n) if size else 0
            split += [max(0, min(chunk, size - i * chunk)) for i in range(n)]
        sizes = split
    return 0 in sizes


def handle(op_call: Any, args: tuple, kwargs: dict) -> Any:
    """The op on each rank's channels; running statistics gathered and updated."""
    from torch.distributed.tensor import DTensor, Replicate

    # imported here: dt-core activates plugins while torch.distributed.tensor (which
    # dtensors imports) is being imported
    from .dtensors import as_dtensor
    from .kit.arguments import bind_arguments, op_name

    values: dict[str, Any] = bind_arguments(op_call, args, kwargs)
    training_from, update = UPDATING[op_name(op_call)]
    training = values[training_from] if isinstance(training_from, str) else training_from
    x: DTensor = values["input"]
    mesh = x.device_mesh
    # the batch gathered, channels left where they are
    placements, per_channel = _layouts(x.placements)
    if placements != list(x.placements):
        x = x.redistribute(mesh, placements)
    channels = x.shape[CHANNELS]
    whole = [Replicate()] * mesh.ndim

    def mine(value: Any) -> Any:
        if not isinstance(value, DTensor):
            return value
        return value.redistribute(mesh, per_channel).to_local()

    local = {k: mine(v) for k, v in values.items()}
    local["input"] = x.to_local()
    # the kernel's in-place update must land in tensors of this handler's own
    local["running_mean"] = local["running_mean"].clone()
    local["running_var"] = local["running_var"].clone()
    results = op_call(*local.values())

    def saved(t: torch.Tensor) -> DTensor:
        """A saved statistic: this rank's channels, or empty (eval mode saves nothing)."""
        if training:
            return as_dtensor(t, mesh, per_channel, (channels,))
        return as_dtensor(t, mesh, whole, t.shape)

    wrapped: list[Any] = [as_dtensor(results[0], mesh, placements, x.shape)]
    wrapped += [saved(results[1]), saved(results[2])]
    if op_name(op_call).startswith("_batch_norm_"):  # the reserve (empty on CPU)
        wrapped.append(as_dtensor(results[3], mesh, whole, results[3].shape))
    if update == "none" or (update == "in_place" and not training):
        return tuple(wrapped)
    if update == "in_place":
        new_mean, new_var = local["running_mean"], local["running_var"]
    else:
        new_mean, new_var = results[-2], results[-1]
    gathered = [
        as_dtensor(t, mesh, per_channel, (channels,)).redistribute(mesh, whole)
        for t in (new_mean, new_var)
    ]
    if update == "in_place":
        with torch.no_grad():
            values["running_mean"].copy_(gathered[0])
            values["running_var"].copy_(gathered[1])
    else:
        wrapped += gathered
    return tuple(wrapped)
