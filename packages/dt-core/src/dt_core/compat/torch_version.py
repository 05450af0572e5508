"""The shared torch version check every compat area module calls before private access."""

from __future__ import annotations

import os

from ..errors import UnsupportedTorchError
from ..versions import in_range

# [low, high): the torch releases the compat layer as a whole was written and tested against.
TESTED_TORCH_RANGE = ("2.13.0", "2.14.0")
ALLOW_UNTESTED_ENV = "DT_PLUGINS_ALLOW_UNTESTED_TORCH"
_TESTED_SPEC = f">={TESTED_TORCH_RANGE[0]},<{TESTED_TORCH_RANGE[1]}"


def torch_version() -> str:
    import torch

    return torch.__version__


def torch_version_problem(version: str | None = None, checked: str = _TESTED_SPEC) -> str | None:
    """Why this torch is unsupported (outside `checked`), or None when it is inside."""
    version = torch_version() if version is None else version
    if in_range(version, checked):
        return None
    return (
        f"torch {version} is outside the range dt-core's compat layer was tested with "
        f"({checked}); set {ALLOW_UNTESTED_ENV}=1 to try anyway"
    )


def untested_torch_allowed() -> bool:
    return os.environ.get(ALLOW_UNTESTED_ENV, "0") == "1"


def ensure_supported_torch(checked: str = _TESTED_SPEC) -> None:
    """Raise UnsupportedTorchError unless torch is in `checked` (or the override is set)."""
    problem = torch_version_problem(checked=checked)
    if problem and not untested_torch_allowed():
        raise UnsupportedTorchError(problem)
