"""What must hold before one package of the monorepo is published: the release workflow
(.github/workflows/release.yml) runs this on the pushed tag, before and after building.

    python tools/release_check.py TAG                 # the tag against the source tree
    python tools/release_check.py TAG --dist DIR      # and the built sdist and wheel

TAG is `<package>-v<version>` (`dt-conv-v0.2.0`). Checked, each failure named:

- the tag names a folder of packages/ and its version is the package's `__version__`
  (the one place a version is written), so a tag cannot publish other code's version;
- the version contract with dt-core, as written in this tree: each plugin's `dt-core`
  requirement admits the dt-core version here, and its `DT_API` admits the hook API
  this dt-core provides (a release of dt-core is checked against every plugin), so what
  is published installs and activates next to the dt-core it was tested with;
- with `--dist`: exactly one sdist and one pure wheel of that package and version, the
  wheel's metadata naming them and carrying the same dt-core requirement, and
  `twine check --strict` on both (what the package index would refuse).

`--github-output` appends `package=` and `version=` to $GITHUB_OUTPUT for later steps.
Needs `packaging` (and `twine` with `--dist`); no network.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from email.message import Message
from email.parser import Parser
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
CORE = "dt-core"
TAG = re.compile(r"^(?P<package>[a-z0-9][a-z0-9-]*)-v(?P<version>[0-9][0-9A-Za-z.+-]*)$")


class ReleaseError(ValueError):
    """A tag or tree that must not be published; the message says why."""


@dataclass(frozen=True)
class Package:
    """One folder of packages/, read without importing it (no torch needed)."""

    folder: Path

    @property
    def pyproject(self) -> dict:
        return tomllib.loads((self.folder / "pyproject.toml").read_text())

    @property
    def name(self) -> str:
        return str(self.pyproject["project"]["name"])

    @property
    def version(self) -> str:
        """`__version__` from the file hatch reads it from ([tool.hatch.version] path)."""
        path = self.folder / self.pyproject["tool"]["hatch"]["version"]["path"]
        found = module_constant(path, "__version__")
        if found is None:
            raise ReleaseError(f"{self.name}: no __version__ string in {path}")
        return found

    def requirement(self, name: str) -> Requirement | None:
        """The package's requirement on distribution `name`, if any."""
        for line in self.pyproject["project"].get("dependencies", []):
            requirement = Requirement(line)
            if canonical(requirement.name) == canonical(name):
                return requirement
        return None

    def plugin_modules(self) -> list[Path]:
        """The source files its `dt.plugins` entry points name."""
        points = self.pyproject["project"].get("entry-points", {}).get("dt.plugins", {})
        src = self.folder / "src"
        return [src / (value.split(":")[0].replace(".", "/") + ".py") for value in points.values()]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def module_constant(path: Path, name: str) -> str | None:
    """The string a module assigns to `name` at top level (read, never imported)."""
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        value = getattr(node, "value", None)
        for target in targets:
            if isinstance(target, ast.Name) and target.id == name:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    return value.value
    return None


def parse_tag(tag: str, root: Path = ROOT) -> tuple[Package, str]:
    """The package a tag names and the version it states."""
    tag = tag.removeprefix("refs/tags/")
    match = TAG.match(tag)
    if match is None:
        raise ReleaseError(f"tag {tag!r} is not <package>-v<version> (e.g. dt-conv-v0.2.0)")
    folder = root / "packages" / match["package"]
    if not (folder / "pyproject.toml").exists():
        known = sorted(p.parent.name for p in (root / "packages").glob("*/pyproject.toml"))
        raise ReleaseError(f"tag {tag!r}: no package {match['package']!r} (packages: {known})")
    return Package(folder), match["version"]


def check_version(package: Package, version: str) -> list[str]:
    """The tag's version is the package's `__version__`."""
    try:
        same = Version(version) == Version(package.version)
    except InvalidVersion as error:
        return [f"{package.name}: {error}"]
    if same:
        return []
    return [
        f"{package.name}: the tag says {version}, but __version__ is {package.version} "
        "(bump __version__ and the CHANGELOG first, then tag that commit)"
    ]


def check_contract(plugin: Package, core: Package) -> list[str]:
    """`plugin` installs next to this dt-core (its requirement) and activates on it
    (its DT_API against dt-core's HOOK_API_VERSION)."""
    problems = []
    requirement = plugin.requirement(CORE)
    if requirement is None:
        problems.append(f"{plugin.name}: no {CORE} requirement in its pyproject.toml")
    elif not requirement.specifier.contains(core.version, prereleases=True):
        problems.append(
            f"{plugin.name}: requires {requirement}, which does not admit {CORE} "
            f"{core.version} in this tree (raise the requirement, or release {CORE} first)"
        )
    hookspecs = core.folder / "src" / "dt_core" / "hookspecs.py"
    api = module_constant(hookspecs, "HOOK_API_VERSION")
    if api is None:
        return [*problems, f"{CORE}: no HOOK_API_VERSION in {hookspecs}"]
    for module in plugin.plugin_modules():
        declared = module_constant(module, "DT_API")
        if declared is not None and not SpecifierSet(declared).contains(api, prereleases=True):
            problems.append(
                f"{plugin.name}: {module.name} declares DT_API = {declared!r}, which does not "
                f"admit the hook API {api} of {CORE} {core.version} in this tree"
            )
    return problems


def check_source(tag: str, root: Path = ROOT) -> tuple[Package, str, list[str]]:
    """The tag against the tree: its package, its version and what is wrong (empty: ok)."""
    package, version = parse_tag(tag, root)
    problems = check_version(package, version)
    core = Package(root / "packages" / CORE)
    if package.name == CORE:  # a new dt-core must keep every plugin of the tree working
        plugins = [Package(p.parent) for p in sorted((root / "packages").glob("*/pyproject.toml"))]
        for plugin in plugins:
            if plugin.name != CORE:
                problems += check_contract(plugin, core)
    else:
        problems += check_contract(package, core)
    return package, version, problems


def stem(name: str) -> str:
    """A distribution name as sdist and wheel file names begin (`dt_conv`)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def check_dists(package: Package, version: str, dist: Path) -> tuple[list[Path], list[str]]:
    """The files to upload from `dist` and what is wrong with them (empty: ok)."""
    prefix = stem(package.name)
    sdists = sorted(dist.glob(f"{prefix}-*.tar.gz"))
    wheels = sorted(dist.glob(f"{prefix}-*.whl"))
    others = sorted(p.name for p in dist.iterdir() if p.is_file() and p not in sdists + wheels)
    problems = [f"{dist}: files of other distributions: {others}"] if others else []
    if len(sdists) != 1 or len(wheels) != 1:
        found = [p.name for p in sdists + wheels]
        return [], [*problems, f"{dist}: want one sdist and one wheel of {prefix}, got {found}"]
    sdist, wheel = sdists[0], wheels[0]
    if sdist.name != f"{prefix}-{version}.tar.gz":
        problems.append(f"{sdist.name}: not version {version}")
    if wheel.name != f"{prefix}-{version}-py3-none-any.whl":
        problems.append(f"{wheel.name}: not a pure Python wheel of version {version}")
    metadata = wheel_metadata(wheel)
    if canonical(metadata["Name"] or "") != canonical(package.name):
        problems.append(f"{wheel.name}: metadata names {metadata['Name']}")
    if metadata["Version"] != version:
        problems.append(f"{wheel.name}: metadata version {metadata['Version']}")
    declared = package.requirement(CORE)
    shipped = [Requirement(r) for r in metadata.get_all("Requires-Dist") or []]
    shipped = [r for r in shipped if canonical(r.name) == CORE]
    if declared is not None and [str(r.specifier) for r in shipped] != [str(declared.specifier)]:
        problems.append(
            f"{wheel.name}: requires {[str(r) for r in shipped]}, the tree says {declared}"
        )
    if not sdist_has_pkg_info(sdist):
        problems.append(f"{sdist.name}: no PKG-INFO")
    return [sdist, wheel], problems


def wheel_metadata(wheel: Path) -> Message:
    """The wheel's METADATA (empty when it has none: every check on it then fails)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA")), None)
        text = archive.read(name).decode() if name else ""
    return Parser().parsestr(text)


def sdist_has_pkg_info(sdist: Path) -> bool:
    with tarfile.open(sdist) as archive:
        return any(n.count("/") == 1 and n.endswith("/PKG-INFO") for n in archive.getnames())


def twine_check(files: list[Path]) -> int:
    """`twine check --strict`: what the package index would refuse (README rendering)."""
    command = [sys.executable, "-m", "twine", "check", "--strict", *map(str, files)]
    return subprocess.run(command).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tag", help="<package>-v<version>, e.g. dt-conv-v0.2.0")
    parser.add_argument("--dist", type=Path, help="folder holding the built sdist and wheel")
    parser.add_argument(
        "--github-output", action="store_true", help="write package= and version= outputs"
    )
    args = parser.parse_args(argv)
    try:
        package, version, problems = check_source(args.tag)
    except ReleaseError as error:
        print(f"release_check: {error}", file=sys.stderr)
        return 1
    files: list[Path] = []
    if args.dist is not None:
        files, found = check_dists(package, version, args.dist)
        problems += found
    for problem in problems:
        print(f"release_check: {problem}", file=sys.stderr)
    if problems:
        return 1
    if files and twine_check(files) != 0:
        return 1
    if args.github_output:
        with open(os.environ["GITHUB_OUTPUT"], "a") as out:
            out.write(f"package={package.folder.name}\nversion={version}\n")
    what = ", ".join(p.name for p in files) if files else "source tree"
    print(f"release_check: {package.name} {version} ready to publish ({what})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
