"""With every plugin installed, `import torch` stays light: autoload may define library ops
but must not pull in the heavy parts (DTensor, Dynamo, Inductor), which arm lazily.

Counts modules rather than timing (timings live in BENCHMARKS.md); a plugin package whose
`__init__` imports compile machinery once doubled `import torch`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

HEAVY = ("torch._dynamo", "torch._inductor", "torch.distributed.tensor")
PROBE = "import sys, json, torch; print(json.dumps(sorted(sys.modules)))"


def imported(autoload: str) -> set[str]:
    env = dict(os.environ, DT_PLUGINS_AUTOLOAD=autoload)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_autoload_imports_no_heavy_torch_module() -> None:
    with_plugins, without = imported("1"), imported("0")
    assert "dt_core" in with_plugins  # autoload did run
    heavy = sorted(m for m in with_plugins - without if m.startswith(HEAVY))
    assert not heavy, heavy
    extra_torch = sorted(m for m in with_plugins - without if m.startswith("torch"))
    assert len(extra_torch) <= 5, extra_torch
