"""The demo stage runs on 2 ranks and reports an exact result in the lead's format."""

from __future__ import annotations

import pytest


@pytest.mark.ranks(2)
def test_demo_stage_small() -> None:
    import torch.distributed as dist
    from dt_cp.demo import run_stage

    result = run_stage(small=True)
    keys = {
        "feature",
        "ranks",
        "max_error",
        "tolerance",
        "ok",
        "time_s",
        "baseline_time_s",
        "bytes_communicated",
        "details",
    }
    assert set(result) == keys
    assert result["ok"], result
    assert result["ranks"] == dist.get_world_size() == 2
    assert 0 <= result["max_error"] <= result["tolerance"]
    assert result["time_s"] > 0 and result["baseline_time_s"] > 0
