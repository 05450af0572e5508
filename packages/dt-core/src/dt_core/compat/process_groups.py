"""Process groups by registered name (custom ops take a group's name, not the group), and
whether a group is torch's fake backend (one process standing in for a world: no peers).

Checked against torch 2.11.x to 2.15.x (`CHECKED_WITH_TORCH`).
"""

from __future__ import annotations

from typing import Any

from . import ensure_supported_torch, torch_has

CHECKED_WITH_TORCH = ">=2.11.0,<2.16"


def resolve_process_group(group_name: str) -> Any:
    """The ProcessGroup registered under `group_name`."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch.distributed.distributed_c10d import GroupName, _resolve_process_group

    return _resolve_process_group(GroupName(group_name))


def is_fake_group(group_or_name: Any = None) -> bool:
    """Whether a group (a ProcessGroup, its registered name, or None for the default
    group) runs on torch's fake backend (`init_process_group("fake", ...)`): dry runs in
    one process, where no peer exists to wait for or share memory with.

    True only when every backend the group has is fake; a group with any real backend
    (say gloo on CPU, fake on CUDA) is real, so real groups always take the real path.
    Cheap (no communication), so handlers ask once per call."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    if not torch_has("torch._C._distributed_c10d", "FakeProcessGroup"):
        return False
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import FakeProcessGroup

    group = group_or_name
    if isinstance(group, str):
        group = resolve_process_group(group)
    elif group is None:
        if not dist.is_initialized():
            return False
        group = dist.distributed_c10d._get_default_group()
    device_types = list(getattr(group, "_device_types", ()))
    if not device_types:
        return False
    backends = [group._get_backend(torch.device(kind)) for kind in device_types]
    return all(isinstance(backend, FakeProcessGroup) for backend in backends)


def collective_counts() -> dict[str, int]:
    """How many operations this process has issued on each process group it belongs to,
    by the group's registered name (collectives and point-to-point sends alike). After a
    task every rank ran to the end, ranks that share a group and differ either ran an
    uneven point-to-point pattern or issued a collective on some ranks only, which a later
    one would pair with (a hang, or another call's data). Empty when no group."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not dist.is_initialized():
        return {}
    counts: dict[str, int] = {}
    for group in list(c10d._world.pg_map):
        try:
            # the group's operation counter (collectives and point-to-point alike)
            count = group._get_sequence_number_for_group()  # type: ignore[attr-defined]
            counts[str(group.group_name)] = int(count)
        except (RuntimeError, AttributeError):  # a backend that keeps no count
            continue
    return counts
