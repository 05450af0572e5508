"""The CUDA paths of every plugin: `hatch run test-gpu:run` (pytest arguments after --).

Says plainly when this machine has no CUDA device (or torch is a CPU build) and exits 0:
the CPU cells of the test matrix are the project's tests, this command is what a GPU
machine adds. With one GPU it runs tests/gpu (simulated ranks holding CUDA tensors: every
plugin's CUDA kernels); with two or more it also runs the demo on NCCL ranks (torchrun,
one rank per GPU), each stage checked against one process. On a lent GPU machine without
hatch, `bash tools/gpu_check.sh` runs the same tests plus timings and writes a report.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    import torch

    build = f"torch {torch.__version__} (CUDA build {torch.version.cuda or 'none: CPU build'})"
    if not torch.cuda.is_available():
        print(f"test-gpu: no CUDA device on this machine; {build}. Nothing was run.")
        return 0
    count = torch.cuda.device_count()
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(count))
    print(f"test-gpu: {count} CUDA device(s) ({names}); {build}", flush=True)
    env = {**os.environ, "DT_TEST_GPU": "1"}
    pytest = [sys.executable, "-m", "pytest", str(ROOT / "tests" / "gpu"), "-v", *argv]
    code = subprocess.run(pytest, env=env, cwd=ROOT).returncode
    if count >= 2:
        demo = ["torchrun", "--standalone", f"--nproc-per-node={count}", "tools/demo.py"]
        print(f"test-gpu: NCCL ranks: {' '.join(demo)} --size small", flush=True)
        code = code or subprocess.run([*demo, "--size", "small"], env=env, cwd=ROOT).returncode
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
