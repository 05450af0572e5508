"""No package imports another plugin, in its sources or its tests.

Each plugin installs alone with dt-core (`hatch run test:run` runs every package's tests
in a cell with only dt-core and that package; so does the forge workflow). CI runs every
package's tests in one run with every plugin installed, where an import of another plugin
would pass unnoticed: this reads the imports from the files instead, top-level and lazy
ones alike (a lazy import fails as surely, only later).
"""

from __future__ import annotations

import ast
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
CORE = "dt_core"


def package_modules(packages: Path) -> dict[str, str]:
    """Folder name under `packages` -> the top-level module its distribution installs."""
    found = {}
    for pyproject in sorted(packages.glob("*/pyproject.toml")):
        name = tomllib.loads(pyproject.read_text())["project"]["name"]
        found[pyproject.parent.name] = name.replace("-", "_")
    return found


def imported_tops(path: Path) -> set[str]:
    """The top-level module of every absolute import in `path`."""
    tops = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            tops |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            tops.add(node.module.split(".")[0])
    return tops


def foreign_imports(packages: Path) -> list[str]:
    """`file: module` for each import of another package's plugin module."""
    modules = package_modules(packages)
    found = []
    for folder, own in modules.items():
        others = set(modules.values()) - {own, CORE}
        for path in sorted((packages / folder).rglob("*.py")):
            if "build" in path.relative_to(packages / folder).parts:
                continue
            for top in sorted(imported_tops(path) & others):
                found.append(f"{path.relative_to(packages)}: {top}")
    return found


def test_no_package_imports_another_plugin() -> None:
    modules = package_modules(ROOT / "packages")
    assert {"dt-core", "dt-conv", "dt-cp", "dt-symm-mem", "dt-fsdp-passes"} <= set(modules)
    assert foreign_imports(ROOT / "packages") == []


def test_an_import_of_another_plugin_is_found(tmp_path: Path) -> None:
    """The check can fail: a test of one plugin importing another, lazily."""
    for name in ("dt-core", "dt-one", "dt-two"):
        folder = tmp_path / name
        (folder / "tests").mkdir(parents=True)
        (folder / "pyproject.toml").write_text(f'[project]\nname = "{name}"\n')
    (tmp_path / "dt-one" / "tests" / "test_a.py").write_text(
        "import dt_core\nfrom dt_one import x\n\ndef test():\n    from dt_two.sub import y\n"
    )
    assert foreign_imports(tmp_path) == ["dt-one/tests/test_a.py: dt_two"]
