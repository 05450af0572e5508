"""The all-to-all under every halo exchange, and what keeps traced exchanges in step.

Each exchange is one all-to-all (torch's functional collectives, through
`dt_core.compat.tracing`) along one mesh dim's own process group, with zero rows to and
from non-neighbours: the same two ops, start and wait, run eagerly and in a
torch.compile graph, so a caller computing between them overlaps the exchange in both.
The gather (`halo.forward`) and its adjoint (`halo.backward`) pack and unpack around it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import torch
from dt_core.compat import tracing
from dt_core.compat.process_groups import is_fake_group
from dt_core.dtensors import as_dtensor
from dt_core.kit import Counters
from dt_core.tracing import is_tracing, simulates_ranks
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from ... import ranks
from ..geometry import DimSplit

# `bytes_sent`: bytes this process has sent in halo exchanges (both directions of
# autograd); the demo reads it, `dt-plugins stats` shows it.
counters = Counters("conv")


def resized(t: torch.Tensor, dim: int, length: int) -> list[int]:
    shape = list(t.shape)
    shape[dim] = length
    return shape


def select_rows(t: torch.Tensor, dim: int, rows: tuple[int, ...]) -> torch.Tensor:
    if rows == tuple(range(rows[0], rows[0] + len(rows))):
        return t.narrow(dim, rows[0], len(rows)).contiguous()
    return t.index_select(dim, torch.tensor(rows, device=t.device))


def _count(t: torch.Tensor) -> None:
    # a compiled graph sends at run time, not while traced; simulated ranks send nothing
    if not is_tracing(t) and not ranks.simulated():
        counters.add("bytes_sent", t.numel() * t.element_size())


# Per-rank halves of an exchange. They read the rank `me` as a plain int, so under
# LocalTensorMode they run once per simulated rank (`ranks.each_rank`); the all-to-all
# between them runs at the mode's level. Each returns a flat tuple (tensors and ints),
# which the mode combines element by element.


def packed_sends(
    like: torch.Tensor, dim: int, parts: int, pieces: dict[int, Any], recvs: dict[int, int]
) -> tuple[Any, ...]:
    send_rows = [pieces[r].shape[dim] if r in pieces else 0 for r in range(parts)]
    recv_rows = [recvs.get(r, 0) for r in range(parts)]
    if pieces:
        source = torch.cat([pieces[r].movedim(dim, 0) for r in sorted(pieces)])
    else:
        source = like.movedim(dim, 0).narrow(0, 0, 0)
    if not is_tracing(source):
        return (source.contiguous(), *send_rows, *recv_rows)
    # Traced, each exchange sends from a buffer of its own (`torch.empty`, which graph CSE
    # never merges), filled from `like` even when empty and, in a backward handler, from
    # the gradient: two exchanges whose sends are equal on one rank (both empty, say) must
    # stay two collectives on every rank, and a send must depend on what its rank's
    # graph computes it from, or a partitioner moves it between forward and backward on
    # one rank only (see `traced_exchanges`).
    anchor = _GRADIENT.get()
    if anchor is not None:
        source = source + anchor.narrow(0, 0, 0).sum().to(source.dtype)
    send = torch.empty(source.shape, dtype=like.dtype, device=like.device)
    send.copy_(source)
    return (send, *send_rows, *recv_rows)


def received_rows(
    out: torch.Tensor | None, dim: int, recv_rows: list[int]
) -> dict[int, torch.Tensor]:
    """Peer -> the rows it sent (laid out like the input), from the all-to-all's result."""
    received: dict[int, torch.Tensor] = {}
    offset = 0
    if out is None:
        return received
    for r, n in enumerate(recv_rows):
        if n:
            received[r] = out.narrow(0, offset, n).movedim(0, dim)
        offset += n
    return received


class AllToAll:
    """One started all-to-all along a split's tensor dim: `packed` is a `packed_sends` tuple
    (per-rank values under LocalTensorMode); `wait()` gives the flat result, which
    per-rank code splits with `received_rows`.

    On torch's fake backend outside LocalTensorMode (a dry run: one process, its peers
    exist only in name) nothing is exchanged: the halos absent peers would send are zeros.
    The fake backend rejects an all-to-all that receives rows but sends none (a window
    reaching one way, as a valid or strided conv's), which torch alone never issues."""

    def __init__(self, mesh: DeviceMesh, split: DimSplit, packed: tuple[Any, ...]) -> None:
        ranks.mode_level("a halo exchange")
        send, sizes = packed[0], list(packed[1:])
        _count(send)
        send_rows, recv_rows = sizes[: split.parts], sizes[split.parts :]
        group = mesh.get_group(split.mesh_dim)
        self.absent = is_fake_group(group) and not simulates_ranks(send)
        if self.absent:
            self.started = send.new_zeros((sum(recv_rows), *send.shape[1:]))
        else:
            self.started = tracing.start_all_to_all(send, recv_rows, send_rows, group)

    def wait(self) -> torch.Tensor:
        out: torch.Tensor = self.started if self.absent else tracing.wait(self.started)
        kept = _RECEIVED.get()
        if kept is not None and out.shape[0] == 0 and is_tracing(out):
            kept.append(out)  # a rank that receives nothing never uses the result
        return out


# What this handler's traced exchanges received, and the gradient a backward handler was
# given (`traced_exchanges`); None outside a handler.
_RECEIVED: ContextVar[list[torch.Tensor] | None] = ContextVar("dt_conv_received", default=None)
_GRADIENT: ContextVar[torch.Tensor | None] = ContextVar("dt_conv_gradient", default=None)


@contextlib.contextmanager
def traced_exchanges(gradient: torch.Tensor | None) -> Iterator[list[torch.Tensor]]:
    """Keep a traced handler's exchanges where every rank puts them (the SPMD graphs torch's
    partitioner assumes); yields what they received, for `tie_to`.

    With uneven shards the ranks trace different graphs, and torch 2.14's partitioner
    moves or copies collectives by data dependence, rank by rank: an exchange that brings
    a rank nothing has an unused result there, and a dead collective whose inputs are
    available in the backward graph is copied into it; an exchange in a backward handler
    whose send does not depend on the gradient (input halos for the weight gradient) may
    move into the forward graph on one rank and not on another. Then the ranks'
    collectives stop matching and deadlock. So every empty received tensor (the others
    are used: a rank receives only rows it reads) is tied to the handler's output, and
    in a backward handler (`gradient`: its incoming gradient, local) every send depends
    on the gradient.
    """
    kept: list[torch.Tensor] = []
    tokens = (_RECEIVED.set(kept), _GRADIENT.set(gradient))
    try:
        yield kept
    finally:
        _GRADIENT.reset(tokens[1])
        _RECEIVED.reset(tokens[0])


def tie_to(result: Any, received: list[torch.Tensor]) -> Any:
    """`result` (a handler's DTensor output, or a tuple of them) with its first floating
    output made to depend on every tensor in `received`, adding an exact zero (a sum over
    no elements)."""
    if isinstance(result, tuple | list):
        items = list(result)
        for i, item in enumerate(items):
            if isinstance(item, DTensor) and item.dtype.is_floating_point:
                items[i] = tie_to(item, received)
                return type(result)(items)
        return result
    if not isinstance(result, DTensor) or not result.dtype.is_floating_point:
        return result
    local = result.to_local()
    zero = sum((r.narrow(0, 0, 0).sum() for r in received), local.new_zeros(()))
    return as_dtensor(local + zero, result.device_mesh, result.placements, result.shape)
