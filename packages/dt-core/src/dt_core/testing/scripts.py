"""Run a Python script in a fresh interpreter, for what only a new process shows: import
side effects, autoload, activation from a clean torch, caches across processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping


def run_python(script: str, env: Mapping[str, str] | None = None, timeout: float = 300) -> str:
    """Run `script` (dedented) with this interpreter; return its stdout.

    Raises AssertionError with the script's stderr when it exits with an error.
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=None if env is None else dict(env),
        timeout=timeout,
    )
    assert done.returncode == 0, f"script exited with {done.returncode}:\n{done.stderr[-4000:]}"
    return done.stdout


FAKE_WORLD_PRELUDE = """
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

dist.init_process_group("fake", rank=0, world_size={world_size}, store=FakeStore())
"""


def run_in_fake_world(
    script: str, world_size: int, timeout: float = 120, **env: str
) -> dict[str, list[str]]:
    """Run `script` in a fresh interpreter after `init_process_group("fake", rank=0,
    world_size=...)` (torch's fake backend is process-global, hence a process per world).
    Returns the words after the first of each stdout line, by that first word ("SHAPE 4
    8" -> {"SHAPE": ["4 8"]}); raises subprocess.TimeoutExpired if it hangs. `env`: variables
    set on top of this process's environment."""
    prelude = FAKE_WORLD_PRELUDE.format(world_size=world_size)
    full_env = {**os.environ, **env}
    out = run_python(prelude + textwrap.dedent(script), env=full_env, timeout=timeout)
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, rest = line.partition(" ")
        found.setdefault(key, []).append(rest)
    return found
