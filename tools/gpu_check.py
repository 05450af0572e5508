"""One GPU check run: tests/gpu (each plugin's CUDA path, exact against one process) and
tests/gpu/timings.py (sharded / unsharded time), summarized in a dated Markdown file and
its JSON for docs/gpu.md.

    python tools/gpu_check.py [--device cuda|cpu] [--out DIR] [--reps N] [--warmup N]

tools/gpu_check.sh installs the wheels and calls this on a lent GPU machine; it also runs
wherever the packages are installed. `--device cpu` (or DT_TEST_GPU_DEVICE=cpu) runs the
same checks on CPU tensors, to try them without a GPU. Results go to --out, else $OUT,
else build/gpu-check. Each part runs in its own process under a time limit, so a hang
still leaves a report. Exit status: 0 all passed, 1 something failed, 2 no CUDA device.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GPU_TESTS = ROOT / "tests" / "gpu"
# Limits per part: together well under the 8 minutes a lent machine's command may take.
PYTEST_LIMIT_S = 270
TIMINGS_LIMIT_S = 150
WORLD = 2  # simulated ranks: tests/gpu/gpu_cases.py's WORLD
Rows = list[dict[str, Any]]


def environment(device: str) -> dict[str, Any]:
    import importlib.metadata as md

    import torch

    cuda = device == "cuda"
    count = torch.cuda.device_count() if cuda else 0
    names = sorted({torch.cuda.get_device_name(i) for i in range(count)})
    packages = sorted(
        f"{d.name} {d.version}"
        for d in md.distributions()
        if (d.metadata["Name"] or "").startswith("dt-")
    )
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": device,
        "device_name": f"{count} x {', '.join(names)}" if cuda else f"CPU ({platform.machine()})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none (CPU build)",
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else "none",
        "python": platform.python_version(),
        "override": os.environ.get("DT_PLUGINS_ALLOW_UNTESTED_TORCH") == "1",
        "packages": ", ".join(packages) or "none found",
        "world": WORLD,
    }


def _run(label: str, command: list[str], env: dict[str, str], limit_s: int) -> str | None:
    """Run `command` from the repository root; None if it finished (its verdict is in its
    output files), else why not."""
    print(f"gpu_check: {label}: {' '.join(command[1:])}", flush=True)
    try:
        subprocess.run(command, env=env, cwd=ROOT, timeout=limit_s, check=False)
    except subprocess.TimeoutExpired:
        return f"{label} stopped after {limit_s} s"
    return None


def run_checks(out: Path, env: dict[str, str], stem: str) -> tuple[Rows, list[str]]:
    """pytest over tests/gpu; its JUnit XML (kept next to the report) gives the results."""
    junit = out / f"{stem}-junit.xml"
    pytest = [sys.executable, "-m", "pytest", str(GPU_TESTS), "-v", "-rfEs", "--tb=short"]
    pytest += ["-p", "no:cacheprovider", "-o", "junit_family=xunit1", f"--junitxml={junit}"]
    problem = _run("checks", pytest, env, PYTEST_LIMIT_S)
    checks = gpu_report.read_junit(junit) if junit.exists() else []
    return checks, [problem] if problem else ([] if checks else ["pytest reported no checks"])


def run_timings(
    out: Path, env: dict[str, str], args: argparse.Namespace, stem: str
) -> tuple[Rows, list[str]]:
    path = out / f"{stem}-timings.json"
    command = [sys.executable, str(GPU_TESTS / "timings.py"), "--json", str(path)]
    command += ["--reps", str(args.reps), "--warmup", str(args.warmup)]
    problem = _run("timings", command, env, TIMINGS_LIMIT_S)
    timings = json.loads(path.read_text()) if path.exists() else []
    return timings, [problem] if problem else ([] if timings else ["timings wrote nothing"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device", choices=["cuda", "cpu"], default=os.environ.get("DT_TEST_GPU_DEVICE", "cuda")
    )
    parser.add_argument("--out", type=Path, help="results folder ($OUT, else build/gpu-check)")
    parser.add_argument("--reps", type=int, default=7, help="timed runs per workload")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs before them")
    args = parser.parse_args(argv)
    import torch

    build = f"torch {torch.__version__} (CUDA build {torch.version.cuda or 'none: CPU build'})"
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device on this machine; {build}. Nothing was run.")
        print("gpu_check: `--device cpu` runs the same checks on CPU tensors.")
        return 2
    out = (args.out or Path(os.environ.get("OUT") or ROOT / "build" / "gpu-check")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    stem = now.strftime(f"gpu-check-%Y-%m-%d-%H%M-{args.device}")
    env = {**os.environ, "DT_TEST_GPU": "1", "DT_TEST_GPU_DEVICE": args.device}
    info = environment(args.device)
    print(f"gpu_check: {info['device_name']}; {build}; {info['packages']}", flush=True)
    checks, problems = run_checks(out, env, stem)
    timings, more = run_timings(out, env, args, stem)
    if problems + more:
        info["problems"] = problems + more
    report = gpu_report.build(info, checks, timings)
    text = gpu_report.markdown(report)
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    print("\n" + text, flush=True)
    verdict = gpu_report.verdict(report)
    print(f"gpu_check: {verdict}; results in {out / stem}.md and .json", flush=True)
    return 0 if report["summary"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
