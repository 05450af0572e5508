"""The demo stage runs on 2 ranks and agrees with the unsharded step."""

from __future__ import annotations

import pytest


@pytest.mark.ci_once
@pytest.mark.ranks(2, timeout=300)
def test_demo_stage_small_is_ok_and_well_formed() -> None:
    from dt_core.testing.demo_stage import check_stage_result
    from dt_fsdp_passes.demo import run_stage

    result = run_stage(small=True)
    check_stage_result(result, ranks=2)
    assert result["bytes_communicated"] == int(3 * 4 * 16 * 16 * 4 / 2)


@pytest.mark.ranks(2, timeout=120)
def test_stack_stage_needs_a_multiple_of_four_ranks() -> None:
    from dt_fsdp_passes.demo import run_stack_stage

    with pytest.raises(ValueError, match="multiple of 4 ranks"):
        run_stack_stage(small=True)
