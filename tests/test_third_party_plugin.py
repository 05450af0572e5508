"""A plugin from outside this repository works: the example in docs/examples/ installs as
its own distribution (its entry point in `dt.plugins`), dt-core finds it on `import
torch`, and its tests pass with dt-core's pytest plugin. docs/plugin-authors.md walks
through it, so this keeps that page true.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# what this module checks does not differ between torch releases (.ci/run: one axis only)
pytestmark = pytest.mark.ci_once

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "docs" / "examples" / "third_party_plugin"


def test_example_plugin_installs_and_its_tests_pass(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)]
        + [str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-4000:]
    assert (site / "dt_soft_clip" / "plugin.py").exists()

    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    )
    # Its own tests against the installed copy (its src/ is never on the path).
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0"]
        + [str(EXAMPLE / "tests")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert re.search(r"\b5 passed\b", run.stdout), run.stdout[-2000:]
