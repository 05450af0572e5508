"""The state torch's own context-parallel APIs keep outside the DTensor spec.

torch's context parallel (`torch.distributed.tensor.experimental.context_parallel`,
`_context_parallel_shard`, `_ContextParallel`, `set_rotate_method`) permutes sequences
before sharding them and records the permutation only in module globals of
`torch.distributed.tensor.experimental._context_parallel._attention`; a `Shard(seq)`
DTensor made there looks like any other. A DTensor handler that must know which global
positions a rank holds reads that state here, and only here.

Checked against torch 2.11.x to 2.15.x (`CHECKED_WITH_TORCH`, passed to dt-core's shared
version check):
  - `_cp_options.enable_load_balance` (bool): `context_parallel()` sets it to whether it
    balanced (head-tail, only when S % (2·P) == 0) for the duration of its block and
    restores it after; `_context_parallel_shard(load_balancer=...)` sets it to whether a
    balancer was given and leaves it so; torch's own ring kernels read it as "head-tail".
  - `_cp_options.rotate_method` (`_RotateMethod.ALL_GATHER` default / `ALL_TO_ALL`).
  - `_dispatch_mode` (`MONKEY_PATCH` for `context_parallel()`, `MODULE_WRAPPER` once
    `_context_parallel_shard` ran).
  - torch's CP dispatcher is on while its `_sdpa_handler` is in DTensor's custom op table
    (`_enable_cp_dtensor_dispatcher`, inside `context_parallel()` or after
    `_enable_context_parallel_dispatcher()`).
  - `_HeadTailLoadBalancer(S, P, device)._generate_indices()` is the permutation applied
    before `Shard` (shape (1, S)); the balancers' classes live in `_load_balancer`.

Nothing here imports torch's CP module: if it was never imported, none of its state can
be in force (`torch_cp_state()` returns None).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from dt_core.compat import ensure_supported_torch

CHECKED_WITH_TORCH = ">=2.11.0,<2.16"
_ATTENTION_MODULE = "torch.distributed.tensor.experimental._context_parallel._attention"
_BALANCER_MODULE = "torch.distributed.tensor.experimental._context_parallel._load_balancer"


@dataclass(frozen=True)
class TorchCpState:
    """What torch's CP globals say right now."""

    dispatcher_enabled: bool  # torch's CP SDPA dispatch is switched on
    mode: str  # "monkey_patch" (context_parallel()) or "module_wrapper"
    load_balance: bool  # _cp_options.enable_load_balance
    rotate_method: str  # "allgather" or "alltoall"


def torch_cp_state() -> TorchCpState | None:
    """torch's CP globals, or None when torch's CP module was never imported."""
    attention = sys.modules.get(_ATTENTION_MODULE)
    if attention is None:
        return None
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch
    from torch.distributed.tensor import DTensor

    table = DTensor._op_dispatcher._custom_op_handlers
    op = torch.ops.aten._scaled_dot_product_flash_attention.default
    options = attention._cp_options
    mode = attention._dispatch_mode.name.lower()
    rotate = options.rotate_method
    return TorchCpState(
        dispatcher_enabled=table.get(op) is attention._sdpa_handler,
        mode=mode,
        load_balance=bool(options.enable_load_balance),
        rotate_method="alltoall" if rotate.name == "ALL_TO_ALL" else "allgather",
    )


def default_balancer_indices(length: int, parts: int) -> Any:
    """The permutation torch's default (head-tail) balancer applies before `Shard`.

    A 1-D int64 tensor of global positions in sharded order, or None when torch's
    default balancer cannot split `length` over `parts` ranks (S % (2·P) != 0), in which
    case `context_parallel()` does not balance.
    """
    ensure_supported_torch(CHECKED_WITH_TORCH)
    if parts < 1 or length % (2 * parts):
        return None
    import importlib

    balancers = importlib.import_module(_BALANCER_MODULE)
    indices = balancers._HeadTailLoadBalancer(length, parts, "cpu")._generate_indices()
    return indices.reshape(-1).long()


def balancer_indices(load_balancer: Any) -> Any:
    """The (B, S) permutation a torch `_LoadBalancer` applies before `Shard`."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    return load_balancer._generate_indices(restore=False)


def is_torch_load_balancer(obj: Any) -> bool:
    """Whether `obj` is one of torch's CP load balancers (`_LoadBalancer` subclass)."""
    balancers = sys.modules.get(_BALANCER_MODULE)
    return balancers is not None and isinstance(obj, balancers._LoadBalancer)


def balancer_world_size(load_balancer: Any) -> int | None:
    """The world size a torch load balancer was built for (None if it keeps none)."""
    size = getattr(load_balancer, "world_size", None)
    return int(size) if size is not None else None
