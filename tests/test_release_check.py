"""tools/release_check.py, the release workflow's checks: a tag names one package and its
`__version__`, a plugin's dt-core requirement and DT_API admit the dt-core of the tree,
and the built files are one sdist and one pure wheel carrying the same metadata.

Trees and files are made by hand in tmp_path (no build, no network); the last tests run
the checks on this repository's own packages, which must always be releasable as they
stand."""

from __future__ import annotations

import io
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import release_check as rc  # noqa: E402

# what this module checks does not differ between torch releases (.ci/run: one axis only)
pytestmark = pytest.mark.ci_once

PLUGIN_PYPROJECT = """\
[project]
name = "{name}"
dynamic = ["version"]
dependencies = ["{requirement}", "torch>=2.11"]

[project.entry-points."dt.plugins"]
x = "{module}.plugin"

[tool.hatch.version]
path = "src/{module}/__init__.py"
"""


def make_package(
    root: Path, name: str, version: str, requirement: str = "", dt_api: str | None = None
) -> None:
    module = name.replace("-", "_")
    folder = root / "packages" / name
    (folder / "src" / module).mkdir(parents=True)
    (folder / "pyproject.toml").write_text(
        PLUGIN_PYPROJECT.format(name=name, module=module, requirement=requirement or "numpy")
    )
    (folder / "src" / module / "__init__.py").write_text(f'"""x"""\n\n__version__ = "{version}"\n')
    plugin = f"DT_API = {dt_api!r}\n" if dt_api else "# no DT_API: the default range\n"
    (folder / "src" / module / "plugin.py").write_text(plugin)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """dt-core 0.3.0 with hook API 1.4, and a plugin dt-x 0.2.0 written for both."""
    make_package(tmp_path, "dt-core", "0.3.0")
    hookspecs = tmp_path / "packages/dt-core/src/dt_core/hookspecs.py"
    hookspecs.write_text('HOOK_API_VERSION = "1.4"\n')
    make_package(tmp_path, "dt-x", "0.2.0", "dt-core>=0.3,<1", ">=1.4,<2")
    return tmp_path


def test_a_consistent_tag_and_tree_pass(tree: Path) -> None:
    package, version, problems = rc.check_source("dt-x-v0.2.0", tree)
    assert (package.name, version, problems) == ("dt-x", "0.2.0", [])
    assert rc.check_source("refs/tags/dt-core-v0.3.0", tree)[2] == []


@pytest.mark.parametrize("tag", ["dt-x", "dt-x-0.2.0", "v0.2.0", "dt-x-vnext"])
def test_a_tag_that_names_no_version_is_refused(tree: Path, tag: str) -> None:
    with pytest.raises(rc.ReleaseError, match="<package>-v<version>"):
        rc.check_source(tag, tree)


def test_a_tag_naming_no_package_is_refused(tree: Path) -> None:
    with pytest.raises(rc.ReleaseError, match="no package 'dt-y'.*dt-core.*dt-x"):
        rc.check_source("dt-y-v0.2.0", tree)


def test_a_tag_with_another_version_than_the_package_is_refused(tree: Path) -> None:
    problems = rc.check_source("dt-x-v0.2.1", tree)[2]
    assert problems == [
        "dt-x: the tag says 0.2.1, but __version__ is 0.2.0 "
        "(bump __version__ and the CHANGELOG first, then tag that commit)"
    ]
    assert rc.check_source("dt-x-v0.2", tree)[2] == []  # the same version, spelt shorter


def test_a_plugin_whose_requirement_excludes_this_dt_core_is_refused(tree: Path) -> None:
    make_package(tree, "dt-old", "0.1.0", "dt-core>=0.1,<0.3", ">=1.0,<2")
    (problem,) = rc.check_source("dt-old-v0.1.0", tree)[2]
    assert "requires dt-core<0.3,>=0.1, which does not admit dt-core 0.3.0" in problem


def test_a_plugin_written_for_a_newer_hook_api_is_refused(tree: Path) -> None:
    make_package(tree, "dt-new", "0.1.0", "dt-core>=0.3,<1", ">=1.5,<2")
    (problem,) = rc.check_source("dt-new-v0.1.0", tree)[2]
    assert "DT_API = '>=1.5,<2', which does not admit the hook API 1.4" in problem


def test_a_plugin_without_a_dt_core_requirement_is_refused(tree: Path) -> None:
    make_package(tree, "dt-loose", "0.1.0")
    assert rc.check_source("dt-loose-v0.1.0", tree)[2] == [
        "dt-loose: no dt-core requirement in its pyproject.toml"
    ]


def test_a_dt_core_release_is_checked_against_every_plugin(tree: Path) -> None:
    make_package(tree, "dt-old", "0.1.0", "dt-core>=0.1,<0.3")
    (problem,) = rc.check_source("dt-core-v0.3.0", tree)[2]
    assert problem.startswith("dt-old: requires dt-core<0.3,>=0.1")


def write_dists(
    dist: Path, name: str, version: str, requires: str, wheel_tag: str = "py3-none-any"
) -> None:
    stem = name.replace("-", "_")
    dist.mkdir(exist_ok=True)
    metadata = f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n"
    metadata += f"Requires-Dist: {requires}\nRequires-Dist: torch>=2.11\n"
    with zipfile.ZipFile(dist / f"{stem}-{version}-{wheel_tag}.whl", "w") as wheel:
        wheel.writestr(f"{stem}-{version}.dist-info/METADATA", metadata)
    with tarfile.open(dist / f"{stem}-{version}.tar.gz", "w:gz") as sdist:
        data = metadata.encode()
        info = tarfile.TarInfo(f"{stem}-{version}/PKG-INFO")
        info.size = len(data)
        sdist.addfile(info, io.BytesIO(data))


def test_the_built_files_of_the_tagged_version_pass(tree: Path, tmp_path: Path) -> None:
    package, version, _ = rc.check_source("dt-x-v0.2.0", tree)
    write_dists(tmp_path / "dist", "dt-x", "0.2.0", "dt-core<1,>=0.3")
    files, problems = rc.check_dists(package, version, tmp_path / "dist")
    assert problems == []
    assert [f.name for f in files] == ["dt_x-0.2.0.tar.gz", "dt_x-0.2.0-py3-none-any.whl"]


@pytest.mark.parametrize(
    ("version", "requires", "wheel_tag", "expected"),
    [
        ("0.1.0", "dt-core<1,>=0.3", "py3-none-any", "not version 0.2.0"),
        ("0.2.0", "dt-core<1,>=0.3", "cp311-cp311-linux_x86_64", "not a pure Python wheel"),
        ("0.2.0", "dt-core>=0.2", "py3-none-any", "the tree says dt-core<1,>=0.3"),
    ],
    ids=["other version", "native wheel", "other dt-core requirement"],
)
def test_built_files_that_differ_from_the_tree_are_refused(
    tree: Path, tmp_path: Path, version: str, requires: str, wheel_tag: str, expected: str
) -> None:
    package, tagged, _ = rc.check_source("dt-x-v0.2.0", tree)
    write_dists(tmp_path / "dist", "dt-x", version, requires, wheel_tag)
    problems = rc.check_dists(package, tagged, tmp_path / "dist")[1]
    assert any(expected in p for p in problems), problems


def test_files_of_another_package_are_refused(tree: Path, tmp_path: Path) -> None:
    package, version, _ = rc.check_source("dt-x-v0.2.0", tree)
    write_dists(tmp_path / "dist", "dt-x", "0.2.0", "dt-core<1,>=0.3")
    write_dists(tmp_path / "dist", "dt-core", "0.3.0", "torch")
    problems = rc.check_dists(package, version, tmp_path / "dist")[1]
    assert problems == [f"{tmp_path / 'dist'}: files of other distributions: "
                        "['dt_core-0.3.0-py3-none-any.whl', 'dt_core-0.3.0.tar.gz']"]  # fmt: skip


def test_main_exits_1_naming_the_problem(capsys: pytest.CaptureFixture[str]) -> None:
    assert rc.main(["dt-conv-v999.0.0"]) == 1
    assert "the tag says 999.0.0, but __version__ is" in capsys.readouterr().err


@pytest.mark.parametrize("folder", sorted(p.parent for p in ROOT.glob("packages/*/pyproject.toml")))
def test_every_package_of_this_tree_is_releasable_at_its_version(folder: Path) -> None:
    """The contract holds in the tree as committed: each plugin's dt-core requirement
    admits the dt-core here and its DT_API the hook API here."""
    package = rc.Package(folder)
    assert rc.check_source(f"{folder.name}-v{package.version}")[2] == []
    if package.name != rc.CORE:
        assert package.plugin_modules(), f"{package.name}: no dt.plugins entry point"
        assert all(module.exists() for module in package.plugin_modules())
