"""A fresh virtual environment for the tests that install as users do (the README's
install block, the plugin-author page): pip pinned to the torch the tests pin, and
nothing of the test run's own environment leaking into the commands run there."""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "tools" / "constraints.txt"
# variables of this interpreter, this test run and its torch that must not reach the
# fresh environment's commands
NOT_INHERITED = ("PYTHON", "VIRTUAL_ENV", "DT_", "PYTEST", "TORCH_", "TORCHINDUCTOR_")


def fresh_venv(env_dir: Path) -> dict[str, str]:
    """Create a virtual environment with pip at `env_dir`; return the environment of a
    shell with it activated, PIP_CONSTRAINT set to tools/constraints.txt (so pip keeps to
    the torch the tests pin) and pip never prompting."""
    venv.EnvBuilder(with_pip=True).create(env_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(NOT_INHERITED)}
    env.update(
        PATH=f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(env_dir),
        PIP_CONSTRAINT=str(CONSTRAINTS),
        PIP_NO_INPUT="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        # no bytecode for every file of torch and its dependencies at install (about 25 s
        # of CPU for torch 2.13.0): Python compiles what a command imports when it imports
        # it. pip stores this variable's value in its `compile` option, so "off" is what
        # turns compiling off ("1" would turn it on).
        PIP_NO_COMPILE="off",
    )
    return env


def in_shell(
    script: str, cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """`script` run by bash in `cwd` with `env` (`fresh_venv`'s), as a user types it into a
    terminal; its output captured."""
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
