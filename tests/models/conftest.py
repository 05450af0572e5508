"""Which models an axis of hatch.toml's models matrix can build.

torchvision comes from the registry as a CUDA build tied to one torch release; for some
axes there is none that imports (the CPU build of torch 2.13.0; torch 2.15.0, for which
none is published yet), and timm needs it. Those axes name what they lack in
DT_MODELS_LACKING, and the tests of the models that need it are reported as skipped with
that reason. Only what an axis declares is skipped: a library missing anywhere else fails
the tests that import it.

The diffusion UNet's attention blocks project tokens sharded along the sequence: torch's
view op then flattens (batch, tokens) with the tokens sharded, which torch 2.11 refuses
("Attempted to flatten multiple dimensions"; 2.12 on flatten them). Where torch's own
view op refuses it (asked of torch, not of its version) those tests are strict expected
failures naming it."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

# the model libraries each model kind (test_models.py's `kind` parameter) imports
NEEDS = {"resnet18": ("torchvision",), "convnext": ("timm", "torchvision")}


# the models whose forward flattens sequence-sharded tokens (test_models.py's `kind`, and
# test_guides.py's `script`)
FLATTEN_TOKENS = {"diffusers", "diffusion_unet.py"}


def torch_flattens_a_sharded_inner_dim() -> bool:
    """tests/torch_patterns.py's probe of torch's own view op (tests/ is not on this
    directory's import path)."""
    module = sys.modules.get("torch_patterns")
    if module is None:
        path = Path(__file__).resolve().parents[1] / "torch_patterns.py"
        spec = importlib.util.spec_from_file_location("torch_patterns", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["torch_patterns"] = module
        spec.loader.exec_module(module)
    return module.torch_flattens_a_sharded_inner_dim()


def mark_token_flatten_limit(items: list[pytest.Item]) -> None:
    params = [getattr(item, "callspec", None) for item in items]
    touched = [
        item
        for item, callspec in zip(items, params)
        if callspec is not None and FLATTEN_TOKENS & set(map(str, callspec.params.values()))
    ]
    if not touched or torch_flattens_a_sharded_inner_dim():
        return
    reason = (
        f"torch {torch.__version__}'s own view op refuses to flatten (batch, tokens) with the "
        "tokens sharded, which the attention blocks' projections need ('Attempted to "
        "flatten multiple dimensions'; torch 2.12 on flatten them)"
    )
    for item in touched:
        item.add_marker(pytest.mark.xfail(strict=True, reason=reason))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_token_flatten_limit(items)
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
