"""The plugin module the `dt.plugins` entry point names: hook implementations only.

It stays light at import (dt-core loads it while `import torch` runs): torch pieces load
inside the hooks and the functions they return.
"""

from __future__ import annotations

from typing import Any

from dt_core import LibraryOps, ShardingStrategy, hookimpl

DT_API = ">=1.0,<2"  # the dt-core hook API this plugin is written for


def _define(lib: Any) -> None:
    """Define the op, its CPU kernel and its fake kernel (for torch.compile)."""
    import torch

    lib.define("soft_clip(Tensor x, float limit) -> Tensor")

    def soft_clip(x: torch.Tensor, limit: float) -> torch.Tensor:
        return limit * torch.tanh(x / limit)

    def soft_clip_fake(x: torch.Tensor, limit: float) -> torch.Tensor:
        return torch.empty_like(x)

    lib.impl("soft_clip", soft_clip, "CPU")
    torch.library.register_fake("dt_soft_clip::soft_clip", soft_clip_fake, lib=lib)


@hookimpl
def dt_library_ops() -> list[LibraryOps]:
    return [LibraryOps("dt_soft_clip", _define, ops=["dt_soft_clip::soft_clip"], kind="DEF")]


def _placements(x: Any, limit: float) -> list[tuple[list[Any], list[Any]]]:
    """The op's sharding options on one mesh dim: (output placements, input placements).

    Called with the op's arguments: `x` as its DTensorSpec (`x.ndim`, `x.placements`),
    `limit` as the float. An elementwise op keeps any Shard or Replicate. Not Partial:
    soft_clip of a pending sum is not the sum of soft_clips, so no option takes a Partial
    input, and DTensor reduces one before the call.
    """
    from torch.distributed.tensor import Replicate, Shard

    # each option: ([the output], [x, limit]); None for limit, which is no tensor
    options: list[tuple[list[Any], list[Any]]] = [([Replicate()], [Replicate(), None])]
    options += [([Shard(d)], [Shard(d), None]) for d in range(x.ndim)]
    return options


@hookimpl
def dt_sharding_strategies() -> list[ShardingStrategy]:
    import torch

    op = torch.ops.dt_soft_clip.soft_clip.default
    return [ShardingStrategy(op, _placements, kind="placements")]
