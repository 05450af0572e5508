"""Which process groups carry FSDP collectives, as simple_fsdp saw them.

simple_fsdp records the group of each FSDP mesh dim, and the groups of the parameters'
own dims (TP, spatial, ...). A graph can hold collectives of both kinds that look alike
(a sequence-parallel all-gather of an activation derives from one graph input, as an
FSDP gather does); the passes leave collectives on a parameter's own-dim group to the
passes meant for them (dt-symm-mem's all-gather-matmul fusion, for instance). The sets
are part of the passes' settings, hence of their cache key.
"""

from __future__ import annotations

from typing import Any

_fsdp: set[str] = set()  # groups of FSDP shard dims (all-gather, reduce-scatter)
_replicate: set[str] = set()  # groups of HSDP replicate dims (gradient all-reduce)
_own: set[str] = set()  # groups of parameters' own dims (TP, spatial, ...)


def _names(mesh: Any) -> list[str]:
    return [mesh.get_group(i).group_name for i in range(mesh.ndim)]


def register(fsdp_mesh: Any, own_meshes: list[Any]) -> None:
    """Record the groups of an FSDP (1-D) or HSDP (2-D) mesh and of the parameters' meshes."""
    names = _names(fsdp_mesh)
    _fsdp.add(names[-1])
    if len(names) == 2:
        _replicate.add(names[0])
    for mesh in own_meshes:
        _own.update(_names(mesh))


def is_parameter_own_group(group_name: str) -> bool:
    """A group simple_fsdp saw only as a parameter's own (TP / spatial) dim: not FSDP."""
    return group_name in _own and group_name not in _fsdp


def is_replicate_group(group_name: str) -> bool:
    return group_name in _replicate


def as_dict() -> dict[str, list[str]]:
    return {
        "fsdp_groups": sorted(_fsdp),
        "replicate_groups": sorted(_replicate),
        "own_groups": sorted(_own),
    }
