"""Sharding a full sequence onto ranks and back, in the configured (balanced) layout."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from .config import LOAD_BALANCERS, current
from .layout import SequenceLayout


def _balancer(load_balancer: str | None) -> str:
    balancer = current().load_balancer if load_balancer is None else load_balancer
    if balancer not in LOAD_BALANCERS:
        raise ValueError(f"dt-cp: load_balancer must be one of {LOAD_BALANCERS}")
    return balancer


def shard_sequence(
    t: torch.Tensor,
    mesh: DeviceMesh,
    seq_dim: int,
    load_balancer: str | None = None,
    mesh_dim: int = 0,
) -> DTensor:
    """`distribute_tensor(t, mesh, Shard(seq_dim))`, with positions laid out for balance.

    `load_balancer` defaults to the configured one; attention must run under the same
    setting, which is how it knows which global positions each rank holds. Call it on
    every rank with the same full tensor, as `distribute_tensor`.
    """
    seq_dim = seq_dim % t.dim()
    balancer = _balancer(load_balancer)
    if balancer != "none":
        layout = SequenceLayout(t.shape[seq_dim], mesh.size(mesh_dim), balancer)
        t = t.index_select(seq_dim, layout.permutation(t.device))
    placements = [Replicate()] * mesh.ndim
    placements[mesh_dim] = Shard(seq_dim)
    return distribute_tensor(t, mesh, placements)


def unshard_sequence(
    t: DTensor, seq_dim: int, load_balancer: str | None = None, mesh_dim: int = 0
) -> torch.Tensor:
    """The full tensor in natural sequence order (undoes `shard_sequence`'s permutation)."""
    seq_dim = seq_dim % t.dim()
    full = t.full_tensor()
    balancer = _balancer(load_balancer)
    if balancer == "none":
        return full
    layout = SequenceLayout(full.shape[seq_dim], t.device_mesh.size(mesh_dim), balancer)
    inverse = torch.argsort(layout.permutation(full.device))
    return full.index_select(seq_dim, inverse)
