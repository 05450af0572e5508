"""Looking inside torch.compile: Inductor's generated code, Dynamo's compile-event
counters and the compile caches. Tests and benchmarks use it (through
`dt_core.testing.compiled`); no plugin's runtime path does.

Checked against torch 2.11.x to 2.15.x (`CHECKED_WITH_TORCH`); every function passes it to the
shared version check before its first private access.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from . import ensure_supported_torch

CHECKED_WITH_TORCH = ">=2.11.0,<2.16"

# The counter groups that say whether a compile was served from a cache.
_COUNTER_GROUPS = ("inductor", "aot_autograd")


def inductor_code(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """Run `fn(*args, **kwargs)`, which compiles with Inductor; return its result and
    the Python source of every module Inductor wrote meanwhile."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch._inductor.utils import run_and_get_code

    return run_and_get_code(fn, *args, **kwargs)


def lookup_backend(name: str) -> Callable[..., Any]:
    """The compile backend torch.compile knows by `name` ("aot_eager", "inductor"), as a
    callable another backend can hand a graph to."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch._dynamo import lookup_backend as lookup

    return lookup(name)


def compile_event_counters() -> dict[str, int]:
    """A copy of Inductor's and AOTAutograd's event counters, merged (fxgraph_cache_hit,
    fxgraph_cache_miss, fxgraph_cache_bypass, autograd_cache_hit, ...)."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch._dynamo.utils import counters

    return {name: n for group in _COUNTER_GROUPS for name, n in counters[group].items()}


def clear_compile_event_counters() -> None:
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch._dynamo.utils import counters

    for group in _COUNTER_GROUPS:
        counters[group].clear()


@contextmanager
def compile_caches(enabled: bool) -> Iterator[None]:
    """Inductor's FX graph cache and AOTAutograd's cache on or off inside a block.

    Off makes every compile run the graph passes; the kernel code caches stay on, so the
    C++ compile of an unchanged kernel is still reused.
    """
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    with (
        inductor_config.patch(fx_graph_cache=enabled),
        functorch_config.patch(enable_autograd_cache=enabled),
    ):
        yield
