"""Hookimpls of the `conv` plugin.

Light at import, and the hook itself imports only `torch`: the handler modules import
`torch.distributed.tensor`, whose first import is what triggers the hook, so they load
on the first call instead (importing them here would re-enter activation).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

from dt_core import GraphPass, LibraryOps, OpHandler, hookimpl

DT_API = ">=1.0,<2"  # dt-core hook API this plugin is written for

# aten op name -> "module:function" of its handler (modules of this package).
HANDLERS = {
    "convolution": "forward:convolution_handler",
    "convolution_backward": "backward:convolution_backward_handler",
    "max_pool2d_with_indices": "pooling:max_pool_with_indices",
    "max_pool3d_with_indices": "pooling:max_pool_with_indices",
    "max_pool2d_with_indices_backward": "pooling:max_pool_with_indices_backward",
    "max_pool3d_with_indices_backward": "pooling:max_pool_with_indices_backward",
    "avg_pool2d": "pooling:avg_pool",
    "avg_pool3d": "pooling:avg_pool",
    "avg_pool2d_backward": "pooling:avg_pool_backward",
    "avg_pool3d_backward": "pooling:avg_pool_backward",
    "constant_pad_nd": "padding:constant_pad",
    **{
        f"{mode}_pad{n}d": "padding:mode_pad"
        for mode in ("reflection", "replication")
        for n in (1, 2, 3)
    },
    **{
        f"{mode}_pad{n}d_backward": "padding:mode_pad_backward"
        for mode in ("reflection", "replication")
        for n in (1, 2, 3)
    },
    **{
        f"{op}{n}d": "interpolate:upsample"
        for op in ("upsample_nearest", "_upsample_nearest_exact")
        for n in (1, 2, 3)
    },
    **{
        f"{op}{n}d_backward": "interpolate:upsample_backward"
        for op in ("upsample_nearest", "_upsample_nearest_exact")
        for n in (1, 2, 3)
    },
    "upsample_linear1d": "interpolate:upsample",
    "upsample_bilinear2d": "interpolate:upsample",
    "upsample_trilinear3d": "interpolate:upsample",
    "upsample_linear1d_backward": "interpolate:upsample_backward",
    "upsample_bilinear2d_backward": "interpolate:upsample_backward",
    "upsample_trilinear3d_backward": "interpolate:upsample_backward",
}


def _outside_dynamo(fn: Callable[..., object]) -> Callable[..., object]:
    """`fn`, never compiled by Dynamo as user code. Dynamo traces DTensor ops by running
    them on fake tensors (the handlers trace through functional collectives); where a
    compiled function runs DTensor ops eagerly (after a graph break), this keeps Dynamo
    from compiling the handlers' own frames. The wrapper is made only once torch._dynamo
    is loaded: before that nothing compiles, and it costs a lot to import."""
    wrapped: Callable[..., object] | None = None

    def call(*args: Any) -> object:
        nonlocal wrapped
        if "torch._dynamo" not in sys.modules:
            return fn(*args)
        if wrapped is None:
            import torch

            wrapped = torch.compiler.disable(fn)
        return wrapped(*args)

    return call


def _ranks() -> Any:
    return importlib.import_module("dt_conv.ranks")


def _lazy(target: str) -> Callable[..., object]:
    module, name = target.split(":")

    def run(op_call: Any, args: tuple, kwargs: dict) -> object:
        validate = importlib.import_module("dt_conv.validate")
        if "backward" not in op_call.__name__:  # backward runs only after forward passed
            validate.raise_like_torch(op_call, args, kwargs)
        if validate.simulated_ranks(args, kwargs) and not _ranks().simulated():
            from dt_conv.fallback import replicated_op

            return replicated_op(str(op_call), op_call, args, kwargs)
        return getattr(importlib.import_module(f"dt_conv.{module}"), name)(op_call, args, kwargs)

    handler = _outside_dynamo(run)
    handler.__qualname__ = handler.__name__ = f"{module}_{name}"
    return handler


def _circular_pad(x: Any, pad: Any) -> Any:
    from dt_conv.padding import circular_pad

    return circular_pad(x, pad)


_circular_pad_outside_dynamo = _outside_dynamo(_circular_pad)


# Composite ops that decompose before DTensor sees them get an autograd kernel instead.
COMPOSITE_KEYS = ("AutogradCPU", "AutogradCUDA")


def _pad_circular(x: Any, pad: Any) -> Any:
    """`aten::_pad_circular`: the halo path for DTensors, torch's decomposition otherwise."""
    import torch

    tensor_module = sys.modules.get("torch.distributed.tensor")
    if tensor_module is not None and isinstance(x, tensor_module.DTensor):
        return _circular_pad_outside_dynamo(x, pad)
    return torch.ops.aten._pad_circular.default.decompose(x, pad)


# `F.interpolate`'s composite entry ops, decomposed by torch's Python dispatcher while
# tracing unless dt-conv's autograd kernel takes DTensors first (`interpolate_vec`).
UPSAMPLE_VEC = tuple(
    f"{op}{n}d"
    for op, ns in (
        ("upsample_linear", (1,)),
        ("upsample_bilinear", (2,)),
        ("upsample_trilinear", (3,)),
        ("upsample_nearest", (1, 2, 3)),
        ("_upsample_nearest_exact", (1, 2, 3)),
    )
    for n in ns
)


def _upsample_vec_kernel(name: str) -> Callable[..., object]:
    def kernel(x: Any, *args: Any) -> object:
        from dt_conv.interpolate_vec import upsample_vec

        return upsample_vec(name, x, *args)

    return kernel


def _define_composites(lib: Any) -> None:
    for key in COMPOSITE_KEYS:
        lib.impl("_pad_circular", _pad_circular, key)
        for name in UPSAMPLE_VEC:
            lib.impl(f"{name}.vec", _upsample_vec_kernel(name), key)


@hookimpl
def dt_library_ops() -> list[LibraryOps]:
    ops = [f"aten::_pad_circular@{key}" for key in COMPOSITE_KEYS]
    ops += [f"aten::{name}.vec@{key}" for name in UPSAMPLE_VEC for key in COMPOSITE_KEYS]
    return [LibraryOps("aten", _define_composites, ops=ops, kind="IMPL")]


@hookimpl
def dt_op_handlers() -> list[OpHandler]:
    import torch

    aten = torch.ops.aten
    return [OpHandler(getattr(aten, op).default, _lazy(t)) for op, t in HANDLERS.items()]


def _keep_halo_waits_after_interior(graph: Any) -> None:
    from dt_conv.overlap_pass import keep_halo_waits_after_interior

    keep_halo_waits_after_interior(graph)


@hookimpl
def dt_graph_passes() -> list[GraphPass]:
    from pathlib import Path

    source = str(Path(__file__).with_name("overlap_pass.py"))  # in the pass's cache key
    return [
        GraphPass(
            "halo-waits-after-interior",
            _keep_halo_waits_after_interior,
            stage="post_grad_post",
            source_files=[source],
        )
    ]
