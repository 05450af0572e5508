"""Run a Python script in a fresh interpreter, for what only a new process shows: import
side effects, autoload, activation from a clean torch, caches across processes."""

from __future__ import annotations

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
