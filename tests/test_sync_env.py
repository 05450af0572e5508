"""tools/sync_env.py and the environments that need it.

hatch trusts its per-name record that an environment's dependencies are installed while
the environment's folder exists; environments sharing a folder then find another one's
packages only (CI once ran the model tests without MONAI). Each shared environment's
scripts start by checking what the folder holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tomllib
from tool_scripts import import_tools

# what this module checks does not differ between torch releases (.ci/run: one axis only)
pytestmark = pytest.mark.ci_once

ROOT = Path(__file__).resolve().parent.parent
SYNC = "python tools/sync_env.py"


def test_missing_names_what_the_environment_does_not_satisfy(monkeypatch) -> None:
    (sync_env,) = import_tools(monkeypatch, "sync_env")
    wanted = [
        "pytest>=8",  # this test runs under it
        "pytest<1",  # installed, at another version
        "dt-no-such-distribution",  # not installed
        'dt-no-such-distribution-either; python_version < "3"',  # not for this Python
    ]
    assert sync_env.missing(wanted) == ["pytest<1", "dt-no-such-distribution"]
    assert sync_env.missing(["pytest"]) == []


def _shared_environments(envs: dict[str, Any]) -> set[str]:
    """Names of the environments whose folder another environment also uses."""
    users: dict[str, set[str]] = {}
    for name, env in envs.items():
        paths = [env["path"]] if "path" in env else []
        matrix_paths = env.get("overrides", {}).get("matrix", {}).get("torch", {}).get("path")
        paths += [entry["value"] for entry in matrix_paths or []]
        for path in paths:
            users.setdefault(path, set()).add(name)
    return {name for names in users.values() if len(names) > 1 for name in names}


def _first_command(scripts: dict[str, Any], script: str) -> str:
    commands = scripts[script]
    first = commands if isinstance(commands, str) else commands[0]
    return _first_command(scripts, first) if first in scripts else first


def test_every_script_of_an_environment_sharing_a_folder_starts_with_the_sync() -> None:
    envs = tomllib.loads((ROOT / "hatch.toml").read_text())["envs"]
    shared = _shared_environments(envs)
    # the torch-2.14 folder: test matrix, models, test-gpu, bench; torch 2.13: test, types
    assert {"test", "models", "test-gpu", "types", "bench"} <= shared
    for name in sorted(shared):
        scripts = envs[name].get("scripts", {})
        assert scripts, name
        for script in scripts:
            assert _first_command(scripts, script) == SYNC, f"{name}:{script}"
