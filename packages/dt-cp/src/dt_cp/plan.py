"""From sequence-sharded DTensors to a context-parallel plan (or `Unsupported`: why none).

Supported: q, k, v on one mesh with identical placements, the sequence (dim 2 of
(batch, heads, seq, dim)) sharded on exactly one mesh dim, other mesh dims replicated or
sharding batch / heads evenly. Anything else falls back (exactly) with a warning.

The plan also decides, once, where the call runs (`CpPlan.path`, `choose_path`); the
handlers run the executor `executors.EXECUTORS` holds for that path and decide nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from dt_core.dtensors import forget_warnings, warn_once
from dt_core.kit import Unsupported, forget_fallback_warnings
from dt_core.tracing import is_tracing, simulates_ranks
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard

from . import records
from .config import current
from .layout import SequenceLayout, Shards
from .torch_cp import (
    active_state,
    check_even_local_lengths,
    check_settings_agree,
    torch_algorithm,
    torch_layout,
)

SEQ_DIM = 2

# Where a call runs, decided once by `choose_path`:
#   "local"      nothing to exchange (the sequence is not sharded, or on one rank)
#   "simulated"  LocalTensorMode: the all-gather once per simulated rank (`simulated.py`)
#   "traced"     torch.compile / fake tensors: the all-gather as functional collectives
#   "ring"       eager, the other ranks' blocks in small chunks, a few in flight
#   "allgather"  eager, whole blocks, all in flight at once
Path = Literal["local", "simulated", "traced", "ring", "allgather"]


def reset_warnings() -> None:
    """Warn again about reasons already warned about (tests, long-running sessions): the
    replicated fallbacks (dt-core's kit) and the ring-under-compile note."""
    forget_fallback_warnings("cp")
    forget_warnings("dt-cp:")


@dataclass(frozen=True)
class CpPlan:
    mesh: DeviceMesh
    placements: tuple[Placement, ...]
    cp_dim: int | None  # mesh dim sharding the sequence; None: nothing to exchange
    shards: Shards  # `Shards.local` where cp_dim is None
    path: Path  # the executor that runs (`executors.EXECUTORS`)


def _norm(p: Placement, ndim: int) -> Placement:
    if type(p) is Shard and p.dim < 0:
        return Shard(p.dim + ndim)
    return p


def placements_of(t: DTensor) -> tuple[Placement, ...]:
    return tuple(_norm(p, t.ndim) for p in t.placements)


def _sequence_sharded(*tensors: object) -> bool:
    return any(
        isinstance(t, DTensor)
        and t.ndim == 4
        and any(type(p) is Shard and p.dim == SEQ_DIM for p in placements_of(t))
        for t in tensors
    )


def layout_is_permuted() -> bool:
    """Whether sequence-sharded DTensors here are in a load-balanced (permuted) order."""
    settings = current()
    torch_state = active_state(settings)
    if torch_state is not None:
        return torch_state.load_balance
    return settings.load_balancer != "none"


def refuse_fallback_if_permuted(reason: str, *tensors: object) -> None:
    """The replicate fallback computes in DTensor's order: wrong for a permuted sequence.

    Called while handling the `Unsupported` that gave `reason`; the error carries that
    reason, so it does not chain the refusal.
    """
    if _sequence_sharded(*tensors) and layout_is_permuted():
        raise ValueError(
            f"dt-cp: attention cannot run context parallel here ({reason}), and its exact "
            "fallback (replicate the inputs) would see the load-balanced sequence in its "
            "permuted order, which is not exact. Shard without load balancing, or fix the "
            "reason above."
        ) from None


def make_plan(q: object, k: object, v: object, mask: object = None) -> CpPlan:
    """A plan for attention over DTensors q, k, v; `Unsupported` says why none applies.

    The handler catching it falls back exactly, but first calls
    `refuse_fallback_if_permuted`: on a load-balanced sequence that fallback is not exact.
    """
    if not (isinstance(q, DTensor) and isinstance(k, DTensor) and isinstance(v, DTensor)):
        raise Unsupported("q, k and v are not all DTensors")
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise Unsupported("q, k, v are not 4-D (batch, heads, sequence, dim)")
    mesh = q.device_mesh
    if k.device_mesh != mesh or v.device_mesh != mesh:
        raise Unsupported("q, k, v live on different meshes")
    pq, pk, pv = placements_of(q), placements_of(k), placements_of(v)
    if not (pq == pk == pv):
        raise Unsupported(f"q, k, v placements differ ({pq}, {pk}, {pv})")
    cp_dims = [i for i, p in enumerate(pq) if type(p) is Shard and p.dim == SEQ_DIM]
    if len(cp_dims) > 1:
        raise Unsupported("the sequence is sharded over more than one mesh dim")
    for i, p in enumerate(pq):
        if isinstance(p, Replicate) or i in cp_dims:
            continue
        if type(p) is not Shard or p.dim not in (0, 1):
            raise Unsupported(f"placement {p} on mesh dim {i} is not supported")
        size = mesh.size(i)
        if p.dim == 1 and (q.shape[1] % size or k.shape[1] % size):
            raise Unsupported("heads are sharded unevenly")
        if p.dim == 0 and q.shape[0] % size:
            raise Unsupported("batch is sharded unevenly")
        if (
            isinstance(mask, torch.Tensor)
            and mask.dim() >= 4 - p.dim
            and mask.shape[p.dim - 4] != 1
        ):
            raise Unsupported("attn_mask has a batch/head dim while batch/heads are sharded")
    settings = current()
    if not cp_dims:
        shards = Shards.local(q.shape[SEQ_DIM], k.shape[SEQ_DIM])
        return CpPlan(mesh, pq, None, shards, choose_path(settings.algorithm, q.to_local()))
    cp = cp_dims[0]
    parts = mesh.size(cp)
    group = mesh.get_group(cp).group_name
    torch_state = active_state(settings)  # raises when torch's state hides the layout
    if torch_state is None:
        q_layout = SequenceLayout(
            q.shape[SEQ_DIM], parts, settings.load_balancer, settings.documents
        )
        kv_layout = SequenceLayout(
            k.shape[SEQ_DIM], parts, settings.load_balancer, settings.documents
        )
        # the settings' order against what shard_sequence recorded: never a silent guess
        records.check(mesh, cp, q_layout, "attention's query")
        records.check(mesh, cp, kv_layout, "attention's key and value")
        algorithm: str = settings.algorithm
    else:
        check_settings_agree(torch_state, settings)
        q_layout = torch_layout(torch_state, q.shape[SEQ_DIM], parts, "query", settings)
        kv_layout = torch_layout(torch_state, k.shape[SEQ_DIM], parts, "key", settings)
        if not is_tracing(q.to_local()):
            local = {"query": q.to_local(), "key": k.to_local(), "value": v.to_local()}
            check_even_local_lengths(local, parts, group)
        algorithm = torch_algorithm(torch_state, settings)
    path = choose_path(algorithm, q.to_local(), parts)
    groups = _rank_groups(mesh, cp) if path == "simulated" else None
    shards = Shards(q_layout, kv_layout, group, mesh.get_local_rank(cp), groups)
    return CpPlan(mesh, pq, cp, shards, path)


def _rank_groups(mesh: DeviceMesh, cp: int) -> tuple[tuple[int, ...], ...]:
    """Every group along mesh dim `cp` (global ranks in group order), for the simulated
    path: one process computes for all of them (`simulated.py`)."""
    from dt_core.compat.local_tensor import enabled_mode, mode_disabled

    with mode_disabled(enabled_mode()):
        rows = mesh.mesh.movedim(cp, -1).reshape(-1, mesh.size(cp)).tolist()
    return tuple(tuple(int(r) for r in row) for row in rows)


def choose_path(algorithm: str, like: torch.Tensor, parts: int | None = None) -> Path:
    """Where a call on local shards like `like` runs, decided here only.

    `algorithm` is the configured one ("auto", "ring", "allgather"); `parts` the ranks
    sharing the sequence, None where it is not sharded (then only "local" or
    "simulated"). The ring cannot run traced (its point-to-point sends do not trace) nor
    on simulated ranks (no sends there): the all-gather runs instead, said once where
    "ring" was asked for; "auto" gets the measured default (`DEFAULT_ALGORITHM`) where
    it can run, else the all-gather silently.
    """
    simulated = simulates_ranks()  # LocalTensorMode entered and enabled here
    if parts is None:
        return "simulated" if simulated else "local"
    traced = is_tracing(like)
    if algorithm == "ring" and traced:
        _warn_ring_once(RING_UNDER_COMPILE)
        algorithm = "allgather"
    if simulated:
        if algorithm == "ring" and parts > 1:
            _warn_ring_once(RING_UNDER_LOCAL_TENSOR_MODE)
        return "simulated"
    if parts == 1:
        return "local"
    if traced:
        return "traced"
    if algorithm == "auto":
        return DEFAULT_ALGORITHM
    return "ring" if algorithm == "ring" else "allgather"


# Chosen by measurement (benchmarks/run.py): see README.
DEFAULT_ALGORITHM: Path = "ring"

RING_UNDER_COMPILE = (
    "dt-cp: ring under torch.compile",
    "dt-cp: the ring algorithm runs eagerly only (point-to-point sends do not trace); "
    "under torch.compile the exact all-gather algorithm is used instead",
)
RING_UNDER_LOCAL_TENSOR_MODE = (
    "dt-cp: ring under LocalTensorMode",
    "dt-cp: the ring algorithm's point-to-point sends do not run under "
    "LocalTensorMode; there each simulated rank runs the exact all-gather algorithm",
)


def _warn_ring_once(note: tuple[str, str]) -> None:
    """One warning per note (choose_path <- make_plan <- the handler's own planning)."""
    warn_once(*note, stacklevel=4)


def to_placements(t: object, mesh: DeviceMesh, placements: Sequence[Placement]) -> object:
    """`t` (a DTensor) redistributed to `placements`; plain tensors pass through."""
    if isinstance(t, DTensor) and tuple(t.placements) != tuple(placements):
        return t.redistribute(mesh, list(placements))
    return t


def full_mask(mask: object, q_len: int, kv_len: int) -> torch.Tensor | None:
    """The user's attn_mask as a plain tensor broadcast to (..., L, S) (a view)."""
    if mask is None:
        return None
    if isinstance(mask, DTensor):
        mask = mask.full_tensor()
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"dt-cp: attn_mask must be a tensor, got {type(mask).__name__}")
    if mask.dim() < 2:
        return torch.broadcast_to(mask, (q_len, kv_len))
    return torch.broadcast_to(mask, (*mask.shape[:-2], q_len, kv_len))


def batch_head_offsets(t: DTensor) -> tuple[int, int]:
    """Global index of the first local batch row and head (mods see global indices)."""
    mesh = t.device_mesh
    offsets = []
    for dim in (0, 1):
        offset, size = 0, t.shape[dim]
        for i, p in enumerate(placements_of(t)):
            if type(p) is Shard and p.dim == dim:
                size //= mesh.size(i)
                offset += mesh.get_local_rank(i) * size
        offsets.append(offset)
    return offsets[0], offsets[1]
