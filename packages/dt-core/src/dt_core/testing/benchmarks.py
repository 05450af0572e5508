"""What a package's `benchmarks/run.py --json OUT` hands to `tools/bench_report.py`, which
renders every package's report into BENCHMARKS.md.

A report is rows, each a value against a baseline measured in the same run (`name`,
`metric`, `value`, `unit`, `baseline`, `baseline_value`, `ratio`, `target`, `notes`), and
series to plot (`title`, `x_label`, `y_label`, `x`, `lines` by label, `log_x`, `log_y`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


def write_report(
    path: str,
    package: str,
    rows: Iterable[Mapping[str, Any]],
    series: Iterable[Mapping[str, Any]] = (),
) -> None:
    """Write `package`'s benchmark report to `path` (JSON) and print one line per row."""
    rows, series = list(rows), list(series)
    with open(path, "w") as f:
        json.dump({"package": package, "rows": rows, "series": series}, f, indent=2)
    for row in rows:
        line = (
            f"{row['name']}: {row['value']:.4g} {row['unit']} vs {row['baseline_value']:.4g} "
            f"({row['ratio']:.3g}x, target {row['target']}) {row.get('notes', '')}"
        )
        print(line.rstrip(), flush=True)
