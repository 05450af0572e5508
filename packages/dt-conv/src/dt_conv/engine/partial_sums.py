"""Per-rank partial results (a weight gradient over this rank's rows, a conv over this
rank's input channels) summed over the mesh dims that split their inputs."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from dt_core.dtensors import as_dtensor
from dt_core.kit import replicated
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial, Replicate


def summed(local: torch.Tensor, mesh: DeviceMesh, mesh_dims: Sequence[int]) -> torch.Tensor:
    """Sum a per-rank partial result over `mesh_dims`; the result is full on every rank."""
    if not mesh_dims:
        return local
    placements = [Partial() if i in mesh_dims else Replicate() for i in range(mesh.ndim)]
    dt = as_dtensor(local, mesh, placements, local.shape)
    return replicated(dt)
