"""User settings: which exact algorithm runs, and how sequences are laid out on ranks.

Settings come from, in order of precedence: an active `dt_cp.settings(...)` block,
`dt_cp.configure(...)`, then the environment (`DT_CP_ALGORITHM`, `DT_CP_LOAD_BALANCER`).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

ALGORITHMS = ("auto", "ring", "allgather")
LOAD_BALANCERS = ("none", "head_tail", "document")
TORCH_CP_MODES = ("auto", "ignore")
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
    """

    algorithm: str = "auto"
    load_balancer: str = "none"
    documents: tuple[int, ...] | None = None
    torch_cp: str = "auto"
    # The torch `_LoadBalancer` handed to `_context_parallel_shard` (torch records only
    # that one was used; its own ring assumes head-tail). Declaring it lets attention
    # follow any torch balancer's permutation exactly.
    torch_load_balancer: object | None = None
    # Its permutation, computed when declared: balancers may use vmap, which cannot run
    # inside DTensor's dispatch where attention reads it.
    torch_balancer_indices: object | None = None


def _check(algorithm: str | None, load_balancer: str | None, torch_cp: str | None = None) -> None:
    if torch_cp is not None and torch_cp not in TORCH_CP_MODES:
        raise ValueError(f"dt-cp: torch_cp must be one of {TORCH_CP_MODES}, got {torch_cp!r}")
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ValueError(f"dt-cp: algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if load_balancer is not None and load_balancer not in LOAD_BALANCERS:
        raise ValueError(
            f"dt-cp: load_balancer must be one of {LOAD_BALANCERS}, got {load_balancer!r}"
        )


def _from_env() -> Settings:
    algorithm = os.environ.get(ALGORITHM_ENV, "auto")
    balancer = os.environ.get(LOAD_BALANCER_ENV, "none")
    _check(algorithm, balancer)
    return Settings(algorithm, balancer)


_configured: Settings | None = None
_scoped: contextvars.ContextVar[Settings | None] = contextvars.ContextVar(
    "dt_cp_settings", default=None
)


def current() -> Settings:
    """The settings in force here and now."""
    scoped = _scoped.get()
    if scoped is not None:
        return scoped
    return _configured if _configured is not None else _from_env()


def _updated(
    base: Settings,
    algorithm: str | None,
    load_balancer: str | None,
    documents: Sequence[int] | None,
    torch_cp: str | None = None,
    torch_load_balancer: object | None = None,
) -> Settings:
    _check(algorithm, load_balancer, torch_cp)
    if torch_load_balancer is not None:
        from dt_core.compat.context_parallel import is_torch_load_balancer

        if not is_torch_load_balancer(torch_load_balancer):
            raise TypeError(
                "dt-cp: torch_load_balancer must be one of torch's context-parallel load "
                f"balancers (a _LoadBalancer), got {type(torch_load_balancer).__name__}"
            )
        from dt_core.compat.context_parallel import balancer_indices

        try:
            indices = balancer_indices(torch_load_balancer)
        except (AssertionError, NotImplementedError, RuntimeError, ValueError) as error:
            raise ValueError(
                f"dt-cp: torch_load_balancer cannot lay out its sequence "
                f"({type(error).__name__}: {error}); its lengths must split into the pieces "
                "it needs"
            ) from error
        base = replace(base, torch_balancer_indices=indices)
    return replace(
        base,
        torch_cp=torch_cp or base.torch_cp,
        torch_load_balancer=torch_load_balancer or base.torch_load_balancer,
        algorithm=algorithm or base.algorithm,
        load_balancer=load_balancer or base.load_balancer,
        documents=base.documents if documents is None else tuple(int(n) for n in documents),
    )


def configure(
    algorithm: str | None = None,
    load_balancer: str | None = None,
    documents: Sequence[int] | None = None,
    torch_cp: str | None = None,
    torch_load_balancer: object | None = None,
) -> Settings:
    """Set process-wide defaults (None keeps the current value); returns the new settings."""
    global _configured
    base = _configured if _configured is not None else _from_env()
    _configured = _updated(base, algorithm, load_balancer, documents, torch_cp, torch_load_balancer)
    return _configured


def reset() -> None:
    """Forget `configure` calls (back to the environment)."""
    global _configured
    _configured = None


@contextlib.contextmanager
def settings(
    algorithm: str | None = None,
    load_balancer: str | None = None,
    documents: Sequence[int] | None = None,
    torch_cp: str | None = None,
    torch_load_balancer: object | None = None,
) -> Iterator[Settings]:
    """Use these settings inside the block only."""
    new = _updated(current(), algorithm, load_balancer, documents, torch_cp, torch_load_balancer)
    token = _scoped.set(new)
    try:
        yield new
    finally:
        _scoped.reset(token)
