"""The one place dt-core touches private torch APIs.

Everything under `torch.distributed.tensor._*` and `torch._inductor.*` that dt-core or a
plugin's installation needs goes through the small interface below, so a torch upgrade
means reviewing this module only. `ensure_supported_torch()` checks the torch version
range this module was tested with; activation calls it before touching anything.

Interface:
    TESTED_TORCH_RANGE, torch_version_problem(), ensure_supported_torch()
    swap_op_handler(op, handler) -> previous          (DTensor custom op handlers)
    swap_sharding_strategy(strategy) -> previous      (DTensor sharding propagator)
    restore_sharding_strategy(op, kind, previous)
    clear_sharding_caches()
    swap_hop_rule(hop, subclass, fn) -> previous      (higher-order-operator subclass rules)
    new_library(namespace, kind) / destroy_library(lib)
    make_graph_pass(name, fn, uuid) -> CustomGraphPass
    install_graph_passes(stage, passes) / uninstall_graph_passes(stage)
    installed_graph_passes(stage) -> tuple

Plugins that need a private torch API get a small area module next to this one
(`dt_core.compat.<area>`, e.g. `symm_mem`, `attention`, `fsdp`), one area per module, each
exposing plain functions and calling `ensure_supported_torch()` before its first private
access. No plugin imports `torch.distributed.tensor._*`, `torch._inductor.*` or other
private torch modules itself.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..contributions import PassStage, ShardingStrategy
from ..errors import UnsupportedTorchError

# [low, high): the torch releases this module was written and tested against.
TESTED_TORCH_RANGE = ("2.13.0", "2.14.0")
ALLOW_UNTESTED_ENV = "DT_PLUGINS_ALLOW_UNTESTED_TORCH"

# Marks "there was nothing here" in saved state, distinct from a stored None.
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING"})()

_lock = threading.RLock()


@functools.cache  # every private-API call checks the version: keep that check ~1 us
def _release_tuple(version: str) -> tuple[int, ...]:
    core = version.split("+")[0]
    parts: list[int] = []
    for piece in core.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def torch_version_problem(version: str | None = None) -> str | None:
    """Why this torch is unsupported, or None when it is inside the tested range."""
    if version is None:
        import torch

        version = torch.__version__
    low, high = TESTED_TORCH_RANGE
    if _release_tuple(low) <= _release_tuple(version) < _release_tuple(high):
        return None
    return (
        f"torch {version} is outside the range dt-core's compat layer was tested with "
        f"(>={low},<{high}); set {ALLOW_UNTESTED_ENV}=1 to try anyway"
    )


def ensure_supported_torch() -> None:
    """Raise UnsupportedTorchError unless torch is in range (or the override is set)."""
    problem = torch_version_problem()
    if problem and os.environ.get(ALLOW_UNTESTED_ENV, "0") != "1":
        raise UnsupportedTorchError(problem)


# --- DTensor --------------------------------------------------------------------------


def _dispatcher() -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor._op_dispatcher


def op_handler_table() -> dict[Any, Callable[..., object]]:
    """DTensor's live table of ops whose whole dispatch a handler owns (read-only use)."""
    return _dispatcher()._custom_op_handlers


def swap_op_handler(op: Any, handler: Callable[..., object] | Any) -> Any:
    """Put `handler` (or MISSING: remove) in DTensor's handler table; return what was there."""
    with _lock:
        table = _dispatcher()._custom_op_handlers
        previous = table.get(op, MISSING)
        if handler is MISSING:
            table.pop(op, None)
        else:
            table[op] = handler
        return previous


def _strategy_tables(kind: str) -> tuple[dict[Any, Any], dict[Any, Any]]:
    propagator = _dispatcher().sharding_propagator
    funcs = propagator.op_strategy_funcs if kind == "strategy" else propagator.op_to_rules
    return funcs, propagator.op_to_schema_info


def swap_sharding_strategy(strategy: ShardingStrategy) -> tuple[Any, Any]:
    """Register a strategy/rule; return (previous func, previous schema info) to restore."""
    with _lock:
        funcs, schema_infos = _strategy_tables(strategy.kind)
        previous = (funcs.get(strategy.op, MISSING), schema_infos.get(strategy.op, MISSING))
        funcs[strategy.op] = strategy.func
        if strategy.schema_info is not None:
            schema_infos[strategy.op] = strategy.schema_info
        return previous


def restore_sharding_strategy(op: Any, kind: str, previous: tuple[Any, Any]) -> None:
    """Undo `swap_sharding_strategy` with the value it returned."""
    with _lock:
        funcs, schema_infos = _strategy_tables(kind)
        for table, value in zip((funcs, schema_infos), previous, strict=True):
            if value is MISSING:
                table.pop(op, None)
            else:
                table[op] = value


def clear_sharding_caches() -> None:
    """Forget cached sharding decisions (Python LRU and the C++ fast path)."""
    import torch

    _dispatcher().sharding_propagator.propagate_op_sharding.cache_clear()
    torch._C._clear_DTensor_sharding_propagator_cache()


# --- higher-order operators -----------------------------------------------------------


def swap_hop_rule(hop: Any, subclass: type | None, fn: Callable[..., object] | Any) -> Any:
    """Make `hop` call `fn` for `subclass` (None: DTensor), or with MISSING remove the rule.

    Returns what was registered before (MISSING if nothing), so the same call with that
    value undoes it. `hop.py_impl(subclass)` registers but refuses to replace and has no
    removal, hence the direct table access.
    """
    if subclass is None:
        from torch.distributed.tensor import DTensor

        subclass = DTensor
    with _lock:
        table = hop.python_key_table
        previous = table.get(subclass, MISSING)
        if fn is MISSING:
            table.pop(subclass, None)
        else:
            table[subclass] = fn
        hop._dispatch_cache.clear()
        return previous


# --- torch.library ----------------------------------------------------------------------


def new_library(namespace: str, kind: str) -> Any:
    import torch

    return torch.library.Library(namespace, kind)


def destroy_library(lib: Any) -> None:
    """Remove every registration made through `lib` (torch has no public call for this)."""
    lib._destroy()


# --- Inductor ---------------------------------------------------------------------------

_STAGE_TO_CONFIG: dict[str, str] = {
    "post_grad_pre": "post_grad_custom_pre_pass",
    "post_grad_post": "post_grad_custom_post_pass",
}
_managed: dict[str, tuple[Any, ...]] = {}  # config name -> dt-core's installed passes
_user_value_before: dict[str, Any] = {}  # config name -> value the user had at install
_pass_class: type | None = None
_guard_class: type | None = None
_unguarded_class: type | None = None


def make_graph_pass(name: str, fn: Callable[[Any], None], uuid: Callable[[], str]) -> Any:
    """Wrap `fn` in Inductor's CustomGraphPass so the FX graph cache keys on `uuid()`."""
    global _pass_class
    if _pass_class is None:
        from torch._inductor.custom_graph_pass import CustomGraphPass

        class DtGraphPass(CustomGraphPass):
            """A plugin's pass as Inductor sees it: callable plus a cache identity."""

            def __init__(self, name: str, fn: Callable[[Any], None], uuid: Callable[[], str]):
                self.name = name
                self.fn = fn
                self._uuid = uuid

            def __call__(self, graph: Any) -> None:
                self.fn(graph)

            def uuid(self) -> str:
                return self._uuid()

            def __repr__(self) -> str:
                return f"<dt pass {self.name}>"

        _pass_class = DtGraphPass
    return _pass_class(name, fn, uuid)


def _inductor_config() -> Any:
    import torch._inductor.config as config

    return config


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _merged(user_value: Any, managed: Sequence[Any]) -> Any:
    """The user's passes first, as they set them, then dt-core's."""
    if not managed:
        return user_value
    return [p for p in _as_list(user_value) if p not in managed] + list(managed)


def _ensure_guard(config: Any) -> None:
    """Make later user assignments to the pass lists keep dt-core's passes appended.

    `torch._inductor.config.post_grad_custom_post_pass = my_pass` is the usual way to
    add a pass; without this guard it would silently drop every plugin's passes.
    """
    global _guard_class, _unguarded_class
    if _guard_class is not None and isinstance(config, _guard_class):
        return
    base = type(config)

    class PassListGuard(base):  # type: ignore[misc, valid-type]
        def __setattr__(self, name: str, value: object) -> None:
            super().__setattr__(name, _merged(value, _managed.get(name, ())))

    _unguarded_class, _guard_class = base, PassListGuard
    object.__setattr__(config, "__class__", PassListGuard)


def _user_passes(config: Any, name: str) -> list[Any]:
    managed = _managed.get(name, ())
    return [p for p in _as_list(getattr(config, name)) if p not in managed]


def install_graph_passes(stage: PassStage, passes: Sequence[Any]) -> None:
    """Run `passes` (made by make_graph_pass) after the user's passes for `stage`."""
    with _lock:
        config = _inductor_config()
        name = _STAGE_TO_CONFIG[stage]
        _ensure_guard(config)
        if name not in _managed:
            _user_value_before[name] = getattr(config, name)
        user = _user_passes(config, name)
        _managed[name] = tuple(passes)
        setattr(config, name, user)


def uninstall_graph_passes(stage: PassStage) -> None:
    """Remove dt-core's passes for `stage`; the user's passes stay as they are."""
    with _lock:
        config = _inductor_config()
        name = _STAGE_TO_CONFIG[stage]
        if name not in _managed:
            return
        user = _user_passes(config, name)
        del _managed[name]
        before = _user_value_before.pop(name, None)
        # Unchanged since activation: give back the user's very object (None, a pass, a list).
        setattr(config, name, before if _as_list(before) == user else (user or None))
        if not _managed and isinstance(config, _guard_class):  # type: ignore[arg-type]
            object.__setattr__(config, "__class__", _unguarded_class)


def installed_graph_passes(stage: PassStage) -> tuple[Any, ...]:
    """What Inductor will run for `stage`, in order (user passes and dt-core's)."""
    config = _inductor_config()
    return tuple(_as_list(getattr(config, _STAGE_TO_CONFIG[stage])))


# --- sharding helpers for plugins -------------------------------------------------------


def placement_strategy(op: Any, func: Callable[..., Any]) -> tuple[Callable[..., Any], Any]:
    """Turn a placements-style sharding function into (strategy func, schema info).

    `func` takes the op's arguments (tensors replaced by their DTensorSpec) and returns
    acceptable `(output placements, input placements)` pairs for one mesh dim, as torch's
    public `register_sharding` expects; this expands them over the whole mesh.
    """
    import torch
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

    # Non-tensor int arguments change the decision, so they belong in the cache key.
    int_args = [
        i
        for i, arg in enumerate(op._schema.arguments)
        if isinstance(arg.type, (torch.IntType, torch.FloatType, torch.BoolType))
    ]
    schema_info = RuntimeSchemaInfo(min(int_args) if int_args else 100, needs_pytree=True)
    return strategy, schema_info
