"""Installing a plugin never changes the user's torch, on every torch of the matrix.

The cell installed our wheels next to the torch its environment holds (one release of
the window per axis, 2.11.0 to 2.15.0); here pip resolves each plugin's wheel with
dt-core's wheel as a user's `pip install` would, with no constraint file and no index to
fetch another torch from: the resolution must succeed and install no torch. A
requirement that rules out this torch makes the same resolution fail, so the check can
fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ["dt-conv", "dt-cp", "dt-fsdp-passes", "dt-symm-mem"]


def wheel(name: str) -> Path:
    found = sorted((ROOT / "dist").glob(f"{name.replace('-', '_')}-*.whl"))
    assert found, f"no wheel of {name} in dist/ (the cell's first step builds them)"
    return found[-1]


def dry_run(*requirements: str) -> subprocess.CompletedProcess[str]:
    """pip's resolution of `requirements` in this environment, as JSON on stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # no machine-wide constraints or local indexes
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "-q"]
    return subprocess.run(
        [*command, "--report", "-", *requirements], env=env, capture_output=True, text=True
    )


def installs(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    return [item["metadata"]["name"] for item in report["install"]]


@pytest.mark.parametrize("plugin", PLUGINS)
def test_installing_a_plugin_keeps_the_environments_torch(plugin: str) -> None:
    torch_before = metadata.version("torch")
    wanted = installs(dry_run(str(wheel("dt-core")), str(wheel(plugin))))
    assert "torch" not in [name.lower() for name in wanted], wanted
    assert metadata.version("torch") == torch_before


def test_the_resolution_would_show_a_torch_change() -> None:
    """The control: ask for any torch but this one and the same resolution cannot keep it."""
    other = f"torch!={metadata.version('torch')}"
    result = dry_run(str(wheel("dt-core")), other)
    assert result.returncode != 0 or "torch" in [n.lower() for n in installs(result)]


def test_every_plugin_is_active_on_this_torch() -> None:
    check = subprocess.run(
        [sys.executable, "-m", "dt_core.cli", "check"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    # the four plugins, dt-core's own torch-gaps plugin, and any test-only plugin installed
    # beside them (dt-core's sample plugin, where every package's tests run together)
    found = len(metadata.entry_points(group="dt.plugins"))
    assert found >= 5
    assert f"dt-plugins check: ok ({found} plugin(s)" in check.stdout
