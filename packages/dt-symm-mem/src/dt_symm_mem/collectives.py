"""torch.distributed's one-tensor all-gather and reduce-scatter, by the name this torch
gives them: `all_gather_single` / `reduce_scatter_single` from 2.13 on (the older names
are deprecated there), `all_gather_into_tensor` / `reduce_scatter_tensor` before. Both
are public API; only the names moved, the semantics are the same.

On torch's fake backend (one process standing in for a world: dry runs) the outputs are
first filled as if every rank held this rank's value: before 2.13 its collectives write
nothing, and a dry run's model would go on with uninitialized memory."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from dt_core.compat.process_groups import is_fake_group

# Decided once, at import: the name this torch has.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather_single(out: torch.Tensor, src: torch.Tensor, group: Any = None) -> None:
    """`out` = every rank's `src`, concatenated along dim 0 in rank order."""
    if is_fake_group(group):
        out.view(-1, *src.shape).copy_(src)
    _ALL_GATHER(out, src, group=group)


def reduce_scatter_single(out: torch.Tensor, src: torch.Tensor, group: Any = None) -> None:
    """`out` = this rank's dim-0 chunk of the sum of every rank's `src`."""
    if is_fake_group(group):
        out.copy_(src.view(-1, *out.shape)[dist.get_rank(group)])
    _REDUCE_SCATTER(out, src, group=group)


def all_to_all_single(out: torch.Tensor, src: torch.Tensor, group: Any = None) -> None:
    """`out[r]` = rank r's `src[this rank]` (dim-0 chunks)."""
    if is_fake_group(group):
        out.copy_(src)
    dist.all_to_all_single(out, src, group=group)
