"""No import cycle among the modules of any package's `src/`.

A cycle makes the import order matter and hides which module owns a decision (#26: dt-cp's
`algorithms` and `simulated` imported each other). Imports are read from the sources,
top-level ones and lazy ones (inside functions) both: a lazy import only defers a cycle.
Imports under `if TYPE_CHECKING:` do not run and are not counted. Here, not in a
package's cell: every package change runs `cross` (`tools/affected.py`).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def modules(packages: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every `<package>/src/**.py` under `packages`."""
    found = {}
    for src in sorted(packages.glob("*/src")):
        for f in sorted(src.rglob("*.py")):
            parts = list(f.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = f
    return found


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, bool]]:
    """(module of `known` imported, whether lazily) for each import in `path`."""
    is_package = path.name == "__init__.py"
    found: list[tuple[str, bool]] = []

    def targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        base = node.module or ""
        if node.level:
            package = name.split(".") if is_package else name.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([base] if base else []))
        # `from pkg import sub` imports the submodule; `from mod import name`, the module
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.extend((t, lazy) for t in targets(child) if t in known and t != name)
            inner = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, lazy or inner)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other, directly or round a loop (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return sorted(found)


def graphs(packages: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(top-level imports only, top-level and lazy imports) as module -> imported."""
    known = modules(packages)
    top: dict[str, set[str]] = {m: set() for m in known}
    every: dict[str, set[str]] = {m: set() for m in known}
    for name, path in known.items():
        for target, lazy in imports(name, path, known):
            every[name].add(target)
            if not lazy:
                top[name].add(target)
    return top, every


def test_no_import_cycle_in_any_package() -> None:
    top, every = graphs(ROOT / "packages")
    assert len(top) > 100  # every package's modules were read
    assert cycles(top) == []
    assert cycles(every) == []  # lazy imports included


def test_a_lazy_cycle_is_found(tmp_path: Path) -> None:
    """The check can fail: two modules importing each other, one of them lazily."""
    src = tmp_path / "pkg-a" / "src" / "pkg_a"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "one.py").write_text("from .two import g\n\ndef f():\n    return g()\n")
    (src / "two.py").write_text("def g():\n    from pkg_a import one\n\n    return one\n")
    (src / "three.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import one\n"
    )
    top, every = graphs(tmp_path)
    assert cycles(top) == []
    assert cycles(every) == [["pkg_a.one", "pkg_a.two"]]
