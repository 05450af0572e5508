"""torch.library ops `dt_cp::all_gather_seq` and `dt_cp::reduce_scatter_seq`.

Registered through dt-core (`LibraryOps`), with fake kernels so they trace under
torch.compile, and autograd: the gradient of an all-gather along the sequence is the
reduce-scatter of the gradient, and vice versa. The gather carries the sequence layout
a compiled graph was traced with and checks it at every call (`records.check_traced`).
"""

from __future__ import annotations

from typing import Any

import torch

NAMESPACE = "dt_cp"
OP_NAMES = [f"{NAMESPACE}::all_gather_seq", f"{NAMESPACE}::reduce_scatter_seq"]
_SCHEMA = "(Tensor x, int dim, SymInt[] sizes, str group) -> Tensor"
# The gather also carries the layout the graph was traced with, checked at every call
# (`records.check_traced`): torch.compile does not see dt-cp's settings.
_GATHER_SCHEMA = '(Tensor x, int dim, SymInt[] sizes, str group, str layout="") -> Tensor'


def _all_gather_impl(
    x: torch.Tensor, dim: int, sizes: list[int], group: str, layout: str = ""
) -> torch.Tensor:
    from dt_cp.comm import all_gather_seq
    from dt_cp.records import check_traced

    check_traced(layout, sizes)
    return all_gather_seq(x, dim, sizes, group)


def _reduce_scatter_impl(x: torch.Tensor, dim: int, sizes: list[int], group: str) -> torch.Tensor:
    from dt_cp.comm import reduce_scatter_seq

    return reduce_scatter_seq(x, dim, sizes, group)


def _rank_in(group: str) -> int:
    import torch.distributed as dist

    from dt_cp.comm import group_of

    return dist.get_rank(group_of(group))


def _all_gather_fake(
    x: torch.Tensor, dim: int, sizes: list[int], group: str, layout: str = ""
) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] = sum(sizes)
    return x.new_empty(shape)


def _reduce_scatter_fake(x: torch.Tensor, dim: int, sizes: list[int], group: str) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] = sizes[_rank_in(group)]
    return x.new_empty(shape)


def _setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    _, ctx.dim, ctx.sizes, ctx.group = inputs[:4]


def _all_gather_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    op = torch.ops.dt_cp.reduce_scatter_seq.default
    return op(grad, ctx.dim, ctx.sizes, ctx.group), None, None, None, None


def _reduce_scatter_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    op = torch.ops.dt_cp.all_gather_seq.default
    return op(grad, ctx.dim, ctx.sizes, ctx.group), None, None, None


def define(lib: Any) -> None:
    """Define the ops on `lib` (a torch.library.Library dt-core owns)."""
    for name, schema, impl, fake, backward in (
        (
            "all_gather_seq",
            _GATHER_SCHEMA,
            _all_gather_impl,
            _all_gather_fake,
            _all_gather_backward,
        ),
        (
            "reduce_scatter_seq",
            _SCHEMA,
            _reduce_scatter_impl,
            _reduce_scatter_fake,
            _reduce_scatter_backward,
        ),
    ):
        qualname = f"{NAMESPACE}::{name}"
        lib.define(name + schema)
        torch.library.impl(qualname, "CompositeExplicitAutograd", lib=lib)(impl)
        torch.library.register_fake(qualname, fake, lib=lib)
        torch.library.register_autograd(qualname, backward, setup_context=_setup, lib=lib)
