"""dt_core.testing.sweeps: the budget multiplier and CI's fixed seed."""

from __future__ import annotations

import pytest
from dt_core.testing.sweeps import sweep_examples, sweep_settings


def test_the_budget_scales_with_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("DT_SWEEP_SCALE", raising=False)
    monkeypatch.delenv("DT_TEST_SCOPE", raising=False)
    assert sweep_examples(30) == 30
    monkeypatch.setenv("DT_SWEEP_SCALE", "10")
    assert sweep_examples(30) == 300
    assert sweep_settings(4).max_examples == 40
    for bad in ("0", "-2", "many"):
        monkeypatch.setenv("DT_SWEEP_SCALE", bad)
        with pytest.raises(ValueError, match="DT_SWEEP_SCALE"):
            sweep_examples(30)


def test_ci_draws_a_fixed_sequence(monkeypatch) -> None:
    monkeypatch.delenv("DT_SWEEP_SCALE", raising=False)
    monkeypatch.setenv("DT_TEST_SCOPE", "ci")
    fixed = sweep_settings(5)
    assert fixed.derandomize and fixed.database is None and fixed.deadline is None
    monkeypatch.setenv("DT_TEST_SCOPE", "full")
    assert not sweep_settings(5).derandomize
    assert sweep_settings(5, deadline=1000).deadline is not None  # overrides win


def test_mesh_params_keep_the_first_shapes_on_every_release() -> None:
    from dt_core.testing.sweeps import mesh_params

    params = mesh_params([(2,), (3,), (2, 2), (8,), (4, 2)])
    assert [p.id for p in params] == ["2", "3", "2x2", "8", "4x2"]
    assert [p.values for p in params] == [((2,),), ((3,),), ((2, 2),), ((8,),), ((4, 2),)]
    once = [[m.name for m in p.marks] == ["ci_once"] for p in params]
    assert once == [False, False, False, True, True]
    assert [bool(p.marks) for p in mesh_params([(2,), (4,)], every_release=1)] == [False, True]


def test_ci_draws_half_the_budget_where_the_ci_once_tests_do_not_run(monkeypatch) -> None:
    monkeypatch.delenv("DT_SWEEP_SCALE", raising=False)
    monkeypatch.setenv("DT_TEST_SCOPE", "ci")
    monkeypatch.setenv("DT_CI_ONCE", "0")
    assert sweep_examples(30) == 15 and sweep_examples(1) == 1
    assert sweep_settings(12).max_examples == 6
    monkeypatch.setenv("DT_CI_ONCE", "1")
    assert sweep_examples(30) == 30
    monkeypatch.setenv("DT_TEST_SCOPE", "full")
    monkeypatch.setenv("DT_CI_ONCE", "0")
    assert sweep_examples(30) == 30
