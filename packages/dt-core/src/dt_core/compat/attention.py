"""Private torch APIs the context-parallel attention plugin (dt-cp) needs.

Plain functions only; each checks the torch range before its first private access.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import ensure_supported_torch


def resolve_process_group(group_name: str) -> Any:
    """The ProcessGroup registered under `group_name` (custom ops take groups by name)."""
    ensure_supported_torch()
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(group_name)


def install_hop_subclass_impl(hop: Any, subclass: type, fn: Callable[..., Any]) -> Any:
    """Make higher-order operator `hop` call `fn` for tensor subclass `subclass`.

    Returns what was registered before (or None) so `remove_hop_subclass_impl` can put
    it back; torch has no public way to take a HOP's subclass rule out again.
    """
    ensure_supported_torch()
    table = hop.python_key_table
    previous = table.pop(subclass, None)
    hop.py_impl(subclass)(fn)
    return previous


def remove_hop_subclass_impl(hop: Any, subclass: type, previous: Any) -> None:
    """Undo `install_hop_subclass_impl`."""
    ensure_supported_torch()
    table = hop.python_key_table
    table.pop(subclass, None)
    if previous is not None:
        table[subclass] = previous
    hop._dispatch_cache.clear()


def is_traced(t: Any) -> bool:
    """Whether `t` is a fake/functional tensor of a trace (torch.compile, export)."""
    ensure_supported_torch()
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    if torch.compiler.is_compiling():
        return True
    return isinstance(t, (FakeTensor, FunctionalTensor))


def flex_attention_hops() -> tuple[Any, Any]:
    """torch's flex_attention forward and backward higher-order operators."""
    ensure_supported_torch()
    from torch._higher_order_ops.flex_attention import flex_attention, flex_attention_backward

    return flex_attention, flex_attention_backward
