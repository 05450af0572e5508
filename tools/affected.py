"""List the CI matrix cells a change touches.

    python tools/affected.py BASE [HEAD] [--json]
    python tools/affected.py --all [--json]

Why: the full matrix takes minutes on a small runner; a pull request that edits one plugin
needs that plugin's cell (dt-core and the plugin from wheels) and `cross` (all plugins
together), not the others. The rules, first match per changed file:

- dt-core, or shared tooling (`tools/`, `hatch.toml`, `.ci/`, `.github/`, `ruff.toml`, an
  unknown top-level file): every cell; every plugin depends on these.
- `packages/<plugin>/...`: that plugin's cell and `cross`.
- `tests/...` (the cross-plugin tests): `cross`.
- documentation only (`*.md` outside packages, `docs/`): no test cell.

`lint` is listed whenever anything changed (it checks the whole tree in seconds). Files
are compared from the merge base of BASE and HEAD (default HEAD), as a pull request sees
them. Prints one cell per line, or a JSON list with --json (for a workflow matrix).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = "dt-core"
CROSS = "cross"
LINT = "lint"
DOC_PREFIXES = ("docs/",)


def packages(root: Path = ROOT) -> list[str]:
    """Package cells, dt-core first, in the order the workflow lists them."""
    names = sorted(p.name for p in (root / "packages").iterdir() if (p / "pyproject.toml").exists())
    return [CORE] + [n for n in names if n != CORE]


def all_cells(root: Path = ROOT) -> list[str]:
    return [*packages(root), CROSS, LINT]


def cells_for(paths: Iterable[str], root: Path = ROOT) -> list[str]:
    """The cells that the changed repository-relative `paths` affect, in matrix order."""
    known = packages(root)
    hit: set[str] = set()
    for path in paths:
        hit.add(LINT)
        parts = path.split("/")
        if parts[0] == "packages" and len(parts) > 1 and parts[1] in known:
            hit.update(all_cells(root) if parts[1] == CORE else (parts[1], CROSS))
        elif parts[0] == "packages":
            hit.update(all_cells(root))  # a new or removed package: run everything
        elif path.startswith("tests/"):
            hit.add(CROSS)
        elif path.startswith(DOC_PREFIXES) or (len(parts) == 1 and path.endswith(".md")):
            continue
        else:  # tools/, hatch.toml, .ci/, .github/, ruff.toml and anything unknown
            hit.update(all_cells(root))
    return [cell for cell in all_cells(root) if cell in hit]


def changed_files(base: str, head: str = "HEAD", root: Path = ROOT) -> list[str]:
    """Files changed on `head` since its merge base with `base` (`git diff base...head`)."""
    out = subprocess.run(
        ["git", "diff", "--name-only", f"{base}...{head}"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [line for line in out.splitlines() if line]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", nargs="?", help="commit or branch compared against")
    parser.add_argument("head", nargs="?", default="HEAD")
    parser.add_argument("--all", action="store_true", help="every cell (pushes, schedules)")
    parser.add_argument("--json", action="store_true", help="print a JSON list")
    args = parser.parse_args(argv)
    if args.all == (args.base is not None):
        parser.error("give either BASE or --all")
    cells = all_cells() if args.all else cells_for(changed_files(args.base, args.head))
    print(json.dumps(cells) if args.json else "\n".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
