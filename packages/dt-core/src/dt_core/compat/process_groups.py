"""Process groups by registered name: custom ops take a group's name, not the group.

Checked against torch 2.13.x and 2.14.x (`CHECKED_WITH_TORCH`).
"""

from __future__ import annotations

from typing import Any

from . import ensure_supported_torch

CHECKED_WITH_TORCH = ">=2.13.0,<2.15"


def resolve_process_group(group_name: str) -> Any:
    """The ProcessGroup registered under `group_name`."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch.distributed.distributed_c10d import GroupName, _resolve_process_group

    return _resolve_process_group(GroupName(group_name))
