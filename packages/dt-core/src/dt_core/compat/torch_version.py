"""The shared torch version and feature checks every compat module calls (dt-core's own
and each plugin's) before private access.

Two questions, asked the same way everywhere:
  - `ensure_supported_torch(checked)`: is this torch inside the releases a compat module
    was checked with (or did the user set the override)?
  - `torch_has(module, "attr.sub")`: does this torch have a private name, so a compat
    module can branch on what torch *has* rather than on version numbers.
"""

from __future__ import annotations

import importlib
import os

from ..errors import UnsupportedTorchError
from ..versions import in_range

# [low, high): the torch releases dt-core and the plugins were written and tested against
# (2.11.x to 2.15.x). Package metadata asks only for the lower bound, so installing a
# plugin never replaces the user's torch; this range is what guards an untested release.
TESTED_TORCH_RANGE = ("2.11.0", "2.16.0")
ALLOW_UNTESTED_ENV = "DT_PLUGINS_ALLOW_UNTESTED_TORCH"
TESTED_TORCH_SPEC = f">={TESTED_TORCH_RANGE[0]},<{TESTED_TORCH_RANGE[1]}"


def torch_version() -> str:
    import torch

    return torch.__version__


def torch_version_problem(
    version: str | None = None, checked: str = TESTED_TORCH_SPEC
) -> str | None:
    """Why this torch is unsupported (outside `checked`), or None when it is inside."""
    version = torch_version() if version is None else version
    if in_range(version, checked):
        return None
    return (
        f"torch {version} is outside the releases the DTensor plugins were tested with "
        f"({checked}); the plugins stay inactive and torch works as without them. "
        f"Set {ALLOW_UNTESTED_ENV}=1 to try them anyway"
    )


def untested_torch_allowed() -> bool:
    return os.environ.get(ALLOW_UNTESTED_ENV, "0") == "1"


def ensure_supported_torch(checked: str = TESTED_TORCH_SPEC) -> None:
    """Raise UnsupportedTorchError unless torch is in `checked` (or the override is set)."""
    problem = torch_version_problem(checked=checked)
    if problem and not untested_torch_allowed():
        raise UnsupportedTorchError(problem)


def torch_has(module: str, attribute: str = "") -> bool:
    """Whether torch module `module` imports and has the (dotted) `attribute`.

    Feature detection for compat modules: "does this torch check that a process group
    is registered" is `torch_has("torch._C._distributed_c10d",
    "_is_process_group_registered")`, true from 2.15 on.
    """
    try:
        found: object = importlib.import_module(module)
    except ImportError:
        return False
    for name in filter(None, attribute.split(".")):
        if not hasattr(found, name):
            return False
        found = getattr(found, name)
    return True
