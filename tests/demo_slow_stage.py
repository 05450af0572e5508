"""A demo stage with a long quiet phase (tests that the demo's console keeps talking)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch.distributed as dist

QUIET_S = 4.0
# The phase sleeps this much longer than QUIET_S: the console receives the phase's first
# line a little after the phase began (relayed from the rank), so the span the test sees
# between that line and the result would otherwise come out just under QUIET_S.
RELAY_SLACK_S = 0.25


def _silent(text: str, note: str = "") -> None:
    pass


def run_stage(small: bool = True, progress: Callable[..., None] = _silent) -> dict:
    progress("sleeping on purpose", note="a fake slow phase")
    time.sleep(QUIET_S + RELAY_SLACK_S)  # prints nothing, like a compile
    return {
        "feature": "a phase that prints nothing for a while",
        "ranks": dist.get_world_size(),
        "max_error": 0.0,
        "tolerance": 1e-6,
        "ok": True,
        "time_s": QUIET_S,
        "baseline_time_s": QUIET_S,
        "bytes_communicated": 0,
        "details": "",
    }
