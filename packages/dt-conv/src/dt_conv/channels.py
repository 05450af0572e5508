"""Output-channel-sharded weights: each rank convolves with its own filters.

With the weight `Shard(0)` on a mesh dim over which the input is replicated, a rank
computes only its output channels, so the output is `Shard(1)` on that mesh dim and no
weight is gathered. In backward the input gradient is a partial sum over that mesh dim
(each rank's filters contribute) and is summed; weight and bias gradients come back
sharded like the weight (backward cannot see the bias's own placements).
"""

from __future__ import annotations

from typing import Any

from torch.distributed.tensor import DTensor, Placement, Replicate, Shard


def out_channel_mesh_dim(x: DTensor, weight: Any, bias: Any, groups: int) -> int | None:
    """The mesh dim sharding the weight's output channels, if this layout applies."""
    if groups != 1 or not isinstance(weight, DTensor) or weight.device_mesh != x.device_mesh:
        return None
    sharded = [m for m, p in enumerate(weight.placements) if not isinstance(p, Replicate)]
    if len(sharded) != 1:
        return None
    m = sharded[0]
    p = weight.placements[m]
    if type(p) is not Shard or p.dim != 0 or not isinstance(x.placements[m], Replicate):
        return None
    if bias is not None and (not isinstance(bias, DTensor) or bias.device_mesh != x.device_mesh):
        return None
    return m


def local_bias(bias: Any, weight: DTensor) -> Any:
    """This rank's slice of the bias, laid out like the weight's output channels."""
    if bias is None:
        return None
    return bias.redistribute(weight.device_mesh, weight.placements).to_local()


def output_placements(placements: tuple[Placement, ...], m: int | None) -> list[Placement]:
    out = list(placements)
    if m is not None:
        out[m] = Shard(1)
    return out
