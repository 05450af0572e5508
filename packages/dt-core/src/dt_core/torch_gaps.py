"""The built-in `torch-gaps` plugin: what an older torch of the window lacks and a newer
one has, filled in as the newer one does, and only where this torch lacks it.

Listed by `dt-plugins list` like any plugin and installed through the same path, so
`deactivate()` takes it out again. On a torch that has every piece (2.13 on, the
supported window) it contributes nothing; on 2.11 and 2.12, which the plugins run on
only with DT_PLUGINS_ALLOW_UNTESTED_TORCH=1, it fills what they would otherwise miss.
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
"""

from __future__ import annotations

from typing import Any

from .contributions import ShardingStrategy
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
    return gaps
