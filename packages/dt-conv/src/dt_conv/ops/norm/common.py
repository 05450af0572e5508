"""What every normalization handler shares: the input's DTensor pieces, wrapping local
results, and the exact fallback for layouts the sharded path does not take."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from dt_core.dtensors import as_dtensor
from dt_core.kit import Unsupported, bind_arguments, warn_fallback
from torch.distributed.tensor import DTensor, Placement, Replicate

from .layout import NormLayout

SPATIAL_FROM = 2  # dims from here on are spatial: (N, C, *spatial)


def shards_spatial(value: object) -> bool:
    """Whether `value` is a DTensor with a spatial dim sharded (what dt-conv's norms take)."""
    return isinstance(value, DTensor) and any(
        p.is_shard() and p.dim >= SPATIAL_FROM  # type: ignore[attr-defined]
        for p in value.placements
    )


def local(value: Any) -> Any:
    """A DTensor's local tensor; anything else unchanged."""
    return value.to_local() if isinstance(value, DTensor) else value


def wrap(
    t: torch.Tensor,
    layout: NormLayout,
    placements: Sequence[Placement] | None = None,
    shape: Sequence[int] | None = None,
) -> DTensor:
    """A local result as a DTensor laid out like the normalized tensor (or `placements`)."""
    return as_dtensor(
        t,
        layout.mesh,
        layout.placements if placements is None else placements,
        layout.shape if shape is None else shape,
    )


def replicated_like(t: torch.Tensor, layout: NormLayout) -> DTensor:
    """A local tensor that is the same on every rank, as a replicated DTensor."""
    return as_dtensor(t, layout.mesh, [Replicate()] * layout.mesh.ndim, t.shape)


Plan = Callable[[dict[str, Any]], NormLayout]
Run = Callable[[Any, dict[str, Any], NormLayout], Any]


def sharded_or_fallback(op_call: Any, args: tuple, kwargs: dict, plan: Plan, run: Run) -> Any:
    """`run(op_call, arguments by name, layout)` with the layout `plan` makes of them;
    where `plan` refuses (`Unsupported`), the same `run` on replicated inputs."""
    values: dict[str, Any] = bind_arguments(op_call, args, kwargs)
    try:
        layout = plan(values)
    except Unsupported as exc:
        return _fall_back(str(exc), op_call, values, plan, run)
    return run(op_call, values, layout)


def laid_out_like(grad: Any, x: DTensor) -> Any:
    """An output gradient laid out like the forward's input (autograd may hand another)."""
    if isinstance(grad, DTensor) and tuple(grad.placements) != tuple(x.placements):
        return grad.redistribute(x.device_mesh, x.placements)
    return grad


def _fall_back(reason: str, op_call: Any, values: dict[str, Any], plan: Plan, run: Run) -> Any:
    """The op on replicated inputs through the same code (so running statistics are
    updated in place as on the sharded path), its tensor outputs shaped like the input
    laid out like it again; warned once per op and reason."""
    warn_fallback("conv", str(op_call), reason, stacklevel=6)
    x = values["input"]
    full = {
        k: v.redistribute(v.device_mesh, [Replicate()] * v.device_mesh.ndim)
        if isinstance(v, DTensor) and k not in _IN_PLACE
        else v
        for k, v in values.items()
    }
    out = run(op_call, full, plan(full))

    def back(t: Any) -> Any:
        if isinstance(t, DTensor) and t.shape == x.shape:
            return t.redistribute(x.device_mesh, x.placements)
        return t

    return tuple(back(t) for t in out) if isinstance(out, tuple) else back(out)


# arguments a norm updates in place: never copied, so the update lands in the caller's
_IN_PLACE = ("running_mean", "running_var")
