"""What a package's `benchmarks/run.py --json OUT` hands to `tools/bench_report.py`, which
renders every package's report into BENCHMARKS.md.

A report is rows, each a value against a baseline measured in the same run (`name`,
`metric`, `value`, `unit`, `baseline`, `baseline_value`, `ratio`, `target`, `notes`), and
series to plot (`title`, `x_label`, `y_label`, `x`, `lines` by label, `log_x`, `log_y`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
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


def memory_main(
    package: str,
    doc: str,
    run: Callable[..., tuple[Iterable[Mapping[str, Any]], Iterable[Mapping[str, Any]]]],
    quick_help: str,
    options: Mapping[str, str] | None = None,
) -> None:
    """The command line of a package's `benchmarks/memory.py`: `--quick`, `--json OUT`
    and integer `options` ({"--seq": "help"}); calls `run(quick, **options)`, which returns
    `scaling_report`'s rows and series, and writes them as `package`'s report."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    for flag, help_text in (options or {}).items():
        parser.add_argument(flag, type=int, help=help_text)
    parser.add_argument("--json", required=True, help="where to write the results")
    args = vars(parser.parse_args())
    out, quick = args.pop("json"), args.pop("quick")
    rows, series = run(quick, **args)
    write_report(out, package, rows, series)
