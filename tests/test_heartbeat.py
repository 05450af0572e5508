"""tools/heartbeat.py: a quiet console gets the current phase and its elapsed time every
interval, a talking one gets no reminders, and nothing is printed after the heartbeat
stops."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

from heartbeat import Heartbeat  # noqa: E402

# what this module checks does not differ between torch releases (.ci/run: one axis only)
pytestmark = pytest.mark.ci_once


def test_a_quiet_phase_is_reminded_every_interval() -> None:
    out = io.StringIO()
    with Heartbeat(out, interval=0.05) as beat:
        beat.phase("compiling", note="first run", prefix="[1/2] dt-conv: ")
        time.sleep(0.5)
    lines = out.getvalue().splitlines()
    assert lines[0] == "[1/2] dt-conv: compiling (first run)"
    reminders = lines[1:]
    assert len(reminders) >= 4, lines
    assert all(line.startswith("[1/2] dt-conv: compiling: ") for line in reminders), lines
    assert all(line.endswith(" s so far") for line in reminders), lines


def test_output_resets_the_quiet_timer() -> None:
    out = io.StringIO()
    with Heartbeat(out, interval=0.3) as beat:
        beat.phase("talking")
        for i in range(10):
            time.sleep(0.05)
            beat.say(f"line {i}")
    assert "so far" not in out.getvalue(), out.getvalue()


def test_nothing_is_printed_after_the_heartbeat_stops() -> None:
    out = io.StringIO()
    with Heartbeat(out, interval=0.05) as beat:
        beat.quiet_phase("waiting")
    before = out.getvalue()
    time.sleep(0.2)
    assert out.getvalue() == before


def test_the_reminder_counts_from_the_phase_start() -> None:
    now = [100.0]
    beat = Heartbeat(io.StringIO(), interval=10, clock=lambda: now[0])
    beat.quiet_phase("compiling the sharded UNet with inductor", prefix="[1/5] dt-conv: ")
    now[0] += 42.4
    assert beat.reminder() == "[1/5] dt-conv: compiling the sharded UNet with inductor: 42 s so far"


def test_an_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Heartbeat(io.StringIO(), interval=0)
