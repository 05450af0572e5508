"""DTensor placement types torch keeps private: `_StridedShard`, the layout FSDP2 gives a
dim that TP already shards. dt-core's replicated fallback must recognise it, and
dt-fsdp-passes builds it, so the area is dt-core's.

Checked against torch 2.11.x to 2.15.x (`CHECKED_WITH_TORCH`).
"""

from __future__ import annotations

from typing import Any

from . import ensure_supported_torch

CHECKED_WITH_TORCH = ">=2.11.0,<2.16"


def strided_shard(dim: int, split_factor: int) -> Any:
    """A Shard(dim) placement applied before the later mesh dims' shards of the same tensor
    dim (torch's `_StridedShard`): FSDP's layout over a TP-sharded dim, as FSDP2 stores it."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch.distributed.tensor.placement_types import _StridedShard

    return _StridedShard(dim, split_factor=split_factor)


def is_strided_shard(placement: Any) -> bool:
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch.distributed.tensor.placement_types import _StridedShard

    return isinstance(placement, _StridedShard)
