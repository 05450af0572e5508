"""torch.library registrations dt-core owns and can take out again.

Checked against torch 2.11.x to 2.15.x (`CHECKED_WITH_TORCH`).
"""

from __future__ import annotations

from typing import Any

from . import ensure_supported_torch

CHECKED_WITH_TORCH = ">=2.11.0,<2.16"


def new_library(namespace: str, kind: str) -> Any:
    import torch

    return torch.library.Library(namespace, kind)


def destroy_library(lib: Any) -> None:
    """Remove every registration made through `lib` (torch has no public call for this)."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    lib._destroy()


def check_defining_module(module_name: str) -> None:
    """A namespace's ops defined by a torch module's import (torch defines some, e.g.
    `symm_mem::*`, in Python): only torch's own modules qualify."""
    if not module_name.startswith("torch."):
        raise ValueError(f"{module_name!r} is not a torch module")
    ensure_supported_torch(CHECKED_WITH_TORCH)


def registrations(dispatch_key: str) -> frozenset[str]:
    """Names of every op with a kernel registered for `dispatch_key` (for state snapshots)."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch

    return frozenset(torch._C._dispatch_get_registrations_for_dispatch_key(dispatch_key))


def defined_ops() -> frozenset[str]:
    """Names of every op the dispatcher has a schema for (for state snapshots)."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch

    return frozenset(torch._C._dispatch_get_all_op_names())
