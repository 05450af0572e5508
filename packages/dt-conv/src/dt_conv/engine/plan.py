"""Decide, from global metadata only, whether a spatial op can run sharded exactly.

Every op's plan starts here (`plan_spatial`): which dims its window slides along and
exchange halos, which pass through sharded; an op family adds its own arguments on top
(`ops.conv.plan`, `ops.transposed.plan`).

The decision must be identical on every rank (a rank that falls back alone would leave
its peers waiting in a halo exchange), so it reads shapes and placements, never local
data. A call it cannot plan raises `Unsupported`, whose reason its handler's fallback
warns with.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from dt_core.kit import Unsupported
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard

from .. import ranks
from .geometry import DimSplit

# For a tensor dim the op works along: (mesh_dim, parts) -> how that dim splits.
Splitter = Callable[[int, int], DimSplit]


@dataclass(frozen=True)
class SpatialPlan:
    """How a supported sharded op runs: which dims exchange halos, which pass through."""

    mesh: DeviceMesh
    placements: tuple[Placement, ...]
    splits: tuple[DimSplit, ...]  # dims the op works along, in halo-exchange order
    free_mesh_dims: tuple[int, ...]  # mesh dims sharding dims the op leaves alone
    out_shape: tuple[int, ...]  # global output shape
    owned_mesh_dims: tuple[int, ...] = ()  # mesh dims sharding a dim the caller lays out

    def local_rank(self, split: DimSplit) -> int:
        """This rank's chunk index along `split` (per-rank code only, see `ranks`)."""
        return ranks.local_rank(self.mesh, split.mesh_dim)


def plan_spatial(
    x: object,
    out_shape: Sequence[int],
    splitters: Mapping[int, Splitter],
    blocked: Mapping[int, str] | None = None,
    in_shape: Sequence[int] | None = None,
    owned: Collection[int] = (),
) -> SpatialPlan:
    """A `SpatialPlan`; `Unsupported` if the sharded path cannot be exact for this call.

    `splitters` names the dims the op works along; any other dim must keep its size and
    may be sharded freely, unless `blocked` gives the reason it may not; the sharding of
    a dim in `owned` is the caller's business (conv channels, see `ops.conv.channels`):
    no halo, and the output may change size there. `x` gives mesh and placements;
    `in_shape` overrides its shape (a backward op's gradient stands in for the input it
    never receives).
    """
    if not isinstance(x, DTensor):
        raise Unsupported("input is not a DTensor")
    blocked = blocked or {}
    shape = tuple(in_shape) if in_shape is not None else tuple(x.shape)
    splits: list[DimSplit] = []
    free: list[int] = []
    owned_mesh: list[int] = []
    seen: set[int] = set()
    mesh = x.device_mesh
    for mesh_dim, p in enumerate(x.placements):
        if isinstance(p, Replicate):
            continue
        if isinstance(p, Partial):
            raise Unsupported(f"Partial (unreduced) input on mesh dim {mesh_dim}")
        if type(p) is not Shard:
            raise Unsupported(f"input placement {p} on mesh dim {mesh_dim}")
        dim = p.dim % len(shape)
        if dim in blocked:
            raise Unsupported(blocked[dim])
        if dim in seen:
            raise Unsupported(f"input dim {dim} sharded over several mesh dims")
        seen.add(dim)
        if dim in owned:
            owned_mesh.append(mesh_dim)
        elif dim in splitters:
            splits.append(splitters[dim](mesh_dim, mesh.size(mesh_dim)))
        elif out_shape[dim] != shape[dim]:
            raise Unsupported(f"input dim {dim} changes size")
        else:
            free.append(mesh_dim)
    return SpatialPlan(
        mesh, tuple(x.placements), tuple(splits), tuple(free), tuple(out_shape), tuple(owned_mesh)
    )
