"""The README's "Install from a checkout" block, run as users run it: every line of the
```bash block after `<!-- install-from-checkout -->`, from the repository root, in a fresh
virtual environment. PIP_CONSTRAINT is tools/constraints.txt (the torch the tests pin), so
no other torch can come in; the packages the command names must then import from the
environment and their plugins be active."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from fresh_venv import fresh_venv, in_shell

# what this checks does not differ between torch releases: the environment is its own
pytestmark = pytest.mark.ci_once

ROOT = Path(__file__).resolve().parent.parent
MARKER = "<!-- install-from-checkout -->"
BLOCK = re.compile(re.escape(MARKER) + r"\n```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)
# pip builds each local package and installs torch 2.13.0 (CPU) from local files: about a
# minute on 2 cores; the bound is for a loaded machine
INSTALL_TIMEOUT = 900


def readme_block() -> list[str]:
    """The commands of the README's block, one per line, as written."""
    found = BLOCK.findall((ROOT / "README.md").read_text())
    assert len(found) == 1, f"README.md: one ```bash block right after {MARKER}"
    return [line for line in found[0].splitlines() if line.strip()]


def named_packages(commands: list[str]) -> list[str]:
    """The folders under packages/ that the block's `pip install` names."""
    names = []
    for command in commands:
        words = shlex.split(command, comments=True)
        if words[:2] == ["pip", "install"]:
            names += [Path(w).name for w in words[2:] if Path(w).parent.name == "packages"]
    return names


def test_the_block_installs_dt_core_with_the_plugins_and_names_torch() -> None:
    commands = readme_block()
    names = named_packages(commands)
    assert "dt-core" in names and len(names) > 1, commands
    assert all((ROOT / "packages" / name / "pyproject.toml").exists() for name in names)
    assert any(re.search(r"\btorch==\d", command) for command in commands), commands


def test_the_readme_install_from_checkout_works_in_a_fresh_environment(tmp_path: Path) -> None:
    commands = readme_block()
    names = named_packages(commands)
    env_dir = tmp_path / "venv"
    env = fresh_venv(env_dir)
    bin_dir = env_dir / "bin"
    for command in commands:  # what a user types, through the shell
        done = in_shell(command, ROOT, env, INSTALL_TIMEOUT)
        assert done.returncode == 0, f"$ {command}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"

    def run(*args: str) -> str:
        done = subprocess.run(
            args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"{args}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        return done.stdout

    python = str(bin_dir / "python")
    modules = [name.replace("-", "_") for name in names]
    probe = (
        "import json, sys, torch\n"
        f"import {', '.join(modules)}\n"
        f"print(json.dumps({{'prefix': sys.prefix, 'torch': torch.__version__, "
        f"'files': {{m: sys.modules[m].__file__ for m in {modules!r}}}}}))"
    )
    seen = json.loads(run(python, "-c", probe))
    assert Path(seen["prefix"]).resolve() == env_dir.resolve()
    assert seen["torch"].split("+")[0] == "2.13.0", seen  # the pin, nothing newer pulled
    for module, file in seen["files"].items():
        assert Path(file).resolve().is_relative_to(env_dir.resolve()), (module, file)
    installed = {line.split("==")[0].lower() for line in run(python, "-m", "pip", "freeze").split()}
    assert not {name for name in installed if name.startswith("nvidia")}, installed

    # every package named has its plugin active (dt-core's own is torch-gaps)
    plugins = json.loads(run(str(bin_dir / "dt-plugins"), "list", "--json"))
    states = {p["distribution"]: p["state"] for p in plugins}
    assert {name: states.get(name) for name in names} == dict.fromkeys(names, "active"), plugins
