"""Sequence layouts chosen by torch's own context-parallel APIs: read, never assumed.

torch's `context_parallel()` and `_context_parallel_shard()` permute a sequence (head-tail
load balancing) before sharding it and keep that fact in globals only (see
`dt_cp.compat.context_parallel`). While torch's CP dispatcher is on, the `Shard(2)`
DTensors reaching attention are in torch's layout; dt-cp reads which one and runs its
position-aware algorithms on it. Where torch's state does not determine the layout,
attention refuses with an error that says what to do, on every rank, before any exchange.
"""

from __future__ import annotations

import datetime
import functools

import torch
from dt_core.compat.tracing import no_dispatch_modes

from .compat.context_parallel import (
    TorchCpState,
    balancer_world_size,
    default_balancer_indices,
    torch_cp_state,
)
from .config import Settings
from .layout import SequenceLayout, from_permutation

# How long the length check waits for the other ranks (they may be busy before attention;
# a rank given an empty shard by torch never arrives).
LENGTH_CHECK_TIMEOUT_S = 120


class TorchLayoutError(ValueError):
    """torch's context-parallel state leaves the layout of the inputs unknown."""


AMBIGUOUS = (
    "torch's _context_parallel_shard sharded sequences with a load balancer "
    "(_cp_options.enable_load_balance is True in module-wrapper mode), but torch's "
    "context-parallel dispatcher is off, so dt-cp cannot tell whether these Shard(2) "
    "DTensors are in that balancer's order or in natural order. If they come from torch's "
    "CP APIs, call torch.distributed.tensor.experimental._context_parallel."
    "_enable_context_parallel_dispatcher() first, or name the balancer with "
    "dt_cp.settings(torch_load_balancer=...); if they come from dt_cp.shard_sequence "
    "or distribute_tensor, run attention under dt_cp.settings(torch_cp='ignore')."
)


def active_state(settings: Settings) -> TorchCpState | None:
    """torch's CP state when it decides layouts here; raises when it leaves them unknown."""
    if settings.torch_cp == "ignore":
        return None
    state = torch_cp_state()
    if state is None:
        return None
    if state.dispatcher_enabled:
        return state
    if state.mode == "module_wrapper" and state.load_balance:
        if settings.torch_load_balancer is not None:
            return state  # the user said which balancer torch's shard call used
        raise TorchLayoutError(f"dt-cp: {AMBIGUOUS}")
    return None


@functools.lru_cache(maxsize=64)
def _balanced(length: int, parts: int) -> SequenceLayout:
    """Planning metadata, computed on real tensors even while a graph is traced (under
    Dynamo's fake tensors the permutation check would be data-dependent)."""
    sizes = [length // parts] * parts
    with no_dispatch_modes():
        return from_permutation(default_balancer_indices(length, parts), sizes)


def declared_layout(settings: Settings, length: int, parts: int, what: str) -> SequenceLayout:
    """The layout the declared torch balancer gives; errors name `torch_load_balancer`.

    Its permutation was computed when it was declared (`settings.torch_balancer_indices`).
    """
    balancer = settings.torch_load_balancer
    size = balancer_world_size(balancer)
    if size is not None and size != parts:
        raise TorchLayoutError(
            f"dt-cp: torch_load_balancer was built for world size {size}, but the mesh dim "
            f"sharding the sequence has {parts} ranks"
        )
    indices = settings.torch_balancer_indices
    if not isinstance(indices, torch.Tensor):  # set with the balancer by dt_cp.configure
        raise TorchLayoutError(
            "dt-cp: torch_load_balancer was declared without its permutation; declare it "
            "with dt_cp.configure(torch_load_balancer=...) or dt_cp.settings(...)"
        )
    if indices.shape[-1] != length:
        raise TorchLayoutError(
            f"dt-cp: torch_load_balancer permutes {indices.shape[-1]} positions, but {what} "
            f"has global sequence length {length}"
        )
    rows = indices.reshape(-1, length)
    if not bool((rows == rows[:1]).all()):
        raise TorchLayoutError(
            "dt-cp: torch_load_balancer permutes batch rows differently; dt-cp needs one "
            "layout for the whole batch"
        )
    if length % parts:
        raise TorchLayoutError(
            f"dt-cp: {what} has global sequence length {length}, not divisible by {parts}"
        )
    return from_permutation(rows[0], [length // parts] * parts)


def torch_layout(
    state: TorchCpState, length: int, parts: int, what: str, settings: Settings | None = None
) -> SequenceLayout:
    """The layout torch's CP APIs gave a sequence of global `length` on `parts` ranks
    (that of the torch balancer named in `settings`, if any; else torch's head-tail)."""
    if not state.load_balance:
        return SequenceLayout(length, parts)
    if settings is not None and settings.torch_load_balancer is not None:
        return declared_layout(settings, length, parts, what)
    if default_balancer_indices(length, parts) is None:
        raise TorchLayoutError(
            f"dt-cp: {what} has global sequence length {length}, which torch's head-tail "
            f"load balancing cannot split into 2·{parts} equal pieces, yet "
            "_cp_options.enable_load_balance is on (torch's context-parallel attention "
            "then assumes head-tail order). Use a length divisible by "
            f"{2 * parts}, or shard without a load balancer "
            "(_context_parallel_shard(..., load_balancer=None))."
        )
    return _balanced(length, parts)


def check_settings_agree(state: TorchCpState, settings: Settings) -> None:
    """dt-cp's own balancer setting must not contradict torch's layout."""
    mine = settings.load_balancer
    theirs = "head_tail" if state.load_balance else "none"
    if mine not in ("none", theirs):
        raise TorchLayoutError(
            f"dt-cp: dt-cp's load_balancer setting is {mine!r}, but torch's "
            f"context-parallel dispatcher is on with {'head-tail' if state.load_balance else 'no'}"
            " load balancing, which decides the layout of Shard(2) inputs; use one of the two"
            " (dt_cp.settings(torch_cp='ignore') makes dt-cp's setting win)"
        )


def torch_algorithm(state: TorchCpState, settings: Settings) -> str:
    """dt-cp's algorithm for torch's `set_rotate_method` unless dt-cp's own is set."""
    if settings.algorithm != "auto":
        return settings.algorithm
    return "ring" if state.rotate_method == "alltoall" else "allgather"


def check_even_local_lengths(tensors: dict[str, torch.Tensor], parts: int, group: str) -> None:
    """torch's CP hooks wrap local shards with `DTensor.from_local` (global = local · P).

    With a length `Shard` splits unevenly the ranks then disagree about the global
    length; compare local lengths (one small all-gather, all ranks alike) and refuse.
    """
    import torch.distributed as dist

    from .comm import group_of

    pg = group_of(group)
    mine = torch.tensor([t.shape[2] for t in tensors.values()], dtype=torch.long)
    every = [torch.empty_like(mine) for _ in range(parts)]
    work = dist.all_gather(every, mine, group=pg, async_op=True)
    try:
        work.wait(timeout=datetime.timedelta(seconds=LENGTH_CHECK_TIMEOUT_S))
    except RuntimeError as error:
        raise TorchLayoutError(
            "dt-cp: not every rank reached context-parallel attention within "
            f"{LENGTH_CHECK_TIMEOUT_S} s. Under torch's context-parallel APIs a rank whose "
            "shard is empty (sequence length not divisible by the world size) takes torch's "
            "math path instead; use a sequence length divisible by the context-parallel "
            f"world size {parts}."
        ) from error
    table = torch.stack(every)
    for i, name in enumerate(tensors):
        lengths = table[:, i].tolist()
        if len(set(lengths)) > 1:
            raise TorchLayoutError(
                f"dt-cp: {name}'s local sequence lengths differ across ranks {lengths}: "
                "torch's context-parallel APIs wrap local shards as if every rank held S/P "
                f"rows, so the global length is unknown. Use a sequence length divisible by "
                f"the context-parallel world size {parts}."
            )
