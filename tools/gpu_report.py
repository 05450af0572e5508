"""The results of a GPU check run as Markdown (for docs/gpu.md) and plain data (its JSON).

Reads pytest's JUnit XML (xunit1, which keeps each test's `record_property` values: the
max errors) and the timings' JSON; tools/gpu_check.py calls `build` and `markdown`.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from junit_outcomes import outcome

# Test function -> what the report calls the check; the test's parameters follow.
CHECKS = {
    "test_conv_pool_pad_interpolate_on_cuda": "dt-conv conv net, sharded",
    "test_context_parallel_sdpa_on_cuda_kernels": "dt-cp sdpa",
    "test_symm_mem_ops_on_cuda_tensors_under_the_mode": "dt-symm-mem fused_all_gather_matmul",
    "test_simple_fsdp_forward_backward_on_cuda": "dt-fsdp-passes simple_fsdp step",
}
UNSUPPORTED = "not supported by the kernel"


def check_name(test: str) -> str:
    """test_context_parallel_sdpa_on_cuda_kernels[flash-bfloat16] -> dt-cp sdpa flash bfloat16"""
    match = re.fullmatch(r"([^\[]+)(?:\[(.*)\])?", test)
    function, params = (match.group(1), match.group(2)) if match else (test, None)
    label = CHECKS.get(function, function)
    return f"{label} {params.replace('-', ' ')}" if params else label


def read_junit(path: Path) -> list[dict[str, Any]]:
    """One record per test: name, result (passed / failed / error / skipped, or
    UNSUPPORTED), message, seconds, and the recorded properties."""
    checks = []
    for case in ET.parse(path).getroot().iter("testcase"):
        row: dict[str, Any] = {"test": case.get("name", ""), "seconds": float(case.get("time", 0))}
        row["name"] = check_name(row["test"])
        row["result"], row["message"] = outcome(case)
        if row["result"] == "skipped" and UNSUPPORTED in row["message"]:
            row["result"] = UNSUPPORTED
        for prop in case.iter("property"):
            value = prop.get("value", "")
            try:
                row[prop.get("name", "")] = float(value)
            except ValueError:
                row[prop.get("name", "")] = value
        checks.append(row)
    return checks


def build(
    environment: dict[str, Any], checks: list[dict[str, Any]], timings: list[dict[str, Any]]
) -> dict[str, Any]:
    """The whole report, with its summary counts and overall verdict."""
    counts: dict[str, int] = {}
    for row in checks:
        counts[row["result"]] = counts.get(row["result"], 0) + 1
    timing_errors = [t["name"] for t in timings if t["status"].startswith("error")]
    ok = bool(checks) and not {"failed", "error"} & counts.keys() and "problems" not in environment
    return {
        "environment": environment,
        "summary": {
            "passed": ok and not timing_errors,
            "checks": counts,
            "timing_errors": timing_errors,
        },
        "checks": checks,
        "timings": timings,
    }


def _num(value: Any, digits: int = 2) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}e}" if value and abs(value) < 1e-2 else f"{value:.{digits + 1}g}"
    return "" if value is None else str(value)


def verdict(report: dict[str, Any]) -> str:
    """PASS or FAIL, with the checks' counts: "FAIL (2 failed, 9 passed)"."""
    summary = report["summary"]
    counts = ", ".join(f"{n} {result}" for result, n in sorted(summary["checks"].items()))
    return f"{'PASS' if summary['passed'] else 'FAIL'} ({counts or 'no checks ran'})"


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        f"## GPU check, {env['date']}",
        "",
        f"- Device: {env['device_name']} (`--device {env['device']}`)",
        f"- torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, Python {env['python']}",
        f"- Packages: {env['packages']}",
        "- Plugins: "
        + (
            "run with DT_PLUGINS_ALLOW_UNTESTED_TORCH=1 (this torch is outside the window)"
            if env.get("override")
            else "active as installed"
        ),
        f"- Simulated ranks: {env['world']} (torch's LocalTensorMode, one process)",
        f"- Result: **{verdict(report)}**",
    ]
    lines += [f"- Problem: {p}" for p in env.get("problems", [])]
    lines += [
        "",
        "### Checks: sharded on simulated ranks vs one process on the same device",
        "",
        "Max error: max |sharded - unsharded| over the output and every gradient on every "
        "rank; relative: divided by max(1, max |unsharded|), which must stay within the "
        "tolerance. Kernel's own: the unsharded half-precision kernel's relative error "
        "against float64 (the tolerance is at least 3 x that).",
        "",
        "| check | result | kernel | max error | relative | kernel's own | tolerance |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["checks"]:
        result = row["result"] + (
            f": {row['message']}" if row["result"] in ("failed", "error") else ""
        )
        lines.append(
            f"| {row['name']} | {result.replace('|', '/')} | {row.get('kernel', '')} | "
            f"{_num(row.get('max_error'))} | {_num(row.get('max_relative_error'))} | "
            f"{_num(row.get('kernel_error'))} | {_num(row.get('tolerance'))} |"
        )
    first = next((t for t in report["timings"] if "reps" in t), {})
    lines += [
        "",
        f"### Timings: forward + backward, median of {first.get('reps', '?')} runs after "
        f"{first.get('warmup', '?')} warm-up, device synchronized around each",
        "",
        "Ratio = sharded (every simulated rank's share in turn, through DTensor and the "
        "plugins) / unsharded: the cost of the sharded path on one device, not a speed-up.",
        "",
        "| workload | unsharded ms | sharded ms | ratio |",
        "|---|---|---|---|",
    ]
    for t in report["timings"]:
        if t["status"] == "ok":
            times = f"{t['unsharded_ms']:.3f} | {t['sharded_ms']:.3f} | {t['ratio']:.1f}"
            lines.append(f"| {t['name']} | {times} |")
        else:
            lines.append(f"| {t['name']} | {t['status'].replace('|', '/')} | | |")
    return "\n".join(lines) + "\n"
