"""Run the benchmarks: each package's script in a fresh interpreter, one after another.

Its own module because running (subprocesses, timeouts, the console's heartbeat, the
machine's description) is apart from rendering the report from saved runs: bench_compare.py
runs packages the same way, and `--render-only` runs nothing.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_results import ROOT, SUITES
from heartbeat import Heartbeat


def machine_info() -> list[str]:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f"{mem_kb / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        memory = "unknown"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return [
        f"- date: {datetime.date.today().isoformat()}",
        f"- CPU: {cpu}, {os.cpu_count()} cores, {memory} memory, no GPU"
        if not torch.cuda.is_available()
        else f"- CPU: {cpu}, {os.cpu_count()} cores; GPU: {torch.cuda.get_device_name()}",
        f"- Python {platform.python_version()}",
        f"- load average when the run started: {load:.2f} (other work on the machine adds noise)",
    ]


def run_streamed(
    cmd: list[str], timeout: float, say: Callable[[str], None]
) -> tuple[int | None, str, str]:
    """Run `cmd`, handing each line of its stdout to `say` as it comes (a benchmark's rows
    reach the console while it runs); its exit code (None: killed after `timeout` s),
    stdout and stderr."""
    expired = threading.Event()
    with (
        tempfile.TemporaryFile("w+") as err,
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1) as proc,
    ):

        def kill() -> None:
            expired.set()
            proc.kill()

        timer = threading.Timer(timeout, kill)
        timer.start()
        lines = []
        try:
            assert proc.stdout is not None  # piped above
            for line in proc.stdout:
                lines.append(line)
                say(line.rstrip("\n"))
            code = proc.wait()
        finally:
            timer.cancel()
        err.seek(0)
        return (None if expired.is_set() else code), "".join(lines), err.read()


def _ignore(line: str) -> None:
    """Where a benchmark's lines go when nobody watches (bench_compare's rounds)."""


def run_package(
    bench: Path,
    quick: bool,
    timeout: int,
    python: str = sys.executable,
    say: Callable[[str], None] = _ignore,
) -> dict[str, Any]:
    """One package's benchmark in a fresh interpreter (this one's torch unless `python` is
    another environment's), its printed lines handed to `say`; failures become a report
    row."""
    package = bench.parent.parent.name
    suite = next((s for s, name in SUITES.items() if name == bench.name), "time")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [python, str(bench), "--json", str(out)] + (["--quick"] if quick else [])
        start = time.perf_counter()
        code, stdout, stderr = run_streamed(cmd, timeout, say)
        if code is None:
            return {"package": package, "suite": suite, "error": f"timed out after {timeout} s"}
        elapsed = time.perf_counter() - start
        if code != 0 or not out.exists():
            tail = (stderr or stdout).strip().splitlines()[-3:]
            error = " / ".join(tail) or f"exit {code}"
            return {"package": package, "suite": suite, "error": error}
        result = json.loads(out.read_text())
    result["elapsed_s"] = elapsed
    result["suite"] = suite
    return result


def import_time(quick: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(ROOT / "tools" / "bench_import_time.py"), "--json", "-"]
    cmd += ["--runs", "5" if quick else "21"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        return {"package": "dt-core", "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_benchmarks(
    only: list[str] | None,
    quick: bool,
    timeout: int,
    beat: Heartbeat,
    suites: tuple[str, ...] = tuple(SUITES),
) -> list[dict[str, Any]]:
    """Every chosen benchmark, one after another; the console names each while it runs
    (compiles inside a benchmark print nothing for minutes) and shows the rows it prints."""
    results = []
    if (not only or "dt-core" in only) and "time" in suites:
        beat.phase("measuring import time", prefix="dt-core: ")
        results.append(import_time(quick))
    benches = [b for s in suites for b in ROOT.glob(f"packages/*/benchmarks/{SUITES[s]}")]
    for bench in sorted(benches, key=lambda b: (b.parent.parent.name, b.name != "run.py")):
        package = bench.parent.parent.name
        if only and package not in only:
            continue
        where = bench.relative_to(ROOT)
        beat.phase(f"running {where}", note="compiles print nothing", prefix=f"{package}: ")
        results.append(run_package(bench, quick, timeout, say=beat.say))
        status = results[-1].get("error") or f"{results[-1]['elapsed_s']:.0f} s"
        beat.phase(f"done, {status}" if "error" not in results[-1] else f"FAILED: {status}")
    beat.quiet_phase("writing the report", prefix="")
    return results
