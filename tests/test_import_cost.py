"""With every plugin installed, `import torch` stays light: autoload may define library ops
but must not pull in the heavy parts (DTensor, Dynamo, Inductor), which arm lazily.

Counts modules rather than timing (timings live in BENCHMARKS.md); a plugin package whose
`__init__` imports compile machinery once doubled `import torch`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# what `import torch` pulls in, from fresh interpreters: the window's oldest and newest
# torch bound it (.ci/run leaves it out between them)
pytestmark = pytest.mark.window_ends

HEAVY = ("torch._dynamo", "torch._inductor", "torch.distributed.tensor")
# Plugin modules that wait for first use: front ends, and the settings modules the plugins
# name as DT_SETTINGS (imported when the settings are listed).
DEFERRED = (
    "dt_fsdp_passes.frontend",
    "dt_fsdp_passes.config",
    "dt_cp.config",
    "dt_symm_mem.settings",
    "dt_core.kit.settings",
)
PROBE = "import sys, json, torch; print(json.dumps(sorted(sys.modules)))"


def imported(autoload: str) -> set[str]:
    env = dict(os.environ, DT_PLUGINS_AUTOLOAD=autoload)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_autoload_imports_no_heavy_torch_module() -> None:
    with_plugins, without = imported("1"), imported("0")
    assert "dt_core" in with_plugins  # autoload did run
    heavy = sorted(m for m in with_plugins - without if m.startswith(HEAVY))
    assert not heavy, heavy
    extra_torch = sorted(m for m in with_plugins - without if m.startswith("torch"))
    assert len(extra_torch) <= 5, extra_torch


def test_autoload_leaves_plugin_front_ends_and_settings_for_later() -> None:
    loaded = imported("1")
    assert {"dt_conv.plugin", "dt_cp.plugin", "dt_fsdp_passes.plugin"} <= loaded
    early = sorted(set(DEFERRED) & loaded)
    assert not early, early


def test_every_plugin_is_active_after_import_torch_and_lists_its_settings() -> None:
    probe = (
        "import torch, json, dt_core\n"
        "from dt_core.kit import registered_settings\n"
        "states = {p.name: p.state for p in dt_core.plugins()}\n"
        "print(json.dumps([states, sorted(registered_settings())]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DT_PLUGINS")}
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    states, stores = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(states.values()) == {"active"}, states
    assert {"cp", "fsdp-passes", "symm-mem"} <= set(stores), stores
