"""Private torch APIs the FSDP front end and its passes run on (dt-fsdp-passes' own compat
area); checked against torch 2.11.x to 2.15.x (`CHECKED_WITH_TORCH`, passed to dt-core's
shared version check). `_StridedShard` is dt-core's area (`dt_core.compat.placements`):
dt-core's fallback reads it too.

Interface:
    fake_mode_for(values) -> FakeTensorMode | None   (the fake mode of a post-grad graph)
    same_rank_map(a, b), concatenate_meshes([m, ...]) (n-D meshes for DTensor parameters)
    flatten_mesh(mesh, name)                         (one dim from several: dp x cp)
    fresh_sharding_cache_per_compile_patch() -> Patch (torch's DTensor cache vs. tracing)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from dt_core.compat import ensure_supported_torch
from dt_core.contributions import Patch

CHECKED_WITH_TORCH = ">=2.11.0,<2.16"


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


def flatten_mesh(mesh: Any, name: str) -> Any:
    """One mesh dim from all of `mesh`'s dims (torchtitan's dp x cp FSDP mesh), named
    `name`; DeviceMesh._flatten in torch 2.13."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    return mesh._flatten(name)


def _clearing_sharding_cache_first(original: Callable[..., None]) -> Callable[..., None]:
    """torch's `run_start_callbacks` (`original`), after emptying DTensor's C++ sharding
    propagation cache."""
    import torch

    def run_start_callbacks(self: Any, args: Any) -> None:
        torch._C._clear_DTensor_sharding_propagator_cache()
        original(self, args)

    return run_start_callbacks


def fresh_sharding_cache_per_compile_patch() -> Patch:
    """Empty DTensor's C++ sharding cache whenever a torch.compile starts (a dt-core Patch
    of Dynamo's compile-start callback runner; dt-fsdp-passes contributes it).

    torch 2.13's C++ DTensor dispatch caches each op's output sharding by value: an
    equal DeviceMesh (same ranks, layout and names) hits an entry made with another mesh
    object, e.g. `mesh["tp"]` sliced again (each slice is a new object), and the entry's
    output spec carries that old object. Unlike the Python cache, the C++ one is used
    while tracing. Under AOTAutograd a DTensor's mesh is an opaque graph input tracked by
    object identity, so a DTensor output whose mesh came from such a hit names a mesh no
    graph input holds; the tangent AOTAutograd builds from that output then provides it,
    and the forward graph returns a tangent: the partitioner fails with "Node tangents_N
    was invalid, but is output". It happens only after an eager run of the same op
    shapes in the process filled the cache (an earlier test or training phase). Emptying
    the cache when a compile begins makes every entry used while tracing one made with
    this trace's meshes; eager code pays one cache miss per op after each compile.
    """
    ensure_supported_torch(CHECKED_WITH_TORCH)
    return Patch(
        "torch._dynamo.callback:CompilationCallbackHandler",  # patched once torch imports it
        "run_start_callbacks",
        _clearing_sharding_cache_first,
        torch_versions=CHECKED_WITH_TORCH,
        wrap_original=True,
    )
