"""Plugin graph passes: cache identity (uuid) and Inductor's FX graph cache."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from dt_core import GraphPass
from dt_core.graph_passes import pass_uuid, source_files
from dt_core.testing.scripts import run_python


def _noop(graph) -> None:
    return None


def test_uuid_is_stable_and_changes_with_settings() -> None:
    settings = {"cap_mb": 25}
    graph_pass = GraphPass("p", _noop, settings=lambda: dict(settings))
    first = pass_uuid("x:p", graph_pass)
    assert first == pass_uuid("x:p", graph_pass)
    settings["cap_mb"] = 50
    assert pass_uuid("x:p", graph_pass) != first
    settings["cap_mb"] = 25
    assert pass_uuid("x:p", graph_pass) == first
    assert pass_uuid("y:p", graph_pass) != first  # identity is part of it


def test_uuid_changes_with_the_pass_code(tmp_path: Path) -> None:
    module = tmp_path / "pass_code.py"
    module.write_text("def apply(graph):\n    return None\n")
    graph_pass = GraphPass("p", _noop, source_files=[str(module)])
    assert module.resolve() in source_files(graph_pass)
    first = pass_uuid("x:p", graph_pass)
    module.write_text("def apply(graph):\n    return 1\n")
    os.utime(module, ns=(1, 1))  # a new mtime, whatever the clock's resolution
    assert pass_uuid("x:p", graph_pass) != first


def _rank_uuid() -> str:
    from dt_sample_plugin import plugin

    return pass_uuid("sample:count_nodes", plugin.dt_graph_passes()[0])


def test_uuid_changes_with_rank(dist_world) -> None:
    uuids = dist_world(2).run(_rank_uuid)
    assert len(set(uuids)) == 2
    assert _rank_uuid() not in uuids  # and without a process group it differs again


# `SALT`: a constant no earlier run compiled, so the first compile misses Inductor's cache
# while the cache directory stays the one every compile of the test run shares (with a
# directory of its own the test took 24 s alone instead of 16 s: torch 2.13, 2 cores).
FX_CACHE_SCRIPT = """
import torch
from dt_core.testing.compiled import counting_compiles
from dt_sample_plugin import plugin

def step(x):
    return (x.sin() * SALT).cos() + 1

def compile_once():
    torch._dynamo.reset()
    with counting_compiles() as counts:
        torch.compile(step)(torch.randn(16))
    return {k: counts[k] for k in
            ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass")}

print("FIRST", compile_once(), len(plugin.pass_calls))
print("SECOND", compile_once(), len(plugin.pass_calls))
plugin.PASS_SETTINGS["mode"] = "other"
print("CHANGED", compile_once(), len(plugin.pass_calls))
"""


def test_fx_graph_cache_hits_on_unchanged_compile_and_misses_on_new_settings() -> None:
    env = dict(os.environ)
    env.pop("DT_PLUGINS_DISABLE", None)
    salt = 2 + uuid.uuid4().int % 10**6 / 10**9
    out = run_python(FX_CACHE_SCRIPT.replace("SALT", repr(salt)), env=env)
    lines = {line.split(" ", 1)[0]: line for line in out.splitlines()}
    first, second, changed = lines["FIRST"], lines["SECOND"], lines["CHANGED"]
    assert "'fxgraph_cache_miss': 1" in first and "'fxgraph_cache_bypass': 0" in first
    assert first.endswith(" 1")  # the plugin's pass ran on the compiled graph
    assert "'fxgraph_cache_hit': 1" in second and "'fxgraph_cache_bypass': 0" in second
    assert second.endswith(" 1")  # served from the cache: the pass did not run again
    assert "'fxgraph_cache_miss': 1" in changed and changed.endswith(" 2")
