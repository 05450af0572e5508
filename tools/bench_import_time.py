"""Benchmark: what dt-core's autoload adds to `import torch`.

Target (issue: dt-core): at most ~5% over `import torch` without dt-core, measured in
the same run. The baseline disables torch's backend autoload altogether
(TORCH_DEVICE_BACKEND_AUTOLOAD=0: dt-core is not even imported), which is what
`import torch` costs without dt-core installed. Fresh interpreters take turns between
the settings, so drift on the machine hits all of them alike; medians are reported.

dt-core and the plugins are byte-compiled first, as installing their wheels does (pip
compiles at install, as it did torch's modules): the bench environment installs them
editable, and where bytecode is never written (PYTHONDONTWRITEBYTECODE=1) every fresh
interpreter would compile their source again, a cost no installed user pays (about a
third of dt-core's share). `--no-compile` leaves the bytecode as it is.

    hatch run bench:import-time [--runs 21] [--no-compile]
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys

PROBE = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"


SETTINGS = {
    "without dt-core (baseline)": {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    "dt-core, DT_PLUGINS_AUTOLOAD=0": {"DT_PLUGINS_AUTOLOAD": "0"},
    "dt-core autoload (default)": {"DT_PLUGINS_AUTOLOAD": "1"},
}


def byte_compile_plugins() -> list[str]:
    """Compile dt-core's and every installed plugin's package to bytecode, as a wheel
    install does; returns the packages compiled."""
    from importlib.metadata import entry_points

    tops = {"dt_core"} | {ep.module.split(".")[0] for ep in entry_points(group="dt.plugins")}
    compiled = []
    for top in sorted(tops):
        spec = importlib.util.find_spec(top)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(folder, quiet=1)
            compiled.append(top)
    return compiled


def time_import(extra_env: dict[str, str]) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DT_PLUGINS", "TORCH_DEV"))}
    env.update(extra_env)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--json", help="also write the report tool's JSON here ('-': stdout)")
    parser.add_argument(
        "--no-compile", action="store_true", help="do not byte-compile dt-core and the plugins"
    )
    args = parser.parse_args()
    bytecode = "as found" if args.no_compile else "compiled first, as a wheel install does"
    if not args.no_compile:
        byte_compile_plugins()
    samples: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for env in SETTINGS.values():
        time_import(env)  # warm the file cache for every side
    for _ in range(args.runs):
        for name, env in SETTINGS.items():
            samples[name].append(time_import(env))
    import dt_core
    import torch

    plugins = [p.name for p in dt_core.plugins()]
    medians = {name: statistics.median(values) for name, values in samples.items()}
    baseline = medians["without dt-core (baseline)"]
    machine = f"{platform.machine()}, {os.cpu_count()} cores"
    print(f"machine: {machine}, Python {platform.python_version()}, torch {torch.__version__}")
    print(f"plugins installed: {', '.join(plugins) or 'none'}")
    print("| import torch | median s | ratio |")
    print("|---|---|---|")
    for name, median in medians.items():
        print(f"| {name} | {median:.3f} | {median / baseline:.3f} |")
    print(f"runs: {args.runs} each, taking turns; dt-core and plugin bytecode: {bytecode}")
    if args.json:
        write_json(args.json, medians, baseline, args.runs, plugins, bytecode)
    return 0


def write_json(
    where: str,
    medians: dict[str, float],
    baseline: float,
    runs: int,
    plugins: list[str],
    bytecode: str,
) -> None:
    """The rows tools/bench_report.py renders (one JSON line when written to stdout)."""
    rows = [
        {
            "name": f"import torch, {name}",
            "metric": "median seconds",
            "value": median,
            "baseline": "without dt-core",
            "baseline_value": baseline,
            "ratio": median / baseline,
            "target": "<= 1.05" if "autoload (default)" in name else "",
            "unit": "s",
            "notes": f"{runs} fresh interpreters each, taking turns; plugins: "
            + (", ".join(plugins) or "none")
            + f"; their bytecode {bytecode}",
        }
        for name, median in medians.items()
        if name != "without dt-core (baseline)"
    ]
    text = json.dumps({"package": "dt-core", "rows": rows, "series": []})
    if where == "-":
        print(text)
    else:
        with open(where, "w") as f:
            f.write(text)


if __name__ == "__main__":
    sys.exit(main())
