"""Sharding a full sequence onto ranks and back, in the configured (balanced) layout."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor

from . import records
from .config import LOAD_BALANCERS, current
from .layout import SequenceLayout


def _layout(
    length: int, parts: int, load_balancer: str | None, documents: Sequence[int] | None
) -> SequenceLayout:
    """The layout for these arguments, defaults from the settings in force."""
    settings = current()
    balancer = settings.load_balancer if load_balancer is None else load_balancer
    if balancer not in LOAD_BALANCERS:
        raise ValueError(f"dt-cp: load_balancer must be one of {LOAD_BALANCERS}")
    docs = settings.documents if documents is None else tuple(int(n) for n in documents)
    return SequenceLayout(length, parts, balancer, docs if balancer == "document" else None)


def _check_torch_agrees(layout: SequenceLayout) -> None:
    """While torch's CP dispatcher is on, attention reads torch's layout: shard alike."""
    from .torch_cp import TorchLayoutError, torch_cp_state, torch_layout

    if current().torch_cp == "ignore":
        return
    state = torch_cp_state()
    if state is None or not state.dispatcher_enabled:
        return
    expected = torch_layout(state, layout.length, layout.parts, "the tensor", current())
    if not torch.equal(layout.permutation(), expected.permutation()):
        raise TorchLayoutError(
            f"dt-cp: torch's context-parallel dispatcher is on with "
            f"{'head-tail' if state.load_balance else 'no'} load balancing, so attention will "
            f"read sequence-sharded DTensors in that order, but this shard_sequence call lays "
            f"them out with load_balancer={layout.balancer!r}; pass the matching "
            "load_balancer, or shard and attend under dt_cp.settings(torch_cp='ignore')"
        )


def shard_sequence(
    t: torch.Tensor,
    mesh: DeviceMesh,
    seq_dim: int,
    load_balancer: str | None = None,
    mesh_dim: int = 0,
    documents: Sequence[int] | None = None,
) -> DTensor:
    """`distribute_tensor(t, mesh, Shard(seq_dim))`, with positions laid out for balance.

    `load_balancer` ("none", "head_tail", "document") and `documents` (document lengths
    of a packed sequence, for "document") default to the settings in force; attention
    must run under the same settings, which is how it knows which global positions each
    rank holds. The layout is recorded (`records.py`): attention and `unshard_sequence`
    under other settings raise `LayoutMismatchError` naming both, never compute in the
    wrong order. Call it on every rank with the same full tensor, as `distribute_tensor`.
    """
    seq_dim = seq_dim % t.dim()
    layout = _layout(t.shape[seq_dim], mesh.size(mesh_dim), load_balancer, documents)
    _check_torch_agrees(layout)
    # attention checks the order it reads against this record
    records.record(mesh, mesh_dim % mesh.ndim, layout)
    if layout.balancer != "none":
        t = t.index_select(seq_dim, layout.permutation(t.device))
    placements: list[Placement] = [Replicate()] * mesh.ndim
    placements[mesh_dim] = Shard(seq_dim)
    return distribute_tensor(t, mesh, placements)


def unshard_sequence(
    t: DTensor,
    seq_dim: int,
    load_balancer: str | None = None,
    mesh_dim: int = 0,
    documents: Sequence[int] | None = None,
) -> torch.Tensor:
    """The full tensor in natural sequence order (undoes `shard_sequence`'s permutation)."""
    seq_dim = seq_dim % t.dim()
    full = t.full_tensor()
    layout = _layout(full.shape[seq_dim], t.device_mesh.size(mesh_dim), load_balancer, documents)
    records.check(t.device_mesh, mesh_dim % t.device_mesh.ndim, layout, "unshard_sequence")
    if layout.balancer == "none":
        return full
    inverse = torch.argsort(layout.permutation(full.device))
    return full.index_select(seq_dim, inverse)
