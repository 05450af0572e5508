"""The exact-but-slow path: compute on replicated tensors, warn once per reason."""

from __future__ import annotations

from dt_core.dtensors import forget_warnings, warn_once
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate


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
