"""The demo (tools/demo.py) runs under torchrun at a small size, its exit code says
whether every stage matched its reference, and its console is never quiet for long: a
phase that prints nothing gets reminders with its elapsed time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import pytest

# what this module checks does not differ between torch releases (.ci/run: one axis only)
pytestmark = pytest.mark.ci_once

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = {
    "dt-conv": "dt_conv",
    "dt-cp": "dt_cp",
    "dt-symm-mem": "dt_symm_mem",
    "dt-fsdp-passes": "dt_fsdp_passes",
}


def demo_command(*args: str) -> tuple[list[str], dict[str, str]]:
    """torchrun of the demo on 2 ranks, and its environment; `args` must include `--out`."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"), OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(ROOT / "tools" / "demo.py"),
        *args,
    ]
    return cmd, env


def run_demo(*args: str) -> subprocess.CompletedProcess:
    cmd, env = demo_command(*args)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


def timed_lines(*args: str) -> tuple[int, list[tuple[float, str]]]:
    """The demo's exit code and its console lines, each with when it arrived."""
    cmd, env = demo_command(*args)
    lines = []
    with subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as demo:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))
        code = demo.wait(timeout=300)
    return code, lines


def rank_log_tails(out: Path, lines: int = 40) -> str:
    """The end of each rank's log: where a rank that crashed in C++ says why."""
    tails = []
    for log in sorted(out.glob("rank-*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        tails.append(f"--- {log.name} ---\n" + "\n".join(tail))
    return "\n".join(tails)


def test_small_demo_passes_every_installed_stage(tmp_path: Path) -> None:
    # dt-conv's UNet through aot_eager: Inductor's C++ code for it took 93 of the demo's
    # 137 s on 2 idle cores, and dt-conv's own cell compiles its ops with Inductor.
    done = run_demo("--size", "small", "--out", str(tmp_path), "--compile-backend", "aot_eager")
    assert done.returncode == 0, done.stdout + done.stderr + rank_log_tails(tmp_path)
    table = done.stdout[done.stdout.index("| feature") :]
    for package, module in PLUGINS.items():
        row = next(line for line in table.splitlines() if line.startswith(f"| {package} |"))
        if find_spec(module) is None:
            assert "not installed" in row
        else:
            assert row.rstrip().endswith("| ok |"), row
    assert "all stages matched their references" in done.stdout
    # The console holds progress lines and the table only; ranks' chatter is in the logs.
    shown = [line for line in done.stdout.splitlines() if line.strip()]
    allowed = ("dt-plugins demo:", "[", "|", "all stages", "written:", "rank logs")
    # Every stage of the four plugins announces its phases.
    for package, module in PLUGINS.items():
        if find_spec(module) is not None:
            phases = [line for line in shown if line.startswith("[") and f"] {package}: " in line]
            assert len(phases) >= 4, (package, shown)  # 3 phases or more, then the result
    assert all(line.startswith(allowed) for line in shown), done.stdout
    assert done.stderr.strip() == "", done.stderr
    assert (tmp_path / "rank-0.log").exists() and (tmp_path / "rank-1.log").exists()
    assert (tmp_path / "results.md").read_text().strip() in done.stdout
    if find_spec("dt_conv") is not None:
        details = json.loads((tmp_path / "results.json").read_text())["dt-conv"]["details"]
        assert "aot_eager fullgraph" in details, details
    if find_spec("matplotlib") is not None:
        assert (tmp_path / "speedup.png").stat().st_size > 1000


def test_a_stage_that_mismatches_on_one_rank_fails_the_demo(tmp_path: Path) -> None:
    done = run_demo(
        "--size", "small", "--out", str(tmp_path),
        "--stages", "demo_failing_stage", "no_such_demo_module", "demo_raising_stage",
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "MISMATCH" in done.stdout and "not installed" in done.stdout
    assert "FAILED (RuntimeError: raised on purpose)" in done.stdout
    # The traceback went to the rank logs, not the console.
    assert "Traceback" not in done.stdout
    assert "raised on purpose" in (tmp_path / "rank-0.log").read_text()


def test_a_quiet_phase_gets_reminders_with_its_elapsed_time(tmp_path: Path) -> None:
    """A stage phase that prints nothing for 4 s (tests/demo_slow_stage.py): with a
    0.5 s heartbeat no gap between console lines comes near those 4 s, and the reminders
    name the phase and how long it has run."""
    from demo_slow_stage import QUIET_S

    code, lines = timed_lines(
        "--size", "small", "--out", str(tmp_path), "--heartbeat", "0.5",
        "--stages", "demo_slow_stage",
    )  # fmt: skip
    text = "\n".join(line for _, line in lines)
    assert code == 0, text + rank_log_tails(tmp_path)
    assert "[1/1] demo_slow_stage: sleeping on purpose (a fake slow phase)" in text
    reminders = [line for _, line in lines if "sleeping on purpose: " in line]
    assert len(reminders) >= 3, text
    assert reminders[-1].startswith("[1/1] demo_slow_stage: ") and "s so far" in reminders[-1]
    # The reminders count up: the last one is later in the phase than the first.
    seconds = [int(line.rsplit(": ", 1)[1].split()[0]) for line in reminders]
    assert seconds == sorted(seconds) and seconds[-1] >= QUIET_S - 1.5, reminders
    # From the stage's first line to its result, no gap comes near the quiet 4 s.
    stage = [t for t, line in lines if line.startswith("[1/1] demo_slow_stage")]
    gaps = [b - a for a, b in zip(stage, stage[1:], strict=False)]
    assert stage[-1] - stage[0] >= QUIET_S and max(gaps) < QUIET_S / 2, (gaps, text)
