"""One process simulating N ranks: torch's LocalTensorMode over a fake process group.

Where spawning a world costs seconds per size, a simulated one costs nothing: sweeps over
shapes and world sizes (2-8) run here, and the multi-process tests keep what only real
processes show (overlap, shared memory, hangs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..compat import local_tensor as compat
from ..inactive_notes import explain_errors

if TYPE_CHECKING:  # importing dt_core.testing (pytest loads it) must not import torch
    import torch


@contextlib.contextmanager
def simulated_ranks(world_size: int) -> Iterator[Any]:
    """`with simulated_ranks(4) as mode:` DTensor code inside runs for 4 ranks at once.
    An error leaving the block names the inactive plugins that handle its op."""
    with explain_errors(), compat.fake_process_group(world_size):
        with compat.local_tensor_mode_type()(world_size) as mode:
            yield mode


def per_rank(mode: Any, make: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """A LocalTensor holding `make(r)` on simulated rank r."""
    return mode.rank_map(make)


def rank_values(t: torch.Tensor, world_size: int) -> list[torch.Tensor]:
    """The plain tensor each simulated rank holds (a plain tensor: the same on every rank)."""
    if compat.is_local_tensor(t):
        values = compat.rank_values(t)
        return [values[r] for r in range(world_size)]
    return [t] * world_size
