"""Which models an axis of hatch.toml's models matrix can build.

torchvision comes from the registry as a CUDA build tied to one torch release; for some
axes there is none that imports (the CPU build of torch 2.13.0; torch 2.15.0, for which
none is published yet), and timm needs it. Those axes name what they lack in
DT_MODELS_LACKING, and the tests of the models that need it are reported as skipped with
that reason. Only what an axis declares is skipped: a library missing anywhere else fails
the tests that import it."""

from __future__ import annotations

import os

import pytest
import torch

# the model libraries each model kind (test_models.py's `kind` parameter) imports
NEEDS = {"resnet18": ("torchvision",), "convnext": ("timm", "torchvision")}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    lacking = set(os.environ.get("DT_MODELS_LACKING", "").split())
    if not lacking:
        return
    for item in items:
        callspec = getattr(item, "callspec", None)
        kind = callspec.params.get("kind") if callspec is not None else None
        missing = [library for library in NEEDS.get(kind, ()) if library in lacking]
        if missing:
            reason = (
                f"{' and '.join(missing)}: no build that imports beside torch "
                f"{torch.__version__} (hatch.toml's models matrix declares it lacking)"
            )
            item.add_marker(pytest.mark.skip(reason=reason))
