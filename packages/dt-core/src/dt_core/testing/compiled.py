"""Test helpers for compiled code: what Inductor generated, whether a compile was served
from Inductor's caches, compiles with those caches off.

The private torch parts live in `dt_core.compat.compile_introspection`; importing this
module imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dt_core.compat import compile_introspection


def run_and_get_code(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """Run `fn(*args, **kwargs)`, which compiles with Inductor; return its result and the
    Python source of every module Inductor wrote meanwhile (to check what the graph does)."""
    return compile_introspection.inductor_code(fn, *args, **kwargs)


COLLECTIVES = (
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_reduce_",
    "fused_all_gather_matmul",
    "fused_matmul_reduce_scatter",
)


def collective_counts(code: str, names: tuple[str, ...] = COLLECTIVES) -> dict[str, int]:
    """How many calls of each op `<name>` one module of Inductor's generated code makes,
    in any op namespace (`_c10d_functional.<name>`, `symm_mem.<name>`, a plugin's own)."""
    import re

    lines = [line.strip() for line in code.splitlines()]
    pattern = r"(\w+ = )?torch\.ops\.\w+\.{}\."
    return {n: sum(bool(re.match(pattern.format(n), line)) for line in lines) for n in names}


def lookup_backend(name: str) -> Callable[..., Any]:
    """torch.compile's backend `name` as a callable, for a backend that wraps it."""
    return compile_introspection.lookup_backend(name)


@contextmanager
def compile_caches(enabled: bool) -> Iterator[None]:
    """Inductor's FX graph cache and AOTAutograd's cache on or off inside the block; off,
    every compile runs the graph passes again (kernel code caches stay on)."""
    with compile_introspection.compile_caches(enabled):
        yield


class CompileCounts(dict[str, int]):
    """Inductor's and AOTAutograd's compile events of one `counting_compiles()` block, by
    torch's names (fxgraph_cache_hit, fxgraph_cache_miss, fxgraph_cache_bypass,
    autograd_cache_hit, ...); an event that never happened counts 0."""

    def __missing__(self, name: str) -> int:
        return 0


@contextmanager
def counting_compiles() -> Iterator[CompileCounts]:
    """Count the compile events inside the block; the counts are filled in when it ends.

    torch keeps these counters process-wide: they are cleared on entry.
    """
    compile_introspection.clear_compile_event_counters()
    counts = CompileCounts()
    try:
        yield counts
    finally:
        counts.update(compile_introspection.compile_event_counters())
