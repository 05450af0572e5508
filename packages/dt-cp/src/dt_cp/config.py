"""User settings: which exact algorithm runs, and how sequences are laid out on ranks.

The settings live in dt-core's `SettingsStore("cp", Settings)`, so they follow the house
convention and `dt-plugins list --settings` shows them. In order of precedence: an active
`dt_cp.settings(...)` block, `dt_cp.configure(...)`, the environment (`DT_CP_ALGORITHM`,
`DT_CP_LOAD_BALANCER`, `DT_CP_DOCUMENTS=3,4`, `DT_CP_TORCH_CP`), the defaults. The
torch balancer object cannot come from the environment; declare it with `configure` or
`settings`. Importing this module imports no torch (the plugin module loads it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict, Unpack, get_args

from dt_core.kit import SettingsStore

Algorithm = Literal["auto", "ring", "allgather"]
LoadBalancer = Literal["none", "head_tail", "document"]
TorchCpMode = Literal["auto", "ignore"]

ALGORITHMS: tuple[str, ...] = get_args(Algorithm)
LOAD_BALANCERS: tuple[str, ...] = get_args(LoadBalancer)
TORCH_CP_MODES: tuple[str, ...] = get_args(TorchCpMode)
ALGORITHM_ENV = "DT_CP_ALGORITHM"
LOAD_BALANCER_ENV = "DT_CP_LOAD_BALANCER"


@dataclass(frozen=True)
class Settings:
    """algorithm: "ring" (O(S/P) K/V per rank), "allgather" or "auto" (measured default).

    load_balancer: layout of sequence-sharded tensors made by `shard_sequence`; attention
    reads it to know which global positions each rank holds.
    documents: document lengths of a packed sequence (in order, summing to its length),
    used by load_balancer="document".
    torch_cp: "auto" follows the layout torch's own context-parallel APIs chose while
    they are in charge (and refuses when torch's state leaves it unknown); "ignore"
    takes every sequence-sharded DTensor to be in this package's layout.
    torch_load_balancer: the load balancer handed to torch's `_context_parallel_shard`
    (torch records only that one was used), so attention follows its permutation
    exactly; set with `dt_cp.configure` or `dt_cp.settings`, not from the environment.
    torch_balancer_indices: that balancer's permutation, computed when it is declared;
    derived, never set directly.
    """

    algorithm: Algorithm = "auto"
    load_balancer: LoadBalancer = "none"
    documents: tuple[int, ...] | None = None
    torch_cp: TorchCpMode = "auto"
    # The torch `_LoadBalancer` handed to `_context_parallel_shard` (torch records only
    # that one was used; its own ring assumes head-tail). Declaring it lets attention
    # follow any torch balancer's permutation exactly. Not settable from the environment.
    torch_load_balancer: object | None = None
    # Its permutation, computed when declared: balancers may use vmap, which cannot run
    # inside DTensor's dispatch where attention reads it. Derived, never set directly.
    torch_balancer_indices: object | None = None

    def __post_init__(self) -> None:
        if self.documents is not None and not isinstance(self.documents, tuple):
            object.__setattr__(self, "documents", tuple(int(n) for n in self.documents))


STORE: SettingsStore[Settings] = SettingsStore("cp", Settings)


def current() -> Settings:
    """The settings in force here and now."""
    return STORE.current()


class Changes(TypedDict, total=False):
    """What `configure` and `settings` take, by keyword (None keeps the current value)."""

    algorithm: str | None
    load_balancer: str | None
    documents: Sequence[int] | None
    torch_cp: str | None
    torch_load_balancer: object | None


def _changes(changes: Changes) -> dict[str, object]:
    """The store's keyword changes; a torch balancer is checked and its permutation taken."""
    unknown = sorted(set(changes) - set(Changes.__annotations__))
    if unknown:  # the store would accept a derived field (torch_balancer_indices)
        raise TypeError(
            f"dt-cp: unknown settings {unknown}; known: {list(Changes.__annotations__)}"
        )
    out: dict[str, object] = dict(changes)
    documents = changes.get("documents")
    if documents is not None:
        out["documents"] = tuple(int(n) for n in documents)
    balancer = changes.get("torch_load_balancer")
    if balancer is not None:
        out["torch_balancer_indices"] = _balancer_indices(balancer)
    return out


def _balancer_indices(balancer: object) -> object:
    from dt_cp.compat.context_parallel import balancer_indices, is_torch_load_balancer

    if not is_torch_load_balancer(balancer):
        raise TypeError(
            "dt-cp: torch_load_balancer must be one of torch's context-parallel load "
            f"balancers (a _LoadBalancer), got {type(balancer).__name__}"
        )
    try:
        return balancer_indices(balancer)
    except (AssertionError, NotImplementedError, RuntimeError, ValueError) as error:
        raise ValueError(
            f"dt-cp: torch_load_balancer cannot lay out its sequence "
            f"({type(error).__name__}: {error}); its lengths must split into the pieces "
            "it needs"
        ) from error


def configure(**changes: Unpack[Changes]) -> Settings:
    """Set process-wide defaults (None keeps the current value); returns the new settings."""
    return STORE.configure(**_changes(changes))


def reset() -> None:
    """Forget `configure` calls (back to the environment and defaults)."""
    STORE.reset()


@contextlib.contextmanager
def settings(**changes: Unpack[Changes]) -> Iterator[Settings]:
    """Use these settings inside the block only."""
    with STORE.scoped(**_changes(changes)) as scoped:
        yield scoped
