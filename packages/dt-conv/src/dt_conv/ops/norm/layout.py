"""Which mesh dims a normalization reduces over, decided from global metadata only.

A norm reduces some tensor dims (batch and spatial for batch norm, a group's channels and
the spatial dims for group norm, the trailing dims for layer norm) and keeps the others.
A mesh dim that shards a reduced dim joins the reduction; one that shards a kept dim
leaves the statistics sharded the same way. The decision reads placements and shapes, so
it is the same on every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dt_core.kit import Unsupported
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial, Placement, Replicate, Shard


@dataclass(frozen=True)
class NormLayout:
    """A normalization's reduction over a tensor of `shape` laid out by `placements`."""

    mesh: DeviceMesh
    shape: tuple[int, ...]  # global shape of the tensor normalized
    placements: tuple[Placement, ...]
    reduced: tuple[int, ...]  # tensor dims the statistics reduce over

    @property
    def reduce_mesh_dims(self) -> tuple[int, ...]:
        """Mesh dims that shard a reduced dim: the statistics are combined over them."""
        return tuple(
            i
            for i, p in enumerate(self.placements)
            if isinstance(p, Shard) and p.dim in self.reduced
        )

    @property
    def count(self) -> int:
        """How many elements each statistic reduces over, globally."""
        n = 1
        for d in self.reduced:
            n *= self.shape[d]
        return n

    def stat_shape(self) -> tuple[int, ...]:
        """The global shape of a statistic: the reduced dims kept as size 1."""
        return tuple(1 if d in self.reduced else s for d, s in enumerate(self.shape))

    def stat_placements(self, reduced_as: Placement) -> list[Placement]:
        """A statistic's placements: `reduced_as` on the mesh dims that reduce (Partial
        for sums), the tensor's own shard of a kept dim, else Replicate."""
        reducing = self.reduce_mesh_dims
        return [reduced_as if i in reducing else p for i, p in enumerate(self.placements)]


def norm_layout(
    mesh: DeviceMesh,
    shape: Sequence[int],
    placements: Sequence[Placement],
    reduced: Sequence[int],
    blocked: dict[int, str] | None = None,
) -> NormLayout:
    """The layout of a normalization; `Unsupported` where the sharded path cannot run it
    (a pending sum, a dim sharded over several mesh dims, a dim in `blocked`)."""
    seen: set[int] = set()
    for p in placements:
        if isinstance(p, Partial):
            raise Unsupported("Partial (unreduced) input")
        if isinstance(p, Shard):
            if p.dim in seen:
                raise Unsupported(f"dim {p.dim} sharded over several mesh dims")
            seen.add(p.dim)
            if blocked and p.dim in blocked:
                raise Unsupported(blocked[p.dim])
        elif not isinstance(p, Replicate):
            raise Unsupported(f"placement {p}")
    return NormLayout(mesh, tuple(shape), tuple(placements), tuple(sorted(reduced)))


def shards_any(placements: Sequence[Placement], dims: Sequence[int]) -> bool:
    """Whether any placement shards one of `dims`."""
    return any(isinstance(p, Shard) and p.dim in dims for p in placements)
