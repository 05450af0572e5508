"""Private torch APIs the FSDP front end and its passes run on (dt-fsdp-passes); checked
against torch 2.13.x (`CHECKED_WITH_TORCH`, passed to the shared version check).

Interface:
    fake_mode_for(values) -> FakeTensorMode | None   (the fake mode of a post-grad graph)
    same_rank_map(a, b), concatenate_meshes([m, ...]) (n-D meshes for DTensor parameters)
    strided_shard(dim, split_factor), is_strided_shard(p)  (FSDP over a TP-sharded dim)
    flatten_mesh(mesh, name)                         (one dim from several: dp x cp)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import ensure_supported_torch

CHECKED_WITH_TORCH = ">=2.13.0,<2.14"


def fake_mode_for(values: Iterable[Any]) -> Any:
    """The FakeTensorMode that produced `values` (node.meta["val"] of a graph), or None."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch._guards import detect_fake_mode

    return detect_fake_mode(list(values))


def same_rank_map(a: Any, b: Any) -> bool:
    """Whether two meshes index the same arrangement of ranks (torch's condition for
    joining their dims): sub-meshes of one root, or of equal roots. torch caches sliced
    meshes by layout, so a slice may report another equal root as its own."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    return a.device_type == b.device_type and a._flatten_rank_map == b._flatten_rank_map


def concatenate_meshes(meshes: list[Any]) -> Any:
    """One DeviceMesh whose dims are the dims of `meshes` in turn (all from one root).

    Raises ValueError when they come from different roots or share ranks along a dim
    (overlap), or when a mesh has no dim names (torch needs them to join meshes).
    """
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch.distributed.device_mesh import DeviceMesh

    if any(m.mesh_dim_names is None for m in meshes):
        raise ValueError(f"meshes without mesh_dim_names cannot be joined: {meshes}")
    try:
        return DeviceMesh._concatenate(list(meshes))
    except RuntimeError as exc:
        raise ValueError(str(exc)) from exc


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


def flatten_mesh(mesh: Any, name: str) -> Any:
    """One mesh dim from all of `mesh`'s dims (torchtitan's dp x cp FSDP mesh), named
    `name`; DeviceMesh._flatten in torch 2.13."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    return mesh._flatten(name)
