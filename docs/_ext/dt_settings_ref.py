"""The settings reference, read from the plugins' settings stores while the site builds.

`{dt-settings}` renders every `dt_core.kit.SettingsStore` registered once the installed
plugins' settings modules are loaded (what `dt-plugins list --settings` shows): each
setting's type, default, environment variable and older name, and the settings class's
own docstring. Nothing here is written by hand, so the page cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.nodes import nested_parse_with_titles


def _type_name(kind: Any) -> str:
    """A field's type as a reader writes it (`Literal['a', 'b']`, `float | None`)."""
    text = kind.__name__ if isinstance(kind, type) else str(kind)
    return text.replace("typing.", "")


def store_lines(plugin: str, store: Any) -> list[str]:
    """Markdown (the pages are MyST) for one store: a heading, its docstring, a table."""
    schema = store.schema
    lines = [f"## {plugin} (`{schema.__module__}.{schema.__qualname__}`)", ""]
    doc = inspect.getdoc(schema) or ""
    if doc:
        lines += ["```text", *doc.splitlines(), "```", ""]
    hints = typing.get_type_hints(schema)
    lines += [
        "| setting | type | default | environment variable | older name |",
        "|---|---|---|---|---|",
    ]
    for field in dataclasses.fields(schema):
        default = field.default if field.default is not dataclasses.MISSING else None
        alias = store.aliases.get(field.name)
        cells = [
            f"`{field.name}`",
            f"`{_type_name(hints[field.name])}`".replace("|", "\\|"),
            f"`{default!r}`",
            f"`{store.env_var(field.name)}`",
            f"`{alias}`" if alias else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


class SettingsReference(Directive):
    """Every registered plugin setting, one table per plugin (in a MyST page)."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from dt_core.kit import registered_settings

        stores = registered_settings()
        if not stores:
            raise self.error("no plugin settings store is registered: are the plugins installed?")
        lines: list[str] = []
        for plugin, store in sorted(stores.items()):
            lines += store_lines(plugin, store)
        container = nodes.section()
        container.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source="dt-settings"), container)
        return list(container.children)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("dt-settings", SettingsReference)
    return {"version": "1", "parallel_read_safe": True}
