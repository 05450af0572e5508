"""Benchmark: what dt-core's autoload adds to `import torch`.

Target (issue: dt-core): at most ~5% over `import torch` without dt-core, measured in
the same run. The baseline disables torch's backend autoload altogether
(TORCH_DEVICE_BACKEND_AUTOLOAD=0: dt-core is not even imported), which is what
`import torch` costs without dt-core installed. Fresh interpreters take turns between
the settings, so drift on the machine hits all of them alike; medians are reported.

    hatch run bench:import-time [--runs 21]
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args()
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
    print(f"runs: {args.runs} each, taking turns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
