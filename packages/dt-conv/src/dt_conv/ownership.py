"""Which calls dt-conv owns, and which it hands back to torch's own DTensor dispatch.

Audited against torch 2.13.0 and 2.14.1 alone (`tests/test_handover.py` keeps the audit):
for constant padding, max pooling and interpolation, torch is exact whatever the
placements, but gathers a sharded windowed dim whole (`Replicate`), which defeats spatial
parallelism. dt-conv owns exactly those calls, a windowed dim sharded, and keeps them
sharded with halos; every other call (Partial, Replicate, batch or channel shards) goes
to torch, which keeps `Partial` where the op commutes with the sum (a zero pad,
interpolation) and reduces it where not. Convolution, average pooling and reflect /
replicate padding stay dt-conv's on every placement: torch alone raises for them or,
for convolution with a sharded spatial dim, returns wrong values. So do the shared ops
this torch has no sharding strategy for (max_pool3d's backward up to torch 2.14, the
antialiased interpolations): handed to torch they would raise.
"""

from __future__ import annotations

from typing import Any

from torch.distributed.tensor import DTensor, Shard

from .handled_ops import CONSTANT_PAD, MAX_POOL, UPSAMPLE, backward_of

# ops torch computes exactly on every placement (the audit), by aten name
SHARED_WITH_TORCH = frozenset(
    (*CONSTANT_PAD, *MAX_POOL, *backward_of(MAX_POOL), *UPSAMPLE, *backward_of(UPSAMPLE))
)


def windowed_dims(name: str, args: tuple, kwargs: dict) -> int:
    """How many trailing dims op `name` slides a window along (pads, pools, resamples)."""
    if name in CONSTANT_PAD:
        pad = args[1] if len(args) > 1 else kwargs["pad"]
        return len(pad) // 2
    for n in (1, 2, 3):
        if f"{n}d" in name:
            return n
    raise ValueError(f"dt-conv: no windowed dims known for aten.{name}")


def torch_owns(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether torch's own dispatch computes this call as dt-conv would want: the op is
    shared with torch, this torch has a sharding strategy for it (none for
    max_pool3d's backward up to 2.14, nor the antialiased interpolations: torch would
    raise, dt-conv's path is exact) and no DTensor argument is sharded along a windowed
    dim."""
    if name not in SHARED_WITH_TORCH or not _torch_has_strategy(name):
        return False
    count = windowed_dims(name, args, kwargs)
    return not any(_shards_windowed_dim(a, count) for a in (*args, *kwargs.values()))


def _torch_has_strategy(name: str) -> bool:
    import torch
    from dt_core.compat.sharding_rules import has_sharding_entry

    return has_sharding_entry(getattr(torch.ops.aten, name).default)


def _shards_windowed_dim(value: Any, count: int) -> bool:
    if not isinstance(value, DTensor):
        return False
    ndim = value.ndim
    return any(isinstance(p, Shard) and p.dim % ndim >= ndim - count for p in value.placements)
