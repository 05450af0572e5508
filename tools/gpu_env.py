"""Environment checks of tools/gpu_check.sh, around its install of our wheels into a
private folder: the GPU run must test exactly those wheels, each plugin registered once.

    python tools/gpu_env.py clean WHEEL... [--allow-stale]
        before the install: none of our distributions is importable yet, one wheel per
        package, and each wheel holds what packages/<name>/src holds now (a stale wheel
        would test old code; --allow-stale only warns);
    python tools/gpu_env.py verify SITE WHEEL... [--dep-wheels DIR]
        after it (SITE on PYTHONPATH): each package visible once, from SITE, with its entry
        points; a requirement this Python lacks is installed from DIR's wheels, or named.

Exit status 1 with the reason on any problem. Standard library only (plus `packaging`,
which pip and pytest bring, for requirement markers and versions).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import importlib.util
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import tomllib

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sync_env import unsatisfied  # noqa: E402  (a sibling script, not an installed module)

ROOT = Path(__file__).resolve().parent.parent
GROUPS = ("torch.backends", "dt.plugins", "pytest11")  # the entry points the run relies on


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_of(wheel: Path) -> str:
    """dist/dt_core-0.2.0-py3-none-any.whl -> dt-core"""
    return normalize(wheel.name.split("-")[0])


def visible_distributions(names: set[str]) -> list[md.Distribution]:
    """Installed distributions named in `names` or called dt-*, duplicates included."""
    found = []
    for dist in md.distributions():
        name = normalize(dist.metadata["Name"] or "")  # a broken install may lack one
        if name in names or name.startswith("dt-"):
            found.append(dist)
    return found


def _where(dist: md.Distribution) -> str:
    return str(Path(str(dist.locate_file(""))).resolve())


def _pyproject(project: str) -> dict:
    path = ROOT / "packages" / project / "pyproject.toml"
    return tomllib.loads(path.read_text())["project"] if path.exists() else {}


def _entry_points(text: str) -> dict[str, dict[str, str]]:
    """entry_points.txt (INI sections of `name = value` lines) as {group: {name: value}}."""
    found: dict[str, dict[str, str]] = {}
    group = ""
    for line in map(str.strip, text.splitlines()):
        if line.startswith("[") and line.endswith("]"):
            group = line[1:-1]
        elif "=" in line and group:
            name, value = line.split("=", 1)
            found.setdefault(group, {})[name.strip()] = value.strip()
    return found


def _wheel_files(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as z:
        return {n: z.read(n) for n in z.namelist() if not n.endswith("/")}


def wheel_entry_points(packed: dict[str, bytes]) -> dict[str, dict[str, str]]:
    """The entry points a wheel (its files, from `_wheel_files`) declares."""
    points = next((b for n, b in packed.items() if n.endswith(".dist-info/entry_points.txt")), b"")
    return _entry_points(points.decode())


def stale_files(wheel: Path) -> list[str]:
    """What differs between the wheel and packages/<name>: source files (added, removed,
    changed) and entry points."""
    source = ROOT / "packages" / project_of(wheel) / "src"
    if not source.is_dir():
        return []  # not one of packages/: nothing to compare with
    packed = _wheel_files(wheel)
    files = {
        str(p.relative_to(source)): p
        for p in source.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    code = {n: b for n, b in packed.items() if ".dist-info/" not in n}
    differ = sorted(n for n in files.keys() | code.keys() if n not in code or n not in files)
    differ += sorted(n for n in files.keys() & code.keys() if files[n].read_bytes() != code[n])
    packed_points = wheel_entry_points(packed)
    packed_points.pop("console_scripts", None)
    wanted = _pyproject(project_of(wheel)).get("entry-points", {})
    if packed_points != wanted:
        differ.append(f"entry points (wheel {packed_points}, pyproject {wanted})")
    return differ


def clean(wheels: list[Path], allow_stale: bool = False) -> list[str]:
    problems = []
    projects = [project_of(w) for w in wheels]
    for project in sorted({p for p in projects if projects.count(p) > 1}):
        problems.append(f"several wheels of {project} in {wheels[0].parent}/: keep one")
    for dist in visible_distributions(set(projects)):
        problems.append(
            f"{dist.name} {dist.version} is already installed in {_where(dist)}: the run "
            "would register its plugins twice; uninstall it or use a Python without it"
        )
    for project in projects:
        module = project.replace("-", "_")
        spec = importlib.util.find_spec(module)
        if spec is not None and not visible_distributions({project}):
            problems.append(f"{module} is importable from {spec.origin} without its wheel")
    for wheel in wheels:
        if differ := stale_files(wheel):
            stale = f"{wheel.name} differs from packages/{project_of(wheel)}: {', '.join(differ)}"
            if allow_stale:
                print(f"gpu_env: WARNING: {stale} (testing the wheel as it is)")
            else:
                problems.append(f"{stale}; rebuild it (python3 tools/build_dists.py all)")
    return problems


def _missing_requirements(projects: set[str]) -> dict[str, str]:
    """Requirements of our distributions (extras aside) that this Python does not satisfy:
    project name -> what is wrong."""
    from packaging.requirements import Requirement

    missing = {}
    for dist in visible_distributions(projects):
        for text in dist.requires or []:
            req = Requirement(text)
            problem = unsatisfied(req)
            if problem is None:
                continue
            if normalize(req.name) == "torch" and problem != "not installed":
                continue  # the machine's torch is what is checked, never replaced
            missing[normalize(req.name)] = f"{req} (for {dist.name}): {problem}"
    return missing


def _install_dependencies(site: Path, names: set[str], folder: Path) -> list[str]:
    """Install into `site` the wheels in `folder` of the projects `names`; their names."""
    found = [w for w in sorted(folder.glob("*.whl")) if project_of(w) in names]
    if found:
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
        pip += ["--no-compile", "--target", str(site), *map(str, found)]
        subprocess.run(pip, check=True)
        importlib.invalidate_caches()
    return [w.name for w in found]


def verify(site: Path, wheels: list[Path], dep_wheels: Path | None) -> list[str]:
    projects = {project_of(w) for w in wheels}
    site = site.resolve()
    problems = []
    for project in sorted(projects):
        found = [d for d in visible_distributions({project}) if normalize(d.name) == project]
        where = [_where(d) for d in found]
        if len(found) != 1 or where[0] != str(site):
            problems.append(f"{project}: expected once in {site}, found in {where or 'nowhere'}")
    strays = [d for d in visible_distributions(set()) if normalize(d.name) not in projects]
    problems += [f"{d.name} {d.version} in {_where(d)} is visible too" for d in strays]
    for group in GROUPS:
        names = [
            ep.name
            for d in visible_distributions(projects)
            for ep in d.entry_points
            if ep.group == group
        ]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            problems.append(f"entry points registered twice in {group}: {twice}")
        declared = {n for w in wheels for n in wheel_entry_points(_wheel_files(w)).get(group, {})}
        if absent := sorted(declared - set(names)):
            problems.append(f"entry points of the wheels not visible in {group}: {absent}")
        print(f"gpu_env: {group}: {', '.join(sorted(names)) or 'none'}")
    missing = _missing_requirements(projects)
    if missing and dep_wheels is not None and dep_wheels.is_dir():
        if installed := _install_dependencies(site, set(missing), dep_wheels):
            print(f"gpu_env: installed from {dep_wheels}/: {', '.join(installed)}")
            missing = _missing_requirements(projects)
    problems += [
        f"missing requirement {m}: put its wheel in {dep_wheels or 'a folder'} "
        "(--dep-wheels, DT_GPU_DEP_WHEELS) and carry it"
        for m in missing.values()
    ]
    versions = ", ".join(f"{d.name} {d.version}" for d in visible_distributions(projects))
    print(f"gpu_env: {versions} from {site}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    before = sub.add_parser("clean")
    before.add_argument("wheels", nargs="+", type=Path)
    before.add_argument("--allow-stale", action="store_true", help="warn only")
    check = sub.add_parser("verify")
    check.add_argument("site", type=Path)
    check.add_argument("wheels", nargs="+", type=Path)
    check.add_argument("--dep-wheels", type=Path)
    args = parser.parse_args(argv)
    if args.step == "clean":
        problems = clean(args.wheels, args.allow_stale)
    else:
        problems = verify(args.site, args.wheels, args.dep_wheels)
    for problem in problems:
        print(f"gpu_env: ERROR: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
