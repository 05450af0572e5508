"""Hookimpls of the `conv` plugin.

Light at import, and the hooks import only `torch`: the handler modules import
`torch.distributed.tensor`, whose first import is what runs the hooks, so the hooks list
the ops by name (`handled_ops`) and each installed handler loads dt-conv's handler table
(`handlers.HANDLERS`) on its first call (importing it here would re-enter activation).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from dt_core import GraphPass, LibraryOps, OpHandler, Patch, hookimpl

from dt_conv.handled_ops import HANDLED, NORM_FAMILIES, UPSAMPLE

DT_API = ">=1.0,<2"  # dt-core hook API this plugin is written for


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


def _handler(name: str) -> Callable[..., object]:
    """DTensor's handler for `aten.<name>`: `handlers.handle`, imported on the first call."""

    def run(op_call: Any, args: tuple, kwargs: dict) -> object:
        from dt_conv.handlers import handle

        return handle(name, op_call, args, kwargs)

    handler = _outside_dynamo(run)
    handler.__qualname__ = handler.__name__ = f"conv_{name}"
    return handler


def _circular_pad(x: Any, pad: Any) -> Any:
    from dt_conv.ops.padding import circular_pad

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


def _upsample_vec_kernel(name: str) -> Callable[..., object]:
    def kernel(x: Any, *args: Any) -> object:
        from dt_conv.ops.interpolate_vec import upsample_vec

        return upsample_vec(name, x, *args)

    return kernel


def _define_composites(lib: Any) -> None:
    for key in COMPOSITE_KEYS:
        lib.impl("_pad_circular", _pad_circular, key)
        for name in UPSAMPLE:
            lib.impl(f"{name}.vec", _upsample_vec_kernel(name), key)


@hookimpl
def dt_library_ops() -> list[LibraryOps]:
    ops = [f"aten::_pad_circular@{key}" for key in COMPOSITE_KEYS]
    ops += [f"aten::{name}.vec@{key}" for name in UPSAMPLE for key in COMPOSITE_KEYS]
    return [LibraryOps("aten", _define_composites, ops=ops, kind="IMPL")]


def _norm_handler(family: str, direction: str) -> Callable[..., object]:
    """DTensor's handler for a normalization op of `family`: `handlers.handle_norm`."""

    def run(op_call: Any, args: tuple, kwargs: dict) -> object:
        from dt_conv.handlers import handle_norm

        return handle_norm(family, direction, op_call, args, kwargs)

    handler = _outside_dynamo(run)
    handler.__qualname__ = handler.__name__ = f"conv_{family}_{direction}"
    return handler


def _norm_takes(family: str, direction: str) -> Callable[[tuple, dict], bool]:
    """Which calls of a normalization op dt-conv takes (`ops.norm.<family>`), loaded on
    the first call."""

    def takes(args: tuple, kwargs: dict) -> bool:
        import importlib

        module = importlib.import_module(f"dt_conv.ops.norm.{family}")
        return bool(getattr(module, f"takes_{direction}")(args, kwargs))

    return takes


def _norm_handlers(aten: Any) -> list[OpHandler]:
    found = []
    for family, (forwards, backwards) in NORM_FAMILIES.items():
        for direction, names in (("forward", forwards), ("backward", backwards)):
            for qualified in names:
                name, overload = qualified.split(".")
                op = getattr(getattr(aten, name, None), overload, None)
                if op is not None:  # every one exists on torch 2.11 to 2.15
                    handler = _norm_handler(family, direction)
                    found.append(OpHandler(op, handler, takes=_norm_takes(family, direction)))
    return found


@hookimpl
def dt_op_handlers() -> list[OpHandler]:
    import torch

    aten = torch.ops.aten
    handlers = [OpHandler(getattr(aten, name).default, _handler(name)) for name in HANDLED]
    return handlers + _norm_handlers(aten)


def _keep_halo_waits_after_interior(graph: Any) -> None:
    from dt_conv.engine.overlap.graph_pass import keep_halo_waits_after_interior

    keep_halo_waits_after_interior(graph)


@hookimpl
def dt_graph_passes() -> list[GraphPass]:
    from pathlib import Path

    graph_pass = Path(__file__).parent / "engine" / "overlap" / "graph_pass.py"
    source = str(graph_pass)  # in the pass's cache key
    return [
        GraphPass(
            "halo-waits-after-interior",
            _keep_halo_waits_after_interior,
            stage="post_grad_post",
            source_files=[source],
        )
    ]


@hookimpl
def dt_patches() -> list[Patch]:
    """Inductor on torch 2.11 / 2.12 writes CPU kernels that do not compile for the halo
    assembly of a graph compiled with dynamic sizes (an indirect index tiled as a
    transposed block); the patch keeps such indices out of that tiling where Inductor
    does not already (`compat.indirect_transpose_patch`)."""
    from dt_conv.compat import indirect_transpose_patch

    return [indirect_transpose_patch()]
