"""The exact-but-slow path every handler shares: replicate, run torch's op, reshard.

A handler that cannot run an op sharded must still give torch's answer: it gathers its
DTensor inputs, runs the op on full tensors on every rank, and hands the outputs back in
the layout of the inputs they correspond to. It warns once per (op, reason), so a user
learns why a layer is slow without a warning per call. Importing this module imports
no torch: plugin modules load it while `import torch` is still running.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast, overload

if TYPE_CHECKING:
    import torch

_warned: set[tuple[str, str, str]] = set()


class FallbackWarning(UserWarning):
    """A sharded op ran on replicated inputs: exact, but every rank did the whole op."""


def warn_fallback(plugin: str, op: str, reason: str, stacklevel: int = 3) -> bool:
    """Warn the first time `plugin` falls back for `op` because of `reason`."""
    key = (plugin, op, reason)
    if key in _warned:
        return False
    _warned.add(key)
    warnings.warn(
        f"dt-{plugin}: {op} falls back to replicated inputs ({reason}); the result is exact "
        "but every rank computes the whole op",
        FallbackWarning,
        stacklevel=stacklevel + 1,
    )
    return True


def forget_fallback_warnings(plugin: str | None = None) -> None:
    """Warn again for reasons already warned about (tests, long-running sessions)."""
    for key in [k for k in _warned if plugin is None or k[0] == plugin]:
        _warned.discard(key)


@overload
def replicated(value: torch.Tensor) -> torch.Tensor: ...
@overload
def replicated(value: torch.Tensor | None) -> torch.Tensor | None: ...
@overload
def replicated(value: Any) -> Any: ...


def replicated(value: Any) -> Any:
    """A DTensor's full value as a plain tensor on every rank; anything else unchanged."""
    from torch.distributed.tensor import DTensor, Replicate

    if isinstance(value, DTensor):
        mesh = value.device_mesh
        return value.redistribute(mesh, [Replicate()] * mesh.ndim).to_local()
    if isinstance(value, list | tuple):
        return type(value)(replicated(v) for v in value)
    return value


def reshard_like(full: Any, mesh: Any, like: object) -> Any:
    """Full tensor `full` (the same on every rank) laid out like `like`.

    `like` is the tensor whose layout the result takes: its placements, Partial ones
    replicated (a full value carries no pending sum), as long as every placement is a
    (strided) shard of a dim `full` has, or a replicate: an output of another rank than
    its input keeps the input's layout where that layout means something for it. A plain
    tensor when `like` is plain (a gradient of a plain tensor); a replicated DTensor when
    `like` is None, on another mesh, or placed in a way `full` (or this torch's
    redistribute) cannot take.
    """
    import torch
    from torch.distributed.tensor import DTensor, Partial, Replicate

    from ..dtensors import as_dtensor

    if not isinstance(full, torch.Tensor):
        return full
    if like is not None and not isinstance(like, DTensor):
        return full
    out = as_dtensor(full, mesh, [Replicate()] * mesh.ndim, full.shape)
    if like is None or like.device_mesh != mesh:
        return out
    target = [Replicate() if isinstance(p, Partial) else p for p in like.placements]
    if all(_takes(full, p) for p in target):
        try:
            return out.redistribute(mesh, target)
        except ValueError:
            # torch 2.11 cannot order a strided shard that no plain shard precedes
            # ("unable to be interpreted into a corresponding shard_order"): the full
            # value stays replicated, as for any layout `full` cannot take.
            return out
    return out


def _takes(full: torch.Tensor, placement: object) -> bool:
    """Whether a full tensor can be laid out with `placement` by splitting it locally."""
    from torch.distributed.tensor import Replicate, Shard

    from ..compat.placements import is_strided_shard

    if isinstance(placement, Replicate):
        return True
    if isinstance(placement, Shard) or is_strided_shard(placement):
        return cast(Shard, placement).dim < full.ndim
    return False


def replicated_fallback(
    plugin: str,
    reason: str,
    op_call: Any,
    args: Sequence[object],
    kwargs: dict[str, object] | None = None,
    like: Sequence[object] = (),
) -> Any:
    """Run `op_call` on replicated inputs, exactly; output i laid out like `like[i]`.

    Outputs past `like` (and those whose `like` entry is None) stay replicated DTensors.
    """
    from torch.distributed.tensor import DTensor

    values = [*args, *(kwargs or {}).values()]
    mesh = next(v.device_mesh for v in _flat(values) if isinstance(v, DTensor))
    warn_fallback(plugin, str(getattr(op_call, "__name__", op_call)), reason, stacklevel=3)
    result = op_call(
        *(replicated(a) for a in args), **{k: replicated(v) for k, v in (kwargs or {}).items()}
    )
    if not isinstance(result, tuple | list):
        return reshard_like(result, mesh, like[0] if like else None)
    outs = [reshard_like(r, mesh, like[i] if i < len(like) else None) for i, r in enumerate(result)]
    return tuple(outs)


def _flat(values: Sequence[object]) -> list[object]:
    flat: list[object] = []
    for v in values:
        flat.extend(_flat(v) if isinstance(v, list | tuple) else [v])
    return flat
