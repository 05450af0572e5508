"""Install what the running hatch environment declares, when its folder lacks any of it.

    python tools/sync_env.py

Several hatch environments share one folder (hatch.toml's `path`: each models axis uses
that torch's test environment, test-gpu and bench.2.14 the torch-2.14 one, types the
torch-2.13 one), so torch is installed once. hatch records that an environment's
dependencies were synced per environment *name*, outside the project, and trusts that
record while the folder exists. When the folder is removed (.ci/run removes each axis's
environment once its tests pass) and created again under another name, the record still
reads "synced": on a CI machine that keeps hatch's data between runs, the models' tests
then found no monai. Each script of a shared environment therefore starts here: the
environment's dependencies as hatch resolves them (`hatch env show --json`, matrix
overrides applied), checked against what is installed, and installed with pip when any
is missing or at another version (torch stays pinned by the environment's
PIP_CONSTRAINT). When everything is there it costs about a second and installs nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from typing import Any


def declared(env: str) -> list[str]:
    """The dependencies hatch resolves for `env`."""
    hatch = shutil.which("hatch")
    if hatch is None:
        raise SystemExit("sync_env: hatch is not on PATH (the README asks for it)")
    shown = subprocess.run(
        [hatch, "env", "show", "--json", env], capture_output=True, text=True, check=True
    )
    return list(json.loads(shown.stdout)[env].get("dependencies", []))


def unsatisfied(requirement: Any) -> str | None:
    """What this interpreter's environment lacks for `requirement` (a packaging
    Requirement): "not installed", "<version> installed", or None when it is satisfied
    or its marker excludes this Python (extras aside). tools/gpu_env.py asks the same."""
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
        return None
    try:
        version = metadata.version(requirement.name)
    except metadata.PackageNotFoundError:
        return "not installed"
    if requirement.specifier.contains(version, prereleases=True):
        return None
    return f"{version} installed"


def missing(requirements: list[str]) -> list[str]:
    """The requirements that the running interpreter's environment does not satisfy."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # nothing to read them with: let pip decide
        return list(requirements)
    return [text for text in requirements if unsatisfied(Requirement(text)) is not None]


def main() -> int:
    env = os.environ.get("HATCH_ENV_ACTIVE")
    if not env:
        print("sync_env: not inside `hatch run`; nothing to check", file=sys.stderr)
        return 0
    requirements = declared(env)
    lacking = missing(requirements)
    if not lacking:
        return 0
    print(f"sync_env: {env} lacks {', '.join(lacking)}; installing its dependencies", flush=True)
    pip = [sys.executable, "-m", "pip", "install", "-q", *requirements]
    return subprocess.run(pip, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
