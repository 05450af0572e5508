"""The result every plugin's demo stage returns (`run_stage(small)`, tabulated by
`tools/demo.py`): the builder the stages share, and the check their tests share."""

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


def stage_result(
    feature: str,
    *,
    error: float,
    tolerance: float,
    times: tuple[float, float],
    bytes_communicated: int,
    size: str,
    details: str,
) -> dict[str, Any]:
    """A stage's result from this rank's `error` and `times` (with the plugin, without):
    each the worst over all ranks (one collective; every rank returns the same result),
    and `ok` by the rule `check_stage_result` holds every stage to."""
    import torch
    import torch.distributed as dist

    worst = torch.tensor([error, *times], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    max_error, time_s, baseline_time_s = worst.tolist()
    return {
        "feature": feature,
        "ranks": dist.get_world_size(),
        "max_error": max_error,
        "tolerance": tolerance,
        "ok": max_error <= tolerance,
        "time_s": time_s,
        "baseline_time_s": baseline_time_s,
        "bytes_communicated": int(bytes_communicated),
        "size": size,
        "details": details,
    }


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
