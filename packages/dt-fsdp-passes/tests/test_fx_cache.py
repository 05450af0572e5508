"""The plugin's passes keep Inductor's caches on: an identical compile is served from the
cache (the passes do not run again), a changed setting compiles afresh."""

from __future__ import annotations

import uuid

import pytest


def _compile_three_times(cap_a: float, cap_b: float) -> list[dict]:
    import dt_fsdp_passes
    import torch
    from dt_core.testing import cpu_mesh
    from dt_core.testing.compiled import counting_compiles
    from dt_fsdp_passes.models import MLP, twin
    from dt_fsdp_passes.passes import pass_log

    torch.manual_seed(0)
    base = MLP(8, 2)
    x = torch.randn(4, 8)
    results = []
    try:
        for cap in (cap_a, cap_a, cap_b):
            dt_fsdp_passes.configure(bucket_cap_mb=cap)
            torch._dynamo.reset()
            runs_before = len(pass_log())
            with counting_compiles() as counts:
                model = dt_fsdp_passes.simple_fsdp(twin(base), cpu_mesh(2))
                torch.compile(model)(x).sum().backward()
            results.append(
                {
                    "hits": counts["fxgraph_cache_hit"] + counts["autograd_cache_hit"],
                    "misses": counts["fxgraph_cache_miss"],
                    "bypass": counts["fxgraph_cache_bypass"],
                    "pass_runs": len(pass_log()) - runs_before,
                }
            )
    finally:
        dt_fsdp_passes.configure(reset=True)
    return results


@pytest.mark.ranks(2, timeout=300)
def test_fx_graph_cache_hits_then_misses_on_a_new_setting() -> None:
    # Caps no earlier run used (the cache directory outlives test runs), same on all ranks.
    salt = uuid.uuid4().int % 10**6 / 10**9
    first, second, changed = _compile_three_times(4.0 + salt, 5.0 + salt)
    assert first["misses"] == 2 and first["pass_runs"] == 4, first  # fwd + bwd, 2 passes each
    assert first["bypass"] == 0, first
    assert second["hits"] >= 2 and second["pass_runs"] == 0 and second["misses"] == 0, second
    assert changed["misses"] == 2 and changed["pass_runs"] == 4, changed
