"""Count the collectives eager code issues: what a sharded model's step moves, by op.

`CommDebugMode` does this too, but its module tracker fails on some models (an in-place
add inside a forward hook); this counts ops alone. A dispatch mode that steps aside for
DTensor arguments sees the ops DTensor's dispatch runs on local tensors, so each
collective a handler or a redistribute issues is counted once, where it runs. For
compiled code, count the collectives in the generated code instead
(`dt_core.testing.compiled.collective_counts`).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

# Namespaces of torch's collectives: functional (what DTensor and the plugins issue) and
# the c10d ops behind `torch.distributed`'s functions; and DTensor's own all-to-all.
COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d")
OTHER_COLLECTIVES = ("_dtensor::shard_dim_alltoall",)
NOT_COLLECTIVES = ("wait_tensor", "barrier", "monitored_barrier", "_wrap_tensor_autograd")


def collective_name(op: Any) -> str | None:
    """`op`'s name without namespace if it is a collective, else None."""
    full = op._schema.name
    namespace, _, name = full.partition("::")
    if full in OTHER_COLLECTIVES:
        return name
    if namespace in COLLECTIVE_NAMESPACES and name not in NOT_COLLECTIVES:
        return name
    return None


class CollectiveCounts(Counter[str]):
    """Calls per collective name; `largest[name]`: the most elements one call sent."""

    def __init__(self) -> None:
        super().__init__()
        self.largest: dict[str, int] = {}

    def add(self, name: str, elements: int) -> None:
        self[name] += 1
        self.largest[name] = max(self.largest.get(name, 0), elements)


def _elements(args: tuple) -> int:
    """What a collective sends: the elements of its first tensor argument (or list)."""
    import torch

    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg.numel()
        if isinstance(arg, (list, tuple)) and arg and isinstance(arg[0], torch.Tensor):
            return sum(t.numel() for t in arg)
    return 0


@contextlib.contextmanager
def counting_collectives() -> Iterator[CollectiveCounts]:
    """`with counting_collectives() as counts:` -> counts["all_to_all_single"], ... for
    the collectives run in the block (eager code; DTensor or plain tensors)."""
    from torch.distributed.tensor import DTensor

    from ..compat.tracing import dispatch_mode_base

    counts = CollectiveCounts()

    class _Counting(dispatch_mode_base()):  # type: ignore[misc]
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(issubclass(t, DTensor) for t in types):
                return NotImplemented  # DTensor first; its local ops come back here
            name = collective_name(func)
            if name is not None:
                counts.add(name, _elements(args))
            return func(*args, **(kwargs or {}))

    with _Counting():
        yield counts
