"""dt_core.testing.demo_stage: the stage-result check plugins' demo tests share accepts
the optional `size` and refuses a result missing a key or carrying an unknown one."""

from __future__ import annotations

from typing import Any

import pytest
from dt_core.testing.demo_stage import STAGE_RESULT_KEYS, check_stage_result


def _result(**extra: Any) -> dict[str, Any]:
    result: dict[str, Any] = {
        "feature": "f",
        "ranks": 2,
        "max_error": 0.0,
        "tolerance": 1e-6,
        "ok": True,
        "time_s": 1.0,
        "baseline_time_s": 2.0,
        "bytes_communicated": 0,
        "details": "",
    }
    assert set(result) == STAGE_RESULT_KEYS
    return result | extra


def test_a_result_with_or_without_its_size_passes() -> None:
    check_stage_result(_result(), ranks=2)
    check_stage_result(_result(size="B=1 S=512"), ranks=2)


@pytest.mark.parametrize(
    "result",
    [
        _result(size=""),
        _result(size=512),
        _result(speed="fast"),
        {k: v for k, v in _result().items() if k != "details"},
    ],
    ids=["empty size", "size not text", "unknown key", "missing key"],
)
def test_a_malformed_result_fails(result: dict[str, Any]) -> None:
    with pytest.raises(AssertionError):
        check_stage_result(result, ranks=2)
