"""Install monorepo packages into the current environment, torch pinned.

    python tools/install_packages.py [--wheels] [all | NAME | PATH ...]

torch is pinned to the release the environment already holds (tools/constraints.txt when it
holds none): installing our packages never changes torch. Hatch scripts call this before
running anything: `python tools/install_packages.py
--wheels dt-core dt-conv` installs exactly those packages, so each environment proves that
a plugin installs and works with dt-core alone. Test-only distributions are named by path.

`--wheels` (the test matrix) installs what users install: each package's wheel from dist/
(built first by tools/build_dists.py when its sources are newer), never the source tree.
Our other distributions in the environment are uninstalled, a wheel already installed
with the same hash is kept, and afterwards every package must import from site-packages,
not from packages/. Without `--wheels` (dev, demo, bench) the packages are installed
editable; one already installed editable from the same folder, with its pyproject.toml
unchanged since, is skipped, so the call costs nothing on the second run.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_dists  # noqa: E402  (a sibling script, not an installed module)
from heartbeat import Heartbeat  # noqa: E402  (likewise)

ROOT = build_dists.ROOT
CONSTRAINTS = ROOT / "tools" / "constraints.txt"
package_path, expand = build_dists.package_path, build_dists.expand


def direct_url(name: str) -> dict | None:
    """pip's record of where the installed distribution `name` came from (or None)."""
    try:
        text = metadata.distribution(name).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    return json.loads(text) if text else None


def is_current_editable(path: Path) -> bool:
    """Installed editable from `path`, and installed after its pyproject last changed."""
    name = build_dists.project_name(path)
    info = direct_url(name)
    if not info or not info.get("dir_info", {}).get("editable"):
        return False
    if info.get("url") != path.resolve().as_uri():
        return False
    dist = metadata.distribution(name)
    record = next((f for f in dist.files or () if f.name == "RECORD"), None)
    if record is None:
        return False
    installed_at = Path(str(dist.locate_file(record))).stat().st_mtime
    return installed_at >= (path / "pyproject.toml").stat().st_mtime


def is_installed_wheel(name: str, wheel: Path) -> bool:
    """`name` is installed from a wheel with exactly the bytes of `wheel`."""
    info = direct_url(name)
    recorded = (info or {}).get("archive_info", {}).get("hashes", {}).get("sha256")
    return recorded == hashlib.sha256(wheel.read_bytes()).hexdigest()


def ours_installed() -> set[str]:
    """Our distributions (any package folder, plus the test-only ones) installed here."""
    ours = {build_dists.project_name(p) for p in map(package_path, expand(["all"]))}
    ours.add("dt-sample-plugin")
    present = set()
    for name in ours:
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        present.add(name)
    return present


def pip(*args: str) -> None:
    """pip, quiet (-q), with the console reminded what runs: a first editable install of
    every package takes ~40 s on 2 cores, which would otherwise look like a hang."""
    with Heartbeat(interval=15) as beat:
        beat.quiet_phase(f"pip {args[0]}", prefix="install_packages: ")
        subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def torch_constraints() -> Path:
    """A constraints file pinning the torch this environment already has (our packages
    must never change it: the 2.14 cells keep 2.14.1), else tools/constraints.txt."""
    try:
        version = metadata.version("torch").split("+")[0]
    except metadata.PackageNotFoundError:
        return CONSTRAINTS
    pinned = ROOT / "build" / f"constraints-installed-torch-{version}.txt"
    pinned.parent.mkdir(parents=True, exist_ok=True)
    # written whole, then renamed: two environments of one torch (.ci/run's type check and
    # docs build run side by side) never read a half-written file
    partial = pinned.with_name(f"{pinned.name}.{os.getpid()}")
    partial.write_text(f"torch=={version}\n")
    os.replace(partial, pinned)
    return pinned


def source_tree_imports(paths: list[Path]) -> list[str]:
    """Top-level modules of `paths` that this interpreter would import from the repo."""
    bad = []
    for path in paths:
        for module in sorted((path / "src").iterdir()):
            if not (module / "__init__.py").exists():
                continue
            spec = importlib.util.find_spec(module.name)
            origin = Path(spec.origin).resolve() if spec and spec.origin else None
            if origin is None or (ROOT / "packages") in origin.parents:
                bad.append(f"{module.name} -> {origin}")
    return bad


def install_wheels(paths: list[Path]) -> int:
    outs = {path: build_dists.default_out(path) for path in paths}
    for path, out in outs.items():
        if not build_dists.is_current(path, out):
            build_dists.build(path, out)
            print(f"install_packages: built {path.name}", flush=True)
    wheels = {
        build_dists.project_name(path): build_dists.wheel_of(path, out)
        for path, out in outs.items()
    }
    keep = {n for n, wheel in wheels.items() if wheel and is_installed_wheel(n, wheel)}
    remove = sorted(ours_installed() - keep)
    if remove:
        pip("uninstall", "-q", "-y", *remove)
    todo = [str(wheel) for name, wheel in wheels.items() if name not in keep]
    if todo:
        print("install_packages: wheels", " ".join(Path(w).name for w in todo), flush=True)
        pip("install", "-q", "-c", str(torch_constraints()), *todo)
    importlib.invalidate_caches()
    bad = source_tree_imports(paths)
    if bad:
        print("install_packages: imported from the source tree: " + ", ".join(bad))
        return 1
    return 0


def install_editable(paths: list[Path]) -> int:
    paths = [path for path in paths if not is_current_editable(path)]
    if not paths:
        return 0
    command = ["install", "-q", "-c", str(torch_constraints())]
    for path in paths:
        command += ["-e", str(path)]
    print("install_packages: editable", " ".join(p.name for p in paths), flush=True)
    pip(*command)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", action="store_true", help="install built wheels")
    args, paths = build_dists.parse_with_packages(parser, argv)
    return install_wheels(paths) if args.wheels else install_editable(paths)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
