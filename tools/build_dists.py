"""Build monorepo packages' sdists and wheels with `hatch build`, into dist/.

    python tools/build_dists.py [all | NAME | PATH ...] [--out DIR] [--force]

Why: the test matrix installs what users install, the wheels, never the source tree. A
package is rebuilt only when a file under its folder is newer than its wheel (builds are
reproducible, so a rebuild of unchanged sources gives the same bytes). The older files of
a rebuilt package are removed from the output folder first, so exactly one sdist and one
wheel per package lie there. Test-only distributions (named by path, like dt-core's
sample plugin) go to dist/test-only/, away from what a release uploads. Needs `hatch`
on PATH (the README's one tool).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"
IGNORED_PARTS = {"dist", "__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache"}


def package_path(name: str) -> Path:
    """`dt-core` -> packages/dt-core; other names are paths from the repository root."""
    candidate = ROOT / "packages" / name
    return candidate if candidate.is_dir() else (ROOT / name)


def expand(names: list[str]) -> list[str]:
    """`all` -> every folder of packages/ with a pyproject.toml (in name order)."""
    if "all" in names:
        names = [n for n in names if n != "all"]
        names += sorted(
            p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists()
        )
    return list(dict.fromkeys(names))


def parse_with_packages(
    parser: argparse.ArgumentParser, argv: list[str] | None
) -> tuple[argparse.Namespace, list[Path]]:
    """`argv` parsed by `parser` plus the package names (`all`, names or paths) every tool
    here takes; returns the arguments and the package folders. Exits with status 2
    naming any that holds no package."""
    parser.add_argument("names", nargs="+", help="`all`, package names or paths")
    args = parser.parse_args(argv)
    paths = [package_path(name) for name in expand(args.names)]
    missing = [str(p) for p in paths if not (p / "pyproject.toml").exists()]
    if missing:
        parser.exit(2, f"{parser.prog}: no package at {', '.join(missing)}\n")
    return args, paths


def default_out(path: Path) -> Path:
    """dist/ for the packages of packages/; dist/test-only/ for test-only distributions
    (named by path), so they never lie among the files a release uploads."""
    return DIST if path.resolve().parent == ROOT / "packages" else DIST / "test-only"


def project_name(path: Path) -> str:
    return tomllib.loads((path / "pyproject.toml").read_text())["project"]["name"]


def file_stem(path: Path) -> str:
    """The distribution name as it begins sdist and wheel file names (`dt_core`)."""
    return project_name(path).replace("-", "_").replace(".", "_").lower()


def wheel_of(path: Path, out: Path = DIST) -> Path | None:
    """The one wheel of the package at `path` in `out`, or None."""
    found = sorted(out.glob(f"{file_stem(path)}-*.whl"))
    return found[-1] if len(found) == 1 else None


def newest_source_mtime(path: Path) -> float:
    newest = (path / "pyproject.toml").stat().st_mtime
    for file in path.rglob("*"):
        relative = file.relative_to(path).parts
        if file.is_file() and not IGNORED_PARTS.intersection(relative):
            if not any(part.endswith(".egg-info") for part in relative):
                newest = max(newest, file.stat().st_mtime)
    return newest


def is_current(path: Path, out: Path = DIST) -> bool:
    wheel = wheel_of(path, out)
    sdists = list(out.glob(f"{file_stem(path)}-*.tar.gz"))
    if wheel is None or len(sdists) != 1:
        return False
    return min(wheel.stat().st_mtime, sdists[0].stat().st_mtime) >= newest_source_mtime(path)


def hatch_command() -> list[str]:
    hatch = shutil.which("hatch")
    if hatch is None:
        raise SystemExit("build_dists: `hatch` is not on PATH (python3 -m pip install hatch)")
    return [hatch]


def build(path: Path, out: Path = DIST) -> None:
    """sdist and wheel of the package at `path` into `out`, replacing older ones."""
    out.mkdir(parents=True, exist_ok=True)
    stem = file_stem(path)
    for old in [*out.glob(f"{stem}-*.whl"), *out.glob(f"{stem}-*.tar.gz")]:
        old.unlink()
    command = [*hatch_command(), "build", "-t", "sdist", "-t", "wheel", str(out)]
    # Inside `hatch run`, HATCH_ENV_ACTIVE names the running environment, which the
    # package's own project does not have: the build must not inherit it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("HATCH_ENV")}
    done = subprocess.run(command, cwd=path, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"build_dists: hatch build failed for {path.name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="output folder (default: dist/)")
    parser.add_argument("--force", action="store_true", help="rebuild even if current")
    args, paths = parse_with_packages(parser, argv)
    for path in paths:
        out = args.out.resolve() if args.out else default_out(path)
        if not args.force and is_current(path, out):
            continue
        start = time.perf_counter()
        build(path, out)
        print(f"build_dists: {path.name} in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
