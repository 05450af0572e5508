"""Install monorepo packages (editable) into the current environment, torch pinned.

Hatch scripts call this before running anything: `python tools/install_packages.py
dt-core dt-conv` installs exactly those packages, so each environment proves that a
plugin installs and works with dt-core alone. Test-only distributions are named by path.
A package already installed editable from the same folder, with its pyproject.toml
unchanged since, is skipped, so the call costs nothing on the second run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "tools" / "constraints.txt"


def package_path(name: str) -> Path:
    """`dt-core` -> packages/dt-core; `all` is expanded by the caller; paths pass through."""
    candidate = ROOT / "packages" / name
    return candidate if candidate.is_dir() else (ROOT / name)


def expand(names: list[str]) -> list[str]:
    if "all" in names:
        names = [n for n in names if n != "all"]
        names += sorted(
            p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists()
        )
    return list(dict.fromkeys(names))


def is_current(path: Path) -> bool:
    """Installed editable from `path`, and installed after its pyproject last changed."""
    name = tomllib.loads((path / "pyproject.toml").read_text())["project"]["name"]
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    direct_url = dist.read_text("direct_url.json")
    if not direct_url:
        return False
    info = json.loads(direct_url)
    if not info.get("dir_info", {}).get("editable"):
        return False
    if info.get("url") != path.resolve().as_uri():
        return False
    record = next((f for f in dist.files or () if f.name == "RECORD"), None)
    if record is None:
        return False
    installed_at = Path(str(dist.locate_file(record))).stat().st_mtime
    return installed_at >= (path / "pyproject.toml").stat().st_mtime


def main(argv: list[str]) -> int:
    paths = [package_path(name) for name in expand(argv)]
    missing = [str(p) for p in paths if not (p / "pyproject.toml").exists()]
    if missing:
        print(f"install_packages: no package at {', '.join(missing)}", file=sys.stderr)
        return 2
    paths = [path for path in paths if not is_current(path)]
    if not paths:
        return 0
    command = [sys.executable, "-m", "pip", "install", "-q", "-c", str(CONSTRAINTS)]
    for path in paths:
        command += ["-e", str(path)]
    print("install_packages:", " ".join(p.name for p in paths), flush=True)
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
