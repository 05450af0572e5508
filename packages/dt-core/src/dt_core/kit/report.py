"""What `dt-plugins list --settings` and `dt-plugins stats` print: plain text from the kit."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Sequence

from .counters import STATS_ENV
from .settings import registered_settings


def text_table(rows: list[list[str]]) -> str:
    """Columns padded to their widest cell, a dashed line under the header row."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def settings_table() -> str:
    """Every registered plugin setting: value now, where it came from, its variable."""
    rows = [["plugin", "setting", "value", "source", "environment variable"]]
    renamed = []
    for plugin, store in sorted(registered_settings().items()):
        renamed += [f"  {old} -> {store.env_var(field)}" for field, old in store.aliases.items()]
        try:
            described = store.describe()
        except (TypeError, ValueError) as error:  # a bad environment value: say so
            rows.append([plugin, "(all)", f"invalid: {error}", "environment", ""])
            continue
        for row in described:
            rows.append(
                [plugin, str(row["name"]), repr(row["value"]), str(row["source"]), str(row["env"])]
            )
    if len(rows) == 1:
        return "no plugin declares settings"
    if not renamed:
        return text_table(rows)
    notes = ["", "older variable names still read (the new name wins when both are set):"]
    return "\n".join([text_table(rows), *notes, *renamed])


def run_with_stats(command: Sequence[str]) -> tuple[int, dict[str, dict[str, float]], int]:
    """Run `command` with every process reporting its counters at exit.

    Returns (exit code, counters summed over processes, number of processes reporting).
    """
    with tempfile.TemporaryDirectory(prefix="dt-stats-") as folder:
        path = os.path.join(folder, "stats.jsonl")
        env = dict(os.environ, **{STATS_ENV: path})
        code = subprocess.call(list(command), env=env)
        totals: dict[str, dict[str, float]] = {}
        processes = 0
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    processes += 1
                    for plugin, values in json.loads(line)["stats"].items():
                        mine = totals.setdefault(plugin, {})
                        for name, value in values.items():
                            mine[name] = mine.get(name, 0) + value
    return code, totals, processes


def stats_table(totals: dict[str, dict[str, float]], processes: int) -> str:
    rows = [["plugin", "counter", f"total over {processes} process(es)"]]
    for plugin, values in sorted(totals.items()):
        for name, value in sorted(values.items()):
            rows.append([plugin, name, f"{value:g}"])
    if len(rows) == 1:
        return f"no plugin counted anything ({processes} process(es) reported)"
    return text_table(rows)
