"""The exact-but-slow path: compute on replicated tensors, warn once per reason."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from dt_core.dtensors import as_dtensor, forget_warnings, warn_once
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard


def warn_fallback(op: str, reason: str) -> None:
    """Warn once per (op, reason): falling back is correct but gathers the whole input."""
    warn_once(
        f"dt-conv: {op}: {reason}",
        f"dt-conv: {op} falls back to a replicated input ({reason}); "
        "the result is exact but every rank computes the whole op",
        stacklevel=4,
    )


def reset_warnings() -> None:
    """Warn again about reasons already warned about (tests, long-running sessions)."""
    forget_warnings("dt-conv:")


def replicated(t: DTensor) -> DTensor:
    return t.redistribute(t.device_mesh, [Replicate()] * t.device_mesh.ndim)


def target_placements(placements: tuple[Placement, ...]) -> list[Placement]:
    """The input's placements, with Partial (not derivable from a full result) replicated."""
    return [Replicate() if isinstance(p, Partial) else p for p in placements]


def replicated_op(name: str, op_call: Callable[..., object], args: tuple, kwargs: dict) -> object:
    """Any handled op on replicated inputs, for calls whose per-rank halo plans cannot run
    (torch's LocalTensorMode simulating ranks). Each output takes the placements of the
    first DTensor argument of its global shape (else of the first DTensor argument, where
    its shard dims fit, else Replicate)."""
    warn_fallback(name, "ranks simulated in one process (LocalTensorMode)")
    dtensors = [a for a in (*args, *kwargs.values()) if isinstance(a, DTensor)]
    mesh = dtensors[0].device_mesh

    def local(a: object) -> object:
        return replicated(a).to_local() if isinstance(a, DTensor) else a

    out = op_call(*[local(a) for a in args], **{k: local(v) for k, v in kwargs.items()})

    def wrap(t: object) -> object:
        if not isinstance(t, torch.Tensor):
            return t
        full = as_dtensor(t, mesh, [Replicate()] * mesh.ndim, t.shape)
        like = next((d for d in dtensors if d.shape == t.shape), dtensors[0])
        target = target_placements(tuple(like.placements))
        if like.device_mesh != mesh or any(
            p.is_shard() and cast(Shard, p).dim >= t.ndim for p in target
        ):
            return full
        return full.redistribute(mesh, target)

    return tuple(wrap(t) for t in out) if isinstance(out, (tuple, list)) else wrap(out)
