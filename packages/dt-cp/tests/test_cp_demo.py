"""The demo stage runs on 2 ranks and reports an exact result in the demo's format."""

from __future__ import annotations

import pytest


@pytest.mark.ranks(2)
def test_demo_stage_small() -> None:
    from dt_core.testing.demo_stage import check_stage_result
    from dt_cp.demo import run_stage

    check_stage_result(run_stage(small=True), ranks=2)
