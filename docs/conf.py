"""Sphinx settings of the documentation site (`hatch run docs:build` -> build/docs/html).

Strict: the build runs with -W --keep-going -n, so a broken cross-reference, a page outside
every toctree or a link to a missing file fails it. Names from torch and the standard
library are not resolved (no intersphinx: the build runs offline), so references into
them are let through by `nitpick_ignore_regex`; references to our own objects are not.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

project = "DTensor plugins"
author = "the DTensor plugins authors"
copyright = "the DTensor plugins authors"  # noqa: A001 - Sphinx's setting name

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "myst_parser",
    "sphinxarg.ext",
    "dt_settings_ref",
    "dt_docs_check",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
# The third-party plugin example is a package of its own, not pages of this site.
exclude_patterns = ["examples/**", "demo/results.md", "_build", "Thumbs.db", ".DS_Store"]

# dt_docs_check: the Markdown files whose fences, headings and sections are checked when
# the build starts (glob patterns under the repository root): the pages and the files
# they include or that are published elsewhere (PyPI pages, GitHub's front page).
dt_docs_check_root = ".."
dt_docs_check_files = [
    "README.md",
    "BENCHMARKS.md",
    "ARCHITECTURE.md",
    "packages/*/README.md",
    "packages/*/CHANGELOG.md",
    "docs/**/*.md",
]

myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

# Docstrings are written with Markdown's single backticks for code (`dt_core.activate()`);
# in reST a single-backtick span takes the default role, which would render it italic
# (a "title reference"). The code role renders it as code, as the Markdown pages do.
default_role = "code"

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

nitpicky = True
nitpick_ignore_regex = [
    # torch, pluggy and the standard library are documented elsewhere (offline build).
    (r"py:.*", r"(torch|pluggy|numpy|mmap|multiprocessing)(\..*)?"),
    (r"py:.*", r"(collections|contextlib|typing|types|argparse|enum)(\..*)?"),
    (r"py:.*", r"(Any|Callable|Iterator|Iterable|Mapping|Sequence|Generator|Self|T|F|P)"),
    (r"py:.*", r"(Tensor|DTensor|DeviceMesh|ProcessGroup|Placement|OpOverload|Module)"),
    (r"py:.*", r"(Path|pathlib\..*|Literal\[.*|NoneType|Exception|RuntimeError|ValueError)"),
    # Type variables and private aliases of our modules show in signatures by name.
    (r"py:.*", r"dt_[a-z_]+(\.[a-z_]+)*\.(_[A-Za-z_]+|[A-Z])"),
]

html_theme = "furo"
html_title = "DTensor plugins"
