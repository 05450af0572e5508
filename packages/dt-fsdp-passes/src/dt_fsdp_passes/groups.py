"""Which process groups carry FSDP collectives: the ones simple_fsdp sharded over.

A graph can hold collectives that look like FSDP's but are not: a sequence-parallel
all-gather of an activation derives from one graph input, as an FSDP gather of a shard
does, and a TP matmul -> reduce-scatter looks like a gradient reduce-scatter. The passes
bucket only collectives on groups simple_fsdp registered (FSDP shard dims; HSDP
replicate dims for the gradient all-reduce) and leave the rest to the passes meant for
them (dt-symm-mem's collective-matmul fusion). The sets are part of the passes'
settings, hence of their cache key. They are records of earlier calls: `dt_core.forget()`
drops them (the test harness does after every test), so a group FSDP once sharded over
does not make a later tensor-parallel graph on the same group read as FSDP's.
"""

from __future__ import annotations

from typing import Any

from dt_core.remembered import on_forget

_fsdp: set[str] = set()  # groups of FSDP shard dims (all-gather, reduce-scatter)
_replicate: set[str] = set()  # groups of HSDP replicate dims (gradient all-reduce)


def register(fsdp_mesh: Any) -> None:
    """Record the groups of an FSDP (1-D) or HSDP (2-D: replicate, shard) mesh."""
    names = [fsdp_mesh.get_group(i).group_name for i in range(fsdp_mesh.ndim)]
    _fsdp.add(names[-1])
    if len(names) == 2:
        _replicate.add(names[0])


def mark_fsdp_group(group_name: str) -> None:
    """Treat collectives on `group_name` as FSDP's (graphs built without simple_fsdp)."""
    _fsdp.add(group_name)


def is_fsdp_group(group_name: str) -> bool:
    return group_name in _fsdp


def is_replicate_group(group_name: str) -> bool:
    return group_name in _replicate


def as_dict() -> dict[str, list[str]]:
    return {"fsdp_groups": sorted(_fsdp), "replicate_groups": sorted(_replicate)}


@on_forget
def forget_groups() -> None:
    """Forget every group registered so far (`dt_core.forget()`)."""
    _fsdp.clear()
    _replicate.clear()
