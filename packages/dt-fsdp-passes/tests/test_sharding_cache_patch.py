"""The plugin's patch: every torch.compile starts with DTensor's C++ sharding cache empty.

Why (see dt_fsdp_passes.compat.fresh_sharding_cache_per_compile_patch): entries made by
earlier runs carry other, equal mesh objects into traces, and AOTAutograd's partitioner
then fails. The multi-rank sequence that failed is in tests/test_fsdp_stack.py
(eager, then Inductor, then aot_eager in one process); this checks the mechanism.
"""

from __future__ import annotations

import pytest


def test_each_compile_empties_dtensor_sharding_cache_first(monkeypatch: pytest.MonkeyPatch):
    import dt_core
    import torch
    import torch.distributed.tensor  # noqa: F401  (the part of torch that installs patches)

    info = {p.name: p for p in dt_core.plugins()}["fsdp-passes"]
    assert info.state == "active", info
    calls: list[int] = []
    clear = torch._C._clear_DTensor_sharding_propagator_cache
    monkeypatch.setattr(
        torch._C, "_clear_DTensor_sharding_propagator_cache", lambda: calls.append(1) or clear()
    )
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x * 2 + 1, backend="eager")
    assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 3.0))
    assert calls == [1], calls  # one compile, one clear
    compiled(torch.ones(3))
    assert calls == [1], calls  # a cached graph compiles nothing: the cache stays
