"""Private torch APIs for telling tracing from eager work, and traceable collectives.

Checked against torch 2.11.x to 2.15.x (`CHECKED_WITH_TORCH`); every function passes it to the
shared version check before its first private access.

Tracing here means a tracer is recording ops instead of running them on data: Dynamo
compiling a frame, make_fx / AOTAutograd (the proxy mode), fake tensors (FakeTensorMode,
or FakeTensor values), functionalization (FunctionalTensorMode, FunctionalTensor values).
Wrapper subclasses that run eagerly on real data (DTensor, LocalTensor,
AsyncCollectiveTensor, ...) are not tracing by themselves; they are when the tensors
they wrap are.

The collectives are torch's functional c10d ops (`torch.ops._c10d_functional.*`): a
start op that returns at once and a `wait_tensor`, the same two ops eagerly and in a
traced graph, so a caller can place the wait after independent compute and the
compiled graph keeps that order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from . import ensure_supported_torch

CHECKED_WITH_TORCH = ">=2.11.0,<2.16"


def tracer_modes_active() -> bool:
    """Whether Dynamo is compiling or a proxy / fake / functional dispatch mode is on."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch

    if torch.compiler.is_compiling():
        return True
    keys = torch._C._TorchDispatchModeKey
    return any(
        torch._C._get_dispatch_mode(k) is not None for k in (keys.PROXY, keys.FAKE, keys.FUNCTIONAL)
    )


def tracer_tensor_types() -> tuple[type, ...]:
    """The tensor types whose values only exist inside a trace."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return FakeTensor, FunctionalTensor


def inner_tensors(t: Any) -> list[Any]:
    """The tensors a traceable wrapper subclass holds (empty for plain tensors)."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not is_traceable_wrapper_subclass(t):
        return []
    names, _ = t.__tensor_flatten__()
    return [getattr(t, n) for n in names]


def dispatch_mode_base() -> type:
    """torch's base class of Python dispatch modes (a mode sees every aten op run under
    it; one that returns NotImplemented for a subclass lets the subclass run first)."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


@contextmanager
def no_dispatch_modes() -> Iterator[None]:
    """Run a block with every Python dispatch mode popped (no tracer records it): for
    shape checks on meta tensors that must not enter a traced graph."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        yield


def start_all_to_all(
    t: Any, output_split_sizes: Sequence[int], input_split_sizes: Sequence[int], group: Any
) -> Any:
    """Start an all-to-all of `t` split along dim 0; the result is valid after `wait`."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch

    return torch.ops._c10d_functional.all_to_all_single(
        t.contiguous(), list(output_split_sizes), list(input_split_sizes), group.group_name
    )


def wait(t: Any) -> Any:
    """Wait for a collective started by `start_all_to_all`; returns its result."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch

    return torch.ops._c10d_functional.wait_tensor(t)


@contextmanager
def below_autograd() -> Iterator[None]:
    """Dispatch the block's ops past the autograd keys (an autograd.Function's forward
    calling an op whose autograd kernel would decompose it while tracing)."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch

    with torch._C._AutoDispatchBelowAutograd():
        yield


def run_torch_composite(op: Any, *args: Any) -> Any:
    """`op`'s own CompositeImplicitAutograd kernel, as torch picks it: the Python
    decomposition while the Python dispatcher is on (tracing), else the C++ one."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch
    from torch._C import DispatchKey

    key = DispatchKey.CompositeImplicitAutograd
    tracing_dispatch = torch._C._dispatch_tls_is_dispatch_key_included(DispatchKey.PythonDispatcher)
    if tracing_dispatch and key in op.py_kernels:
        return op.py_kernels[key](*args)
    return op._op_dk(key, *args)


def order_after(graph: Any, extra_deps: Mapping[Any, Sequence[Any]]) -> None:
    """Make each node of `extra_deps` run after the given nodes of the same post-grad FX
    graph (torch's control_deps wrapper, which Inductor schedules and never fuses across)."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch._inductor.fx_passes.control_dependencies import (
        control_deps,
        preserve_node_ordering,
    )
    from torch.utils._ordered_set import OrderedSet

    # A node another pass already ordered is a control_deps call: wrapping it again would
    # hand Inductor a subgraph as an operand (torch 2.14: "realize NYI on Subgraph"), so
    # its existing dependencies are extended instead.
    to_wrap = {}
    for node, deps in extra_deps.items():
        if node.target is control_deps:
            current = tuple(node.args[0])
            node.args = (current + tuple(d for d in deps if d not in current), *node.args[1:])
        else:
            to_wrap[node] = OrderedSet(deps)
    preserve_node_ordering(graph, to_wrap)


def run_ordered_graph(graph_module: Any, *args: Any) -> Any:
    """Run a graph module that `order_after` changed, eagerly (tests check a pass's
    numbers this way): each control_deps call runs its subgraph, as torch's own eager
    kernel does where there is one (torch 2.11's control_deps has none)."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch
    from torch._inductor.fx_passes.control_dependencies import control_deps

    class Eager(torch.fx.Interpreter):
        def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
            if target is control_deps:
                _deps, subgraph, *operands = args
                return subgraph(*operands, **kwargs)
            return super().call_function(target, args, kwargs)

    return Eager(graph_module).run(*args)
