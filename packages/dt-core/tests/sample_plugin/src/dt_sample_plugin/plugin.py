"""Hookimpls of the sample plugin. Light at import: torch pieces load inside the hooks."""

from __future__ import annotations

from typing import Any

from dt_core import GraphPass, LibraryOps, OpHandler, Patch, ShardingStrategy, hookimpl

DT_API = ">=1.1,<2"  # dt-core hook API this plugin is written for (1.1: dt_patches)

# Tests read and change these.
PASS_SETTINGS: dict[str, Any] = {"mode": "count"}
pass_calls: list[int] = []  # node counts of the graphs the pass saw
handler_calls: list[str] = []
repr_calls: list[str] = []  # class names DTensor.__repr__ was called for


def _define_scale(lib: Any) -> None:
    import torch

    lib.define("scale(Tensor x, float alpha) -> Tensor")

    def scale_cpu(x: torch.Tensor, alpha: float) -> torch.Tensor:
        return x * alpha

    lib.impl("scale", scale_cpu, "CPU")
    torch.library.register_fake("dt_sample::scale", lambda x, alpha: torch.empty_like(x), lib=lib)


@hookimpl
def dt_library_ops() -> list[LibraryOps]:
    return [LibraryOps("dt_sample", _define_scale, ops=["dt_sample::scale"], kind="DEF")]


def _scale_placements(x_spec: Any, alpha: float) -> list[tuple[list[Any], list[Any]]]:
    from torch.distributed.tensor import Replicate, Shard

    options: list[tuple[list[Any], list[Any]]] = [([Replicate()], [Replicate(), None])]
    options += [([Shard(d)], [Shard(d), None]) for d in range(x_spec.ndim)]
    return options


@hookimpl
def dt_sharding_strategies() -> list[ShardingStrategy]:
    import torch

    return [
        ShardingStrategy(torch.ops.dt_sample.scale.default, _scale_placements, kind="placements")
    ]


def _is_same_size(op_call: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    handler_calls.append(str(op_call))
    return args[0].shape == args[1].shape


@hookimpl
def dt_op_handlers() -> list[OpHandler]:
    import torch

    return [OpHandler(torch.ops.aten.is_same_size.default, _is_same_size)]


def count_nodes(graph: Any) -> None:
    pass_calls.append(len(graph.nodes))


@hookimpl
def dt_graph_passes() -> list[GraphPass]:
    return [GraphPass("count_nodes", count_nodes, settings=lambda: dict(PASS_SETTINGS))]


def _counting_repr(original: Any) -> Any:
    def __repr__(self: Any) -> str:
        repr_calls.append(type(self).__name__)
        return original(self)

    return __repr__


@hookimpl
def dt_patches() -> list[Patch]:
    # Named, not imported: listing the plugin must not import DTensor.
    # DTensor.__repr__ is there in every torch from the window's oldest release on.
    from dt_core.compat import TESTED_TORCH_RANGE

    target = "torch.distributed.tensor:DTensor"
    fits = f">={TESTED_TORCH_RANGE[0]}"
    return [Patch(target, "__repr__", _counting_repr, fits, wrap_original=True)]
