"""Moving between local tensors and DTensors inside the handlers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import torch
from dt_core.dtensors import as_dtensor
from dt_core.kit import replicated
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate

from .fallback import target_placements


@overload
def replicated_local(t: torch.Tensor) -> torch.Tensor: ...
@overload
def replicated_local(t: torch.Tensor | None) -> torch.Tensor | None: ...


def replicated_local(t: torch.Tensor | None) -> torch.Tensor | None:
    """Weight or bias as a full local tensor, whatever its placements."""
    if isinstance(t, DTensor):
        return replicated(t)
    return t


def like_param(full: torch.Tensor, mesh: DeviceMesh, param: object) -> torch.Tensor:
    """A replicated full gradient in the form of its parameter (placements or plain)."""
    if not isinstance(param, DTensor):
        return full
    dt = as_dtensor(full, mesh, [Replicate()] * mesh.ndim, full.shape)
    if param.device_mesh != mesh:
        return dt
    return dt.redistribute(mesh, target_placements(tuple(param.placements)))


def summed(local: torch.Tensor, mesh: DeviceMesh, mesh_dims: Sequence[int]) -> torch.Tensor:
    """Sum a per-rank partial result over `mesh_dims`; the result is full on every rank."""
    if not mesh_dims:
        return local
    placements = [Partial() if i in mesh_dims else Replicate() for i in range(mesh.ndim)]
    dt = as_dtensor(local, mesh, placements, local.shape)
    return replicated(dt)
