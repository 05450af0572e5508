"""Process groups by registered name (custom ops take a group's name, not the group),
whether a group is torch's fake backend (one process standing in for a world: no peers),
and what a process has issued on its groups (counts, and the flight recorder's last
operations), which the test harness reports when ranks hang.

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


# What torch's flight recorder keeps: it records an operation when issued, and only in
# processes whose environment set this before their process groups were created.
FLIGHT_RECORDER_ENV = "TORCH_FR_BUFFER_SIZE"


def recent_operations(limit: int) -> list[dict[str, Any]]:
    """The last `limit` operations this process issued on any process group, oldest first,
    as torch's flight recorder kept them (none unless `FLIGHT_RECORDER_ENV` was set): the
    group's name, the operation, its sequence number on the group and its input sizes.
    Readable from another thread while the process waits in a collective, which is when
    it is wanted. Without the stacks the recorder also keeps: symbolizing them took
    longer than a stuck rank is given to answer."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import pickle

    from torch._C._distributed_c10d import _dump_fr_trace  # type: ignore[attr-defined]

    raw = _dump_fr_trace(includeStackTraces=False)
    entries = pickle.loads(raw).get("entries", [])  # noqa: S301 - torch's own bytes
    operations = []
    for entry in entries[-limit:] if limit > 0 else []:
        p2p = bool(entry.get("is_p2p"))
        operations.append(
            {
                "group": str(entry["process_group"][0]),
                "op": str(entry["profiling_name"]),
                "seq": int(entry["p2p_seq_id" if p2p else "collective_seq_id"]),
                "p2p": p2p,
                "sizes": entry.get("input_sizes"),
            }
        )
    return operations
