"""The executor of each path the plan decides (`CpPlan.path`): one table, no decisions.

The plan decides once where a call runs (`plan.choose_path`); the handlers look the
path up here. This module imports both `algorithms` and `simulated`, so neither has to
import the other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from . import algorithms, simulated
from .blocks import KV, AttentionSpec, Grads, Saved, gathered_backward, gathered_forward
from .layout import Shards
from .plan import Path

Forward = Callable[
    [AttentionSpec, Shards, torch.Tensor, KV], tuple[torch.Tensor, torch.Tensor, torch.Tensor]
]
Backward = Callable[[AttentionSpec, Shards, Saved, KV], Grads]


class Executor(NamedTuple):
    """forward: (out, lse, max score) of the local queries (max is -inf unless the math
    kernel ran); backward: dq, dk, dv of the local shards (dK/dV summed over ranks)."""

    forward: Forward
    backward: Backward


EXECUTORS: dict[Path, Executor] = {
    "local": Executor(gathered_forward, gathered_backward),
    "simulated": Executor(simulated.forward, simulated.backward),
    "traced": Executor(algorithms.traced_forward, algorithms.traced_backward),
    "ring": Executor(algorithms.ring_forward, algorithms.ring_backward),
    "allgather": Executor(algorithms.allgather_forward, algorithms.allgather_backward),
}
