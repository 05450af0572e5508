"""Private torch APIs used by the `fsdp-passes` plugin (dt-fsdp-passes); checked against
torch 2.13.x (`CHECKED_WITH_TORCH`, passed to the shared version check).

Interface:
    fake_mode_for(values) -> FakeTensorMode | None   (the fake mode of a post-grad graph)
    run_and_get_code(fn, *args) -> (result, [source]) (Inductor's generated code)
    compile_counters() -> dict                       (Inductor + AOTAutograd event counters)
    clear_compile_counters()
    compile_caches(enabled) -> context manager       (FX graph + AOT autograd caches on/off)
    pin_order(graph, deps)                           (control deps Inductor keeps)
    same_rank_map(a, b), concatenate_meshes([m, ...]) (n-D meshes for DTensor parameters)
    strided_shard(dim, split_factor), is_strided_shard(p)  (FSDP over a TP-sharded dim)
    flatten_mesh(mesh, name)                         (one dim from several: dp x cp)
    fresh_sharding_cache_per_compile_patch() -> Patch (torch's DTensor cache vs. tracing)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

from ..contributions import Patch
from . import ensure_supported_torch

CHECKED_WITH_TORCH = ">=2.13.0,<2.14"


def fake_mode_for(values: Iterable[Any]) -> Any:
    """The FakeTensorMode that produced `values` (node.meta["val"] of a graph), or None."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch._guards import detect_fake_mode

    return detect_fake_mode(list(values))


def run_and_get_code(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """Run `fn` (which compiles with Inductor) and return its result and generated code."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch._inductor.utils import run_and_get_code as _run_and_get_code

    return _run_and_get_code(fn, *args, **kwargs)


def compile_counters() -> dict[str, int]:
    """Copies of Inductor's and AOTAutograd's event counters, merged (fxgraph_cache_hit,
    fxgraph_cache_miss, autograd_cache_hit, autograd_cache_miss, ...)."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch._dynamo.utils import counters

    return {**counters["inductor"], **counters["aot_autograd"]}


def clear_compile_counters() -> None:
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch._dynamo.utils import counters

    counters["inductor"].clear()
    counters["aot_autograd"].clear()


def compile_caches(enabled: bool) -> AbstractContextManager[Any]:
    """Turn Inductor's FX graph cache and AOTAutograd's cache on or off for a block.

    Off makes every compile run the graph passes (kernel code caches stay on, so the
    C++ compile of an unchanged kernel is still reused).
    """
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import contextlib

    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    stack = contextlib.ExitStack()
    stack.enter_context(inductor_config.patch(fx_graph_cache=enabled))
    stack.enter_context(functorch_config.patch(enable_autograd_cache=enabled))
    return stack


def pin_order(graph: Any, deps: dict[Any, list[Any]]) -> None:
    """Make each node in `deps` run after the nodes listed for it, in Inductor's scheduler too.

    Inductor's scheduler reorders for peak memory and would move a prefetched all-gather
    back next to its wait; control dependencies (the `control_deps` higher-order op, as
    Inductor's own overlap scheduler uses) keep the order an FX pass chose.
    """
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch._inductor.fx_passes.control_dependencies import preserve_node_ordering
    from torch.utils._ordered_set import OrderedSet

    preserve_node_ordering(graph, {node: OrderedSet(after) for node, after in deps.items()})


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
        "torch._dynamo.callback:CompilationCallbackHandler",  # imported at install
        "run_start_callbacks",
        _clearing_sharding_cache_first,
        torch_versions=CHECKED_WITH_TORCH,
        wrap_original=True,
    )
