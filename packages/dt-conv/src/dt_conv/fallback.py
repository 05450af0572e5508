"""The replicated path for calls no halo plan can run, and dt-conv's fallback warnings.

The kit (`dt_core.kit`) replicates, warns once per op and reason (`FallbackWarning`) and
lays results out like their inputs; the handlers' own fallbacks call it directly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from dt_core.kit import forget_fallback_warnings, replicated, reshard_like, warn_fallback
from torch.distributed.tensor import DTensor


def reset_warnings() -> None:
    """Warn again about reasons already warned about (tests, long-running sessions)."""
    forget_fallback_warnings("conv")


def replicated_op(name: str, op_call: Callable[..., object], args: tuple, kwargs: dict) -> object:
    """Any handled op on replicated inputs, for calls whose per-rank halo plans cannot run
    (torch's LocalTensorMode simulating ranks). Each output is laid out like the first
    DTensor argument of its global shape (an input's gradient), else like the first
    DTensor argument (an op's output)."""
    warn_fallback("conv", name, "ranks simulated in one process (LocalTensorMode)", stacklevel=4)
    dtensors = [a for a in (*args, *kwargs.values()) if isinstance(a, DTensor)]
    mesh = dtensors[0].device_mesh
    out = op_call(*[replicated(a) for a in args], **{k: replicated(v) for k, v in kwargs.items()})

    def laid_out(t: object) -> object:
        if not isinstance(t, torch.Tensor):
            return t
        like = next((d for d in dtensors if d.shape == t.shape), dtensors[0])
        return reshard_like(t, mesh, like)

    return tuple(laid_out(t) for t in out) if isinstance(out, tuple | list) else laid_out(out)
