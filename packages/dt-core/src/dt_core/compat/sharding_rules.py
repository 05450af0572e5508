"""DTensor's sharding propagator: registering strategies and rules, and putting back
what was registered before; placements-style functions expanded over the mesh.

Checked against torch 2.11.x to 2.15.x (`CHECKED_WITH_TORCH`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..contributions import ShardingStrategy
from . import MISSING, ensure_supported_torch
from .dispatch import op_dispatcher

CHECKED_WITH_TORCH = ">=2.11.0,<2.16"
_lock = threading.RLock()


def strategy_tables(kind: str) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """(funcs, schema infos) tables of the propagator for kind "strategy" or "rule"."""
    propagator = op_dispatcher().sharding_propagator
    funcs = propagator.op_strategy_funcs if kind == "strategy" else propagator.op_to_rules
    return funcs, propagator.op_to_schema_info


def _shadowing_tables() -> list[dict[Any, Any]]:
    """Tables whose entry for an op wins over `op_strategy_funcs` and `op_to_rules`.

    torch registers more ops with each release (mm among them) as single-dim strategies,
    looked up before the full strategies: a strategy registered in `op_strategy_funcs`
    alone would be ignored while one of these stays. Found by attribute (feature
    detection), so a release without these tables needs no branch on its version.
    """
    propagator = op_dispatcher().sharding_propagator
    names = ("op_single_dim_strategy_funcs", "op_to_schema_info_for_single_dim_strategy")
    return [getattr(propagator, name) for name in names if hasattr(propagator, name)]


def swap_sharding_strategy(strategy: ShardingStrategy) -> tuple[Any, ...]:
    """Register a strategy/rule; return what it replaced (funcs, schema info, then each
    shadowing table's entry, which is taken out meanwhile) for `restore_sharding_strategy`."""
    with _lock:
        funcs, schema_infos = strategy_tables(strategy.kind)
        shadowing = _shadowing_tables()
        tables = (funcs, schema_infos, *shadowing)
        previous = tuple(table.get(strategy.op, MISSING) for table in tables)
        funcs[strategy.op] = strategy.func
        if strategy.schema_info is not None:
            schema_infos[strategy.op] = strategy.schema_info
        for table in shadowing:
            table.pop(strategy.op, None)
        return previous


def restore_sharding_strategy(op: Any, kind: str, previous: tuple[Any, ...]) -> None:
    """Undo `swap_sharding_strategy` with the value it returned."""
    with _lock:
        tables = (*strategy_tables(kind), *_shadowing_tables())
        for table, value in zip(tables, previous, strict=True):
            if value is MISSING:
                table.pop(op, None)
            else:
                table[op] = value


def placement_strategy(op: Any, func: Callable[..., Any]) -> tuple[Callable[..., Any], Any]:
    """Turn a placements-style sharding function into (strategy func, schema info).

    `func` takes the op's arguments (tensors replaced by their DTensorSpec) and returns
    acceptable `(output placements, input placements)` pairs for one mesh dim, as torch's
    public `register_sharding` expects; this expands them over the whole mesh.
    """
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch.distributed.tensor._op_schema import OpStrategy, RuntimeSchemaInfo, TupleStrategy
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    def as_spec(arg: object) -> object:
        if isinstance(arg, OpStrategy):
            return arg.strategies[0].output_spec
        if isinstance(arg, TupleStrategy):
            return tuple(as_spec(child) for child in arg.children)
        return arg

    def strategy(op_schema: Any) -> Any:
        args = tuple(as_spec(a) for a in op_schema.args_schema)
        kwargs = {k: as_spec(v) for k, v in op_schema.kwargs_schema.items()}
        per_dim = [list(out) + list(inp) for out, inp in func(*args, **kwargs)]
        return expand_to_full_mesh_op_strategy(
            op_schema.get_mesh_from_args(),
            op_schema,
            per_dim,
            input_index=len(op._schema.returns),
            inplace_op=op_schema.is_inplace_op(),
        )

    # Every argument from the first non-tensor one on (sizes, scales, pads: lists and
    # optionals too) belongs in DTensor's cache key: they decide the output's shape, and
    # a key without them hands a second call the first call's shape.
    static_argnum = next(
        (i for i, arg in enumerate(op._schema.arguments) if not _is_tensor_type(arg.type)),
        len(op._schema.arguments),
    )
    return strategy, RuntimeSchemaInfo(static_argnum, needs_pytree=True)


def _is_tensor_type(kind: Any) -> bool:
    import torch

    if isinstance(kind, torch.OptionalType):
        kind = kind.getElementType()
    return isinstance(kind, torch.TensorType)


# In-place identities that newer torch releases give a strategy and older ones lack
# (aten.detach_: registered from 2.13 on, with the one-input strategy of detach).
_IDENTITY_OPS = ("detach_",)


def has_sharding_entry(op: Any) -> bool:
    """Whether this torch's sharding propagator knows `op` in any of its tables."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    known = [strategy_tables("strategy")[0], strategy_tables("rule")[0], *_shadowing_tables()]
    return any(op in table for table in known)


def missing_identity_strategies() -> list[ShardingStrategy]:
    """torch's one-input strategy for each in-place identity op this torch's propagator
    has no entry for (none on a torch that has them all)."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch

    ops = [getattr(torch.ops.aten, name).default for name in _IDENTITY_OPS]
    missing = [op for op in ops if not has_sharding_entry(op)]
    if not missing:
        return []  # newer torch (whose strategy function has another name by then)
    from torch.distributed.tensor._ops._tensor_ops import propagate_single_input_strategy

    return [ShardingStrategy(op, propagate_single_input_strategy) for op in missing]


def lacks_cache_key(op: Any) -> bool:
    """Whether torch registers a full strategy for `op` with no runtime schema info, so
    DTensor's cache key leaves out its non-tensor arguments: torch 2.11's
    `constant_pad_nd`, whose second call with another pad reuses the first call's
    output shape."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    funcs, schema_infos = strategy_tables("strategy")
    return op in funcs and schema_infos.get(op) is None
