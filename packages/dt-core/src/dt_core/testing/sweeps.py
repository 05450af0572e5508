"""How many examples a property sweep draws: a fixed budget and seed in CI, more on request.

    DT_SWEEP_SCALE=10 hatch run +torch=2.13 test:run     # ten times every sweep's budget

`sweep_settings(n)` gives hypothesis settings for a sweep whose CI budget is `n` examples:
`n * DT_SWEEP_SCALE` (default 1), no deadline (simulated ranks are slow and uneven), and a
derandomized, fixed seed in CI's scope (`DT_TEST_SCOPE=ci`), so a CI run draws the same
cases every time and a failure there reproduces on any machine. Outside CI the seed is
hypothesis's own, so repeated local runs explore further. In CI's scope on a torch axis
that leaves the `ci_once` tests to another (`DT_CI_ONCE=0`, hatch.toml's test matrix) a
sweep draws half its budget: the first half of that axis's fixed sequence.
"""

from __future__ import annotations

import os
from typing import Any

SCALE_ENV = "DT_SWEEP_SCALE"


def sweep_scale() -> int:
    """The multiplier of every sweep's budget (`DT_SWEEP_SCALE`, a positive integer)."""
    raw = os.environ.get(SCALE_ENV, "1")
    try:
        scale = int(raw)
    except ValueError:
        scale = 0
    if scale < 1:
        raise ValueError(f"{SCALE_ENV}={raw!r}: expected a positive integer")
    return scale


def sweep_examples(budget: int) -> int:
    """`budget` examples (what CI draws) times `DT_SWEEP_SCALE`; half of them in CI's
    scope on an axis that leaves the `ci_once` tests to another (see the module)."""
    not_once = os.environ.get("DT_CI_ONCE") == "0"
    if os.environ.get("DT_TEST_SCOPE") == "ci" and not_once:
        budget = max(1, budget // 2)
    return budget * sweep_scale()


def sweep_settings(budget: int, **overrides: Any) -> Any:
    """hypothesis `settings` for a sweep of `budget` examples in CI (see the module)."""
    from hypothesis import HealthCheck, settings

    in_ci = os.environ.get("DT_TEST_SCOPE") == "ci"
    options: dict[str, Any] = {
        "max_examples": sweep_examples(budget),
        "deadline": None,
        "derandomize": in_ci,
        "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    }
    if in_ci:  # no examples replayed from earlier runs: CI draws the same ones every time
        options["database"] = None
    options.update(overrides)
    return settings(**options)


def mesh_params(meshes: list[tuple[int, ...]], every_release: int = 3) -> list[Any]:
    """pytest params for a sweep per mesh shape, with ids like "2x3": the first
    `every_release` shapes run on every torch release; the others, larger twins of those,
    are marked `ci_once` (a CI running several releases sweeps them on one only)."""
    import pytest

    return [
        pytest.param(
            shape,
            id="x".join(map(str, shape)),
            marks=[] if i < every_release else [pytest.mark.ci_once],
        )
        for i, shape in enumerate(meshes)
    ]
