"""The exact-but-slow path: compute on replicated tensors, warn once per reason.

dt-core's kit replicates and warns (`dt_core.kit.FallbackWarning`, once per op and
reason); this module keeps dt-conv's rule for laying results out like their inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from dt_core.dtensors import as_dtensor
from dt_core.kit import forget_fallback_warnings, replicated, warn_fallback
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard


def reset_warnings() -> None:
    """Warn again about reasons already warned about (tests, long-running sessions)."""
    forget_fallback_warnings("conv")


def target_placements(placements: tuple[Placement, ...]) -> list[Placement]:
    """The input's placements, with Partial (not derivable from a full result) replicated."""
    return [Replicate() if isinstance(p, Partial) else p for p in placements]


def replicated_op(name: str, op_call: Callable[..., object], args: tuple, kwargs: dict) -> object:
    """Any handled op on replicated inputs, for calls whose per-rank halo plans cannot run
    (torch's LocalTensorMode simulating ranks). Each output takes the placements of the
    first DTensor argument of its global shape (else of the first DTensor argument, where
    its shard dims fit, else Replicate)."""
    warn_fallback("conv", name, "ranks simulated in one process (LocalTensorMode)", stacklevel=4)
    dtensors = [a for a in (*args, *kwargs.values()) if isinstance(a, DTensor)]
    mesh = dtensors[0].device_mesh

    out = op_call(*[replicated(a) for a in args], **{k: replicated(v) for k, v in kwargs.items()})

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
