"""Small DTensor helpers every plugin's op handlers need (public torch API only).

Handlers know the global shape of what they produce, so they wrap local results without
the shape all-gather `DTensor.from_local` would otherwise run, and they warn about an
exact-but-slow fallback once per reason rather than on every call.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement

_warned: set[str] = set()


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides of `shape` (size-0 dims count as 1, as torch does)."""
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def as_dtensor(
    local: torch.Tensor, mesh: DeviceMesh, placements: Sequence[Placement], shape: Sequence[int]
) -> DTensor:
    """Wrap a local shard whose global shape the caller knows (no shape all-gather)."""
    return DTensor.from_local(
        local,
        mesh,
        list(placements),
        run_check=False,
        shape=torch.Size(shape),
        stride=contiguous_strides(shape),
    )


def warn_once(key: str, message: str, stacklevel: int = 3) -> bool:
    """Warn `message` the first time `key` is seen; True if it warned."""
    if key in _warned:
        return False
    _warned.add(key)
    warnings.warn(message, stacklevel=stacklevel + 1)
    return True


def forget_warnings(prefix: str = "") -> None:
    """Warn again about keys starting with `prefix` (tests, long-running sessions)."""
    for key in [k for k in _warned if k.startswith(prefix)]:
        _warned.discard(key)
