"""The result every plugin's demo stage returns (`run_stage(small)`, tabulated by
`tools/demo.py`), and the check its tests share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

STAGE_RESULT_KEYS = frozenset(
    {
        "feature",  # what the stage computes, one line
        "ranks",
        "max_error",  # against the same computation on one process
        "tolerance",
        "ok",  # max_error <= tolerance on this rank
        "time_s",  # with the plugin
        "baseline_time_s",  # without it, measured in the same run
        "bytes_communicated",  # per rank
        "details",
    }
)
# Keys a stage may add: the demo's plots show them, and stages written before them pass.
OPTIONAL_STAGE_RESULT_KEYS = frozenset(
    {
        "size",  # the sizes it ran at, a few words ("B=1 H=8 S=8192 D=64")
    }
)


def check_stage_result(result: Mapping[str, Any], ranks: int) -> None:
    """Assert `result` is a stage result in the demo's format that matched its reference
    within tolerance on `ranks` ranks, with both timings measured."""
    keys, allowed = set(result), STAGE_RESULT_KEYS | OPTIONAL_STAGE_RESULT_KEYS
    assert STAGE_RESULT_KEYS <= keys <= allowed, (
        f"keys {sorted(keys)}: missing {sorted(STAGE_RESULT_KEYS - keys)}, "
        f"unknown {sorted(keys - allowed)}"
    )
    assert isinstance(result.get("size", "-"), str) and result.get("size", "-"), result
    assert result["ok"] is True, result
    assert result["ranks"] == ranks, result
    assert 0 <= result["max_error"] <= result["tolerance"], result
    assert result["time_s"] > 0 and result["baseline_time_s"] > 0, result
