"""What users install: every package's sdist and wheel, built with `hatch build`.

The wheel must carry `py.typed` and the version written in the package's `__init__.py`
(the single source), must be pure Python (no native code ships), and the sdist must hold
everything needed to rebuild exactly the same wheel (same files, same bytes): a file
missing from the sdist would give users of the sdist a broken install.
"""

from __future__ import annotations

import importlib.util
import re
import tarfile
import zipfile
from pathlib import Path

import pytest

# what this module checks does not differ between torch releases (.ci/run: one axis only)
pytestmark = pytest.mark.ci_once

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = sorted(p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())


def load_build_dists():
    spec = importlib.util.spec_from_file_location("build_dists", ROOT / "tools/build_dists.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_dists = load_build_dists()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every package's sdist and wheel, freshly built from this tree."""
    out = tmp_path_factory.mktemp("dist")
    for name in PACKAGES:
        build_dists.build(ROOT / "packages" / name, out)
    return out


def wheel_files(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def modules_of(name: str) -> list[str]:
    src = ROOT / "packages" / name / "src"
    return sorted(p.name for p in src.iterdir() if (p / "__init__.py").exists())


def declared_version(module_dir: Path) -> str:
    match = re.search(r'^__version__ = "([^"]+)"$', (module_dir / "__init__.py").read_text(), re.M)
    assert match, f"no __version__ in {module_dir}/__init__.py"
    return match.group(1)


@pytest.mark.parametrize("name", PACKAGES)
def test_wheel_ships_py_typed_and_the_single_sourced_version(built: Path, name: str) -> None:
    path = ROOT / "packages" / name
    wheel = build_dists.wheel_of(path, built)
    assert wheel is not None, f"no wheel of {name} in {sorted(built.iterdir())}"
    assert wheel.name.endswith("-py3-none-any.whl"), f"{wheel.name}: expected a pure wheel"
    files = wheel_files(wheel)
    for module in modules_of(name):
        assert f"{module}/py.typed" in files, f"{wheel.name} lacks {module}/py.typed"
        version = declared_version(path / "src" / module)
        assert wheel.name.split("-")[1] == version
        metadata = files[f"{wheel.name.split('-')[0]}-{version}.dist-info/METADATA"].decode()
        assert f"\nVersion: {version}\n" in metadata
    assert not [f for f in files if f.endswith((".so", ".pyd", ".dll", ".dylib"))]


@pytest.mark.parametrize("name", PACKAGES)
def test_sdist_rebuilds_the_same_wheel(built: Path, name: str, tmp_path: Path) -> None:
    path = ROOT / "packages" / name
    stem = build_dists.file_stem(path)
    (sdist,) = built.glob(f"{stem}-*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    (unpacked,) = tmp_path.iterdir()
    assert (unpacked / "PKG-INFO").exists()
    rebuilt = tmp_path / "rebuilt"
    build_dists.build(unpacked, rebuilt)
    original = wheel_files(build_dists.wheel_of(path, built))
    again = wheel_files(build_dists.wheel_of(unpacked, rebuilt))
    assert sorted(again) == sorted(original)
    changed = [name for name in original if original[name] != again[name]]
    assert not changed, f"the wheel from {sdist.name} differs in {changed}"


def test_wheel_metadata_carries_the_readme(built: Path) -> None:
    """The package index shows the README (`hatch run dist:check` runs `twine check`)."""
    for name in PACKAGES:
        wheel = build_dists.wheel_of(ROOT / "packages" / name, built)
        metadata = next(v for k, v in wheel_files(wheel).items() if k.endswith("/METADATA"))
        readme = (ROOT / "packages" / name / "README.md").read_text().strip()
        assert readme.splitlines()[0] in metadata.decode()
        assert "Description-Content-Type: text/markdown" in metadata.decode()


def test_installer_refuses_a_source_tree_on_the_path() -> None:
    """The wheel cells' guard: a package importable from packages/ (here through
    PYTHONPATH) is reported, the installed one is not."""
    import os
    import subprocess
    import sys

    probe = (
        "import sys; sys.path.insert(0, 'tools'); import install_packages as i; "
        "print(i.source_tree_imports([i.package_path('dt-conv')]))"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "packages/dt-conv/src"))
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert found.returncode == 0, found.stderr
    assert "dt_conv -> " + str(ROOT / "packages/dt-conv/src/dt_conv/__init__.py") in found.stdout
    env.pop("PYTHONPATH")
    clean = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert clean.returncode == 0, clean.stderr
    # Installed editable (dev) the package also resolves into packages/; from wheels not.
    from importlib import metadata

    editable = '"editable": true' in (
        metadata.distribution("dt-conv").read_text("direct_url.json") or ""
    )
    assert (clean.stdout.strip() != "[]") == editable, clean.stdout
