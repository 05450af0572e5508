"""Channel-sharded convolutions: which ranks own which filters, and what that makes.

Three layouts avoid gathering the weight (one mesh dim `m`):

- **out**: the weight is `Shard(0)` on `m` and the input is replicated there. Each rank
  convolves with its own filters, so the output is `Shard(1)` on `m`. In backward the
  input gradient is a partial sum over `m` (every rank's filters read the whole input)
  and is summed; weight and bias gradients come back sharded like the weight.
- **in**: the input is `Shard(1)` on `m` (tensor-parallel style channel split) and the
  weight is `Shard(1)` or replicated there. Each rank convolves its channels with the
  matching slice of every filter, so the output is a sum over `m`: `Partial()`. The bias
  is added by the first rank of `m` only. In backward the output gradient is replicated
  over `m`; the input gradient is `Shard(1)` and the weight gradient is the local slice
  (gathered only if the weight was replicated), with no reduction over `m`.
- **group**: a grouped conv (depthwise included) on an input `Shard(1)` on `m` where every
  rank's channels are whole groups and the weight's `Shard(0)` chunks (or slices of a
  replicated weight) are exactly those groups' filters. Each rank runs its own groups;
  the output stays `Shard(1)` on `m` and nothing is exchanged over `m`, either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from dt_core.dtensors import as_dtensor
from dt_core.kit import replicated, reshard_like
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard

from ... import ranks
from ...engine.geometry import chunk_range


@dataclass(frozen=True)
class ChannelLayout:
    kind: Literal["none", "out", "in", "group"] = "none"
    mesh_dim: int = -1
    per_in: int = 1  # input channels per group (group layout)

    @property
    def splits_input(self) -> bool:
        """Whether this layout handles the input's channel sharding (no gather there)."""
        return self.kind in ("in", "group")


NONE = ChannelLayout()


def channel_layout(x: DTensor, weight: Any, bias: Any, groups: int) -> ChannelLayout:
    """The layout this call can use, decided from placements only (all ranks agree)."""
    if not isinstance(x, DTensor):
        return NONE
    if groups != 1:
        return _group_layout(x, weight, groups)
    m = _in_channel_mesh_dim(x, weight)
    if m is not None:
        return ChannelLayout("in", m)
    m = _out_channel_mesh_dim(x, weight, bias)
    return NONE if m is None else ChannelLayout("out", m)


def _only_sharded_mesh_dim(t: DTensor) -> int | None:
    sharded = [m for m, p in enumerate(t.placements) if not isinstance(p, Replicate)]
    return sharded[0] if len(sharded) == 1 else None


def _out_channel_mesh_dim(x: DTensor, weight: Any, bias: Any) -> int | None:
    if not isinstance(weight, DTensor) or weight.device_mesh != x.device_mesh:
        return None
    m = _only_sharded_mesh_dim(weight)
    if m is None:
        return None
    p = weight.placements[m]
    if type(p) is not Shard or p.dim != 0 or not isinstance(x.placements[m], Replicate):
        return None
    if bias is not None and (not isinstance(bias, DTensor) or bias.device_mesh != x.device_mesh):
        return None
    return m


def _channel_mesh_dim(x: DTensor) -> int | None:
    channel = [m for m, p in enumerate(x.placements) if type(p) is Shard and p.dim % x.ndim == 1]
    return channel[0] if len(channel) == 1 else None


def _sharded_only_on(t: Any, x: DTensor, m: int, dim: int) -> bool:
    """`t` is plain, or on x's mesh replicated except possibly `Shard(dim)` on mesh dim m."""
    if not isinstance(t, DTensor):
        return True
    if t.device_mesh != x.device_mesh:
        return False
    return all(
        isinstance(p, Replicate) or (i == m and type(p) is Shard and p.dim == dim)
        for i, p in enumerate(t.placements)
    )


def _in_channel_mesh_dim(x: DTensor, weight: Any) -> int | None:
    m = _channel_mesh_dim(x)
    if m is None or not _sharded_only_on(weight, x, m, 1):
        return None
    return m


def _group_layout(x: DTensor, weight: Any, groups: int) -> ChannelLayout:
    m = _channel_mesh_dim(x)
    if m is None or not _sharded_only_on(weight, x, m, 0):
        return NONE
    parts, cin, cout = x.device_mesh.size(m), x.shape[1], weight.shape[0]
    per_in, per_out = cin // groups, cout // groups
    if per_in == 0 or per_out == 0:
        return NONE
    for r in range(parts):  # every rank's channels must be whole groups, filters aligned
        a, b = chunk_range(cin, parts, r)
        c, d = chunk_range(cout, parts, r)
        if a % per_in or b % per_in or (c, d) != (a // per_in * per_out, b // per_in * per_out):
            return NONE
    return ChannelLayout("group", m, per_in)


def local_groups(layout: ChannelLayout, groups: int, x: DTensor) -> int:
    """The local conv's groups: this rank's whole groups in the group layout (a per-rank
    integer under LocalTensorMode, where chunks are uneven), else the call's."""
    if layout.kind != "group":
        return groups
    return ranks.each_rank(x.device_mesh, _own_groups, layout, x)


def _own_groups(layout: ChannelLayout, x: DTensor) -> int:
    a, b = chunk_range(x.shape[1], x.device_mesh.size(layout.mesh_dim), _coord(x, layout))
    return (b - a) // layout.per_in


def local_weight(layout: ChannelLayout, weight: Any, x: DTensor) -> torch.Tensor:
    """This rank's filters (out, group), filter slices (in), or the whole weight."""
    if layout.kind == "none":
        return replicated(weight)
    if isinstance(weight, DTensor) and isinstance(weight.placements[layout.mesh_dim], Shard):
        return weight.to_local()
    dim = 1 if layout.kind == "in" else 0
    return ranks.each_rank(x.device_mesh, _own_chunk, replicated(weight), dim, x, layout)


def local_bias(layout: ChannelLayout, bias: Any, weight: Any, x: DTensor) -> torch.Tensor | None:
    """The bias this rank adds: its filters' (out), the first rank's only (in), or all."""
    if bias is None:
        return None
    full = replicated(bias)
    if layout.kind in ("out", "group"):
        return ranks.each_rank(x.device_mesh, _own_chunk, full, 0, x, layout)
    if layout.kind == "in":
        if ranks.simulated():  # ranks cannot differ in None-ness there: zeros off the first
            return ranks.each_rank(x.device_mesh, _first_only, full, x, layout)
        return full if _coord(x, layout) == 0 else None
    return full


def _own_chunk(full: torch.Tensor, dim: int, x: DTensor, layout: ChannelLayout) -> torch.Tensor:
    """This rank's chunk of a full weight or bias along `dim` (per-rank code)."""
    lo, hi = chunk_range(full.shape[dim], x.device_mesh.size(layout.mesh_dim), _coord(x, layout))
    return full.narrow(dim, lo, hi - lo)


def _first_only(full: torch.Tensor, x: DTensor, layout: ChannelLayout) -> torch.Tensor:
    return full if _coord(x, layout) == 0 else torch.zeros_like(full)


def output_placements(layout: ChannelLayout, placements: tuple[Placement, ...]) -> list[Placement]:
    out = list(placements)
    if layout.kind in ("out", "group"):
        out[layout.mesh_dim] = Shard(1)
    elif layout.kind == "in":
        out[layout.mesh_dim] = Partial()
    return out


def grad_output_placements(
    layout: ChannelLayout, placements: tuple[Placement, ...]
) -> list[Placement]:
    """Where backward wants the output gradient (a Partial output's gradient is replicated)."""
    out = output_placements(layout, placements)
    if layout.kind == "in":
        out[layout.mesh_dim] = Replicate()
    return out


def weight_gradient(
    layout: ChannelLayout, gw: torch.Tensor, weight: Any, x: DTensor
) -> torch.Tensor:
    """The weight gradient (already summed over the other mesh dims) shaped like the weight."""
    mesh = x.device_mesh
    if layout.kind == "none":
        return reshard_like(gw, mesh, weight)
    dim = 1 if layout.kind == "in" else 0
    return _from_chunks(gw, dim, weight.shape, weight, layout, x)


def bias_gradient(
    layout: ChannelLayout, gb: torch.Tensor, bias_sizes: Any, weight: Any, x: DTensor
) -> torch.Tensor:
    """The bias gradient (already summed over the other mesh dims), placed like the weight's
    filters (backward never sees the bias itself)."""
    mesh = x.device_mesh
    if layout.kind in ("none", "in"):
        return as_dtensor(gb, mesh, [Replicate()] * mesh.ndim, bias_sizes)
    return _from_chunks(gb, 0, bias_sizes, weight, layout, x)


def _from_chunks(
    local: torch.Tensor, dim: int, shape: Any, like: Any, layout: ChannelLayout, x: DTensor
) -> torch.Tensor:
    """A gradient held as this rank's chunk along `dim`, in the placements of `like`."""
    mesh = x.device_mesh
    placements: list[Placement] = [Replicate()] * mesh.ndim
    placements[layout.mesh_dim] = Shard(dim)
    chunked = as_dtensor(local, mesh, placements, shape)
    if not isinstance(like, DTensor):
        return chunked.full_tensor()
    # the layouts allow `like` (the weight) only Replicate, or Shard(dim) on the mesh dim
    return chunked.redistribute(mesh, like.placements)


def _coord(x: DTensor, layout: ChannelLayout) -> int:
    return ranks.local_rank(x.device_mesh, layout.mesh_dim)
