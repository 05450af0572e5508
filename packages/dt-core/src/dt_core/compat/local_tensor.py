"""torch's LocalTensorMode (one process simulating every rank), as plugins need it.

Checked against torch 2.11.x to 2.15.x (`CHECKED_WITH_TORCH`): `torch.distributed._local_tensor`,
and the fake process group of `torch.testing._internal.distributed.fake_pg` for
one-process worlds.

Interface (plain functions):
    MODULE                                   the module whose import makes rules installable
    local_tensor_mode_type() -> type         torch's LocalTensorMode
    register_mode_rule(lib, op, fn)          fn(mode, func, types, args, kwargs) runs for `op`
                                             under LocalTensorMode (removed with `lib`)
    is_local_tensor(t) -> bool
    rank_values(t) -> {rank: tensor}         what each simulated rank holds
    mode_rules() -> {op: fn}                 every LocalTensorMode rule registered now
    fake_process_group(world_size)           context: a fake default group of that size
    enabled_mode() -> mode | None            the LocalTensorMode in force (entered, enabled)
    simulated_ranks_of(mode) -> [int]        the ranks a mode simulates
    int_on_rank(value, rank)                 a per-rank SymInt as `rank` sees it
    local_tensor_from({rank: tensor})        a LocalTensor from per-rank plain tensors
    mode_disabled(mode)                      context: plain torch inside (per-rank code)
    run_per_rank(fn, *args)                  fn once per simulated rank on that rank's values,
                                             results combined (tensors -> LocalTensor)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from . import ensure_supported_torch

CHECKED_WITH_TORCH = ">=2.11.0,<2.16"
MODULE = "torch.distributed._local_tensor"


def local_tensor_mode_type() -> type:
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch.distributed._local_tensor import LocalTensorMode

    return LocalTensorMode


def register_mode_rule(lib: Any, op: str, fn: Callable[..., Any]) -> None:
    """Run `fn` for `op` (qualified name) while LocalTensorMode is active; public
    `torch.library.register_torch_dispatch`, owned by `lib` so destroying it removes it."""
    import torch

    torch.library.register_torch_dispatch(op, local_tensor_mode_type(), fn, lib=lib)


def mode_rules() -> dict[str, Any]:
    """Every op's LocalTensorMode rule in torch's op registry (qualified name -> rule)."""
    from torch._library.simple_registry import singleton

    mode = local_tensor_mode_type()
    found = {}
    for name, entry in singleton._data.items():
        rules = entry.torch_dispatch_rules._data
        if mode in rules:
            found[name] = rules[mode]
    return found


def is_local_tensor(t: object) -> bool:
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import sys

    module = sys.modules.get(MODULE)
    return module is not None and isinstance(t, module.LocalTensor)


def rank_values(t: Any) -> dict[int, Any]:
    """The plain tensor each simulated rank holds in LocalTensor `t`."""
    return dict(t._local_tensors)


@contextlib.contextmanager
def fake_process_group(world_size: int) -> Iterator[Any]:
    """A default process group of `world_size` ranks that sends nothing (rank 0 here)."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def enabled_mode() -> Any | None:
    """The LocalTensorMode in force here (entered and not disabled), else None: the mode
    itself, to disable it or read its ranks. Whether ranks are simulated is asked of
    `dt_core.tracing.simulates_ranks`, which reads this."""
    import sys

    if MODULE not in sys.modules:  # nobody entered one: keep torch's private module unloaded
        return None
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch.distributed._local_tensor import enabled_local_tensor_mode

    return enabled_local_tensor_mode()


def simulated_ranks_of(mode: Any) -> list[int]:
    """The ranks `mode` simulates, in order."""
    return sorted(mode.ranks)


def int_on_rank(value: Any, rank: int) -> Any:
    """What simulated `rank` sees of a per-rank integer (a SymInt LocalTensorMode made,
    e.g. `mesh.get_local_rank()`); plain ints and anything else come back unchanged."""
    import torch

    if isinstance(value, torch.SymInt):
        from torch.distributed._local_tensor import _map_to_rank_local_val

        return _map_to_rank_local_val(value, rank)
    return value


def local_tensor_from(values: dict[int, Any]) -> Any:
    """A LocalTensor holding `values[r]` on simulated rank r (every rank of the mode)."""
    from torch.distributed._local_tensor import LocalTensor

    return LocalTensor(values)


@contextlib.contextmanager
def mode_disabled(mode: Any) -> Iterator[None]:
    """Plain torch inside the block: per-rank code runs on plain tensors."""
    with mode.disable():
        yield


def run_per_rank(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` as every simulated rank computes it, with the mode disabled inside.

    Each LocalTensor or per-rank integer among `args` (also inside lists, tuples and
    dicts) is replaced by that rank's value; the results are combined as torch combines
    an op's: tensors into a LocalTensor, ints into a per-rank int (a plain int where all
    ranks agree), tuples and lists element by element; anything else must agree on every
    rank. `fn` must not issue collectives (the process group is fake). Without an enabled
    LocalTensorMode this is `fn(*args)`.
    """
    if enabled_mode() is None:
        return fn(*args)
    from torch.distributed._local_tensor import maybe_run_for_local_tensor

    return maybe_run_for_local_tensor(fn)(*args)
