"""The exact-but-slow path: compute on replicated tensors, warn once per reason."""

from __future__ import annotations

import warnings

from torch.distributed.tensor import DTensor, Partial, Placement, Replicate

_warned: set[str] = set()


def warn_fallback(op: str, reason: str) -> None:
    """Warn once per (op, reason): falling back is correct but gathers the whole input."""
    key = f"{op}: {reason}"
    if key not in _warned:
        _warned.add(key)
        warnings.warn(
            f"dt-conv: {op} falls back to a replicated input ({reason}); "
            "the result is exact but every rank computes the whole convolution",
            stacklevel=4,
        )


def replicated(t: DTensor) -> DTensor:
    return t.redistribute(t.device_mesh, [Replicate()] * t.device_mesh.ndim)


def target_placements(placements: tuple[Placement, ...]) -> list[Placement]:
    """The input's placements, with Partial (not derivable from a full result) replicated."""
    return [Replicate() if isinstance(p, Partial) else p for p in placements]
