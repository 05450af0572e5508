"""Cross-plugin checks: every package of the monorepo installed together works.

Runs in the `test.cross` environment, where tools/install_packages.py installed all
packages under packages/.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _declared_plugins() -> dict[str, str]:
    """plugin name -> distribution, from each package's pyproject entry points."""
    declared = {}
    for pyproject in sorted((ROOT / "packages").glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        for name in project.get("entry-points", {}).get("dt.plugins", {}):
            declared[name] = project["name"]
    return declared


def test_every_declared_plugin_is_active_together() -> None:
    import dt_core

    infos = {info.name: info for info in dt_core.activate()}
    for name, distribution in _declared_plugins().items():
        assert name in infos, f"plugin {name} of {distribution} was not discovered"
        assert infos[name].state == "active", (name, infos[name].reason)
        assert infos[name].distribution == distribution
    # left active: every later test in this process expects the installed plugins on


@pytest.mark.window_ends  # the CLI in a fresh interpreter: the window's ends
def test_dt_plugins_check_passes_with_everything_installed() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dt_core.cli", "check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok" in result.stdout
