"""The user guides' examples (docs/examples/models/) run as users run them: torchrun on
2 CPU ranks, a small size; each step prints a finite loss and the model's output keeps
the input's row shard."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "models"
STEP = re.compile(r"step (\d+): loss (\S+), \w+ \((.*)\)")


@pytest.mark.parametrize(("script", "size"), [("unet3d.py", 16), ("diffusion_unet.py", 32)])
def test_guide_example_trains_sharded_under_torchrun(script: str, size: int) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", str(EXAMPLES / script), "--size", str(size)]
    command += ["--steps", "2"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = [STEP.match(line) for line in result.stdout.splitlines()]
    found = [m.groups() for m in steps if m]
    assert [s for s, _, _ in found] == ["0", "1"], result.stdout
    for _, loss, placements in found:
        assert math.isfinite(float(loss)), result.stdout
        assert placements.rstrip(",") == "Shard(dim=2)", result.stdout
