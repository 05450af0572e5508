"""torch.distributed's one-tensor all-gather and reduce-scatter, by the name this torch
gives them: `all_gather_single` / `reduce_scatter_single` from 2.13 on (the older names
are deprecated there), `all_gather_into_tensor` / `reduce_scatter_tensor` before. Both
are public API; only the names moved, the semantics are the same."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def all_gather_single(out: torch.Tensor, src: torch.Tensor, group: Any = None) -> None:
    """`out` = every rank's `src`, concatenated along dim 0 in rank order."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, src, group=group)


def reduce_scatter_single(out: torch.Tensor, src: torch.Tensor, group: Any = None) -> None:
    """`out` = this rank's dim-0 chunk of the sum of every rank's `src`."""
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    scatter(out, src, group=group)
