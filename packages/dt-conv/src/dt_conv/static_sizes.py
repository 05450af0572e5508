"""Traced with dynamic shapes: which sizes a handler reads as plain ints, decided once.

A halo exchange's rows depend on the sizes of the dims an op slides along (which rank
sends which rows), so those sizes must be known numbers when the op is traced: the
compiled graph holds one exchange per size, and Dynamo recompiles when a size changes,
as it does for any specialized dim. The batch dim takes no part in the exchange and
stays symbolic, so a compiled net serves every batch size with one graph.

This is decided at the handler's boundary, once per call (`with_static_sizes`), and in
the first trace that sees the call (Dynamo's). Specializing later, in the middle of one
of AOTAutograd's traces, would leave its traces disagreeing on which output sizes are
symbolic, and its partitioner fails ("Node ... was invalid, but is output"): that is
what a second compile of a sharded conv net with other sizes or placements hit on torch
2.14 and 2.15 when sizes were turned into numbers deep inside the handlers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch
from dt_core.dtensors import as_dtensor
from dt_core.tracing import is_tracing, simulates_ranks
from torch.distributed.tensor import DTensor

T = TypeVar("T")


def _symbolic(sizes: Sequence[Any]) -> bool:
    return any(isinstance(s, torch.SymInt) for s in sizes)


def _pinned(sizes: Sequence[Any], keep_first: bool) -> list[Any]:
    """`sizes` with every SymInt made a plain int (a guard on its value), except the
    first when `keep_first`."""
    return [
        s if (keep_first and i == 0) or not isinstance(s, torch.SymInt) else int(s)
        for i, s in enumerate(sizes)
    ]


def static_sizes(x: T, keep_batch: bool) -> T:
    """`x` itself, or, for a traced DTensor with symbolic sizes, the same DTensor whose
    global and local sizes are plain ints on every dim but the batch (`keep_batch`).
    Eager and simulated ranks are left alone: LocalTensorMode's sizes are SymInts that
    hold each rank's value, not symbols to guard on."""
    if not isinstance(x, DTensor) or not is_tracing(x) or simulates_ranks(x):
        return x
    return _pinned_dtensor(x, keep_batch)  # type: ignore[return-value]


def _pinned_dtensor(x: DTensor, keep_batch: bool) -> DTensor:
    """`x` with its symbolic sizes made plain ints but the batch's (`keep_batch`)."""
    local = x.to_local()
    if not (_symbolic(x.shape) or _symbolic(local.shape)):
        return x
    shape = _pinned(x.shape, keep_batch)
    local_shape = _pinned(local.shape, keep_batch)
    if local_shape != list(local.shape):
        local = local.view(local_shape)
    return as_dtensor(local, x.device_mesh, x.placements, shape)


def keeps_batch(x: torch.Tensor, worked: int) -> bool:
    """Whether dim 0 of `x` is a batch the op does not slide along: `x` has a batch and
    channels besides the `worked` trailing dims the op slides along."""
    return x.ndim >= 3 and worked < x.ndim


def worked_dims(name: str, args: tuple) -> int:
    """How many trailing dims the op slides along (pads: as many as their pad list
    names; every other handled op: all but batch and channels)."""
    if "pad" in name:
        pads = next((a for a in args[1:] if isinstance(a, (list, tuple))), None)
        if pads is not None:
            return len(pads) // 2
    x = args[0] if args else None
    return x.ndim - 2 if isinstance(x, torch.Tensor) else 0


def with_static_sizes(name: str, args: tuple) -> tuple:
    """`args` with each DTensor's sizes static where the op needs numbers: every dim but
    the batch, which stays symbolic unless the op slides along it (a pad reaching dim 0,
    an input with fewer than 3 dims). Decided once for the call: eager calls (and
    simulated ranks) return `args` after one check."""
    dtensors = [a for a in args if isinstance(a, DTensor)]
    if not dtensors or not is_tracing(*dtensors) or simulates_ranks(*dtensors):
        return args
    worked = worked_dims(name, args)
    return tuple(
        _pinned_dtensor(a, keeps_batch(a, worked)) if isinstance(a, DTensor) else a for a in args
    )
