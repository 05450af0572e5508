"""Decide, from global metadata only, whether a convolution can run sharded exactly.

The decision must be identical on every rank (a rank that falls back alone would leave
its peers waiting in a halo exchange), so it reads shapes and placements, never local
data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard

from .geometry import DimSplit, conv_out_size, expand


@dataclass(frozen=True)
class ConvPlan:
    """How a supported sharded convolution runs: which dims exchange halos."""

    mesh: DeviceMesh
    placements: tuple[Placement, ...]
    splits: tuple[DimSplit, ...]  # spatial dims sharded, in halo-exchange order
    batch_mesh_dims: tuple[int, ...]  # mesh dims sharding the batch dim
    local_padding: list[int]  # conv padding with 0 on the sharded dims
    stride: list[int]
    dilation: list[int]
    out_shape: tuple[int, ...]  # global output shape

    @property
    def reduce_mesh_dims(self) -> tuple[int, ...]:
        """Mesh dims over which weight/bias gradients are partial sums."""
        return tuple(sorted(self.batch_mesh_dims + tuple(s.mesh_dim for s in self.splits)))


def make_plan(
    x: object,
    weight_shape: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
) -> ConvPlan | str:
    """A `ConvPlan`, or the reason the sharded path cannot be exact for this call."""
    if not isinstance(x, DTensor):
        return "input is not a DTensor"
    if transposed:
        return "transposed convolution"
    nspatial = len(weight_shape) - 2
    if x.ndim != nspatial + 2:
        return "unbatched input"
    stride, padding = expand(stride, nspatial), expand(padding, nspatial)
    dilation = expand(dilation, nspatial)
    splits: list[DimSplit] = []
    batch: list[int] = []
    seen: set[int] = set()
    mesh = x.device_mesh
    for mesh_dim, p in enumerate(x.placements):
        if isinstance(p, Replicate):
            continue
        if isinstance(p, Partial):
            return f"Partial (unreduced) input on mesh dim {mesh_dim}"
        if type(p) is not Shard:
            return f"input placement {p} on mesh dim {mesh_dim}"
        dim = p.dim % x.ndim
        if dim == 1:
            return "input sharded on the channel dim"
        if dim in seen:
            return f"input dim {dim} sharded over several mesh dims"
        seen.add(dim)
        if dim == 0:
            batch.append(mesh_dim)
            continue
        i = dim - 2
        splits.append(
            DimSplit(
                dim,
                mesh_dim,
                mesh.size(mesh_dim),
                x.shape[dim],
                weight_shape[dim],
                stride[i],
                padding[i],
                dilation[i],
            )
        )
    out_spatial = [
        conv_out_size(x.shape[d + 2], weight_shape[d + 2], stride[d], padding[d], dilation[d])
        for d in range(nspatial)
    ]
    if min(out_spatial) < 1:
        return "empty convolution output"
    local_padding = list(padding)
    for s in splits:
        local_padding[s.dim - 2] = 0
    return ConvPlan(
        mesh,
        tuple(x.placements),
        tuple(splits),
        tuple(batch),
        local_padding,
        stride,
        dilation,
        (x.shape[0], weight_shape[0], *out_spatial),
    )
