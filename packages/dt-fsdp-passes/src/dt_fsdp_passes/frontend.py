"""SimpleFSDP front end: parameters stored as Shard(0) DTensors, gathered on access.

Each module that owns parameters gets a subclass whose class-level properties shadow the
parameter names: reading `module.weight` all-gathers the stored Shard(0) DTensor into a
plain full tensor (`redistribute` to Replicate), and its gradient comes back as a
Partial("avg") DTensor that `redistribute`'s backward reduce-scatters into the shard's
gradient. Under torch.compile that is functional `all_gather_into_tensor` /
`reduce_scatter_tensor` + `wait_tensor` in the graph, which the bucketing passes then
merge. `reshard_after_forward=True` wraps the gather in a selective checkpoint that
forces recomputation, so backward gathers again instead of keeping full parameters alive
(under torch.compile, where the partitioner obeys the policy; in eager, saved-tensor
hooks do the same: see eager_reshard.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dt_fsdp_passes.groups import register as register_groups
from dt_fsdp_passes.layout import (
    ParamLayout,
    allow_plain_gradient_in_graph,
    check_fsdp_mesh,
    gather,
    shard_parameter,
)

_SUBCLASS_CACHE: dict[tuple[type, tuple[str, ...]], type] = {}


@dataclass(frozen=True)
class MixedPrecision:
    """Dtypes of the gathered parameters (compute) and of the gradient reduce-scatter.

    None keeps the stored parameter's dtype. The optimizer always sees gradients in the
    stored dtype. With `cast_forward_inputs`, floating-point tensors passed to the root
    module's forward are cast to `param_dtype` (as FSDP2 does), so layers see one dtype.
    """

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True


def _cast_floats(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        cast = [_cast_floats(v, dtype) for v in value]
        return type(value)(cast) if not hasattr(value, "_fields") else type(value)(*cast)
    if isinstance(value, dict):
        return {k: _cast_floats(v, dtype) for k, v in value.items()}
    return value


def _input_caster(dtype: torch.dtype) -> Any:
    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return _cast_floats(args, dtype), _cast_floats(kwargs, dtype)

    return hook


@dataclass(frozen=True)
class _GatherSpec:
    mp: MixedPrecision
    reshard_after_forward: bool


def _gather(param: Any, layout: ParamLayout, mp: MixedPrecision) -> torch.Tensor:
    return gather(param, layout, mp)


def _recompute_gathers_policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    """Selective-checkpoint policy: never save a gather's output; recompute it in backward."""
    from torch.utils.checkpoint import CheckpointPolicy

    c10d = torch.ops._c10d_functional
    if func in (c10d.all_gather_into_tensor.default, c10d.wait_tensor.default):
        return CheckpointPolicy.MUST_RECOMPUTE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _recompute_context() -> Any:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_recompute_gathers_policy)


def _gathered(param: Any, layout: ParamLayout, spec: _GatherSpec) -> torch.Tensor:
    if not spec.reshard_after_forward or not torch.is_grad_enabled():
        return _gather(param, layout, spec.mp)
    if not torch.compiler.is_compiling():
        from dt_fsdp_passes.eager_reshard import remember

        full = _gather(param, layout, spec.mp)
        remember(full, param, layout, spec.mp)
        return full
    from torch.utils.checkpoint import checkpoint

    return checkpoint(
        _gather,
        param,
        layout,
        spec.mp,
        use_reentrant=False,
        context_fn=_recompute_context,
    )


def _property_for(name: str) -> property:
    def getter(self: nn.Module) -> torch.Tensor:
        # Set with object.__setattr__ by simple_fsdp, so they live in the instance dict.
        state = vars(self)
        layouts: dict[str, ParamLayout] = state["_dt_fsdp_layouts"]
        spec: _GatherSpec = state["_dt_fsdp_spec"]
        return _gathered(self._parameters[name], layouts[name], spec)

    def setter(self: nn.Module, value: Any) -> None:
        # nn.Module.__setattr__ is bypassed by the property: keep its Parameter handling.
        if isinstance(value, nn.Parameter) or value is None:
            self._parameters[name] = value
        else:
            raise TypeError(
                f"simple_fsdp: cannot assign a plain tensor to sharded parameter {name!r}; "
                "assign an nn.Parameter holding a DTensor laid out as simple_fsdp stored it"
            )

    return property(getter, setter)


def _sharded_subclass(cls: type, names: tuple[str, ...]) -> type:
    key = (cls, names)
    sub = _SUBCLASS_CACHE.get(key)
    if sub is None:
        attrs: dict[str, Any] = {name: _property_for(name) for name in names}
        attrs["_dt_fsdp_original_class"] = cls
        sub = type(f"SimpleFSDP{cls.__name__}", (cls,), attrs)
        _SUBCLASS_CACHE[key] = sub
    return sub


def simple_fsdp(
    module: nn.Module,
    mesh: Any,
    reshard_after_forward: bool = True,
    mp_policy: MixedPrecision | None = None,
) -> nn.Module:
    """Shard every parameter of `module` over `mesh`, in place.

    1-D `mesh`: FSDP (Shard(0)). 2-D `mesh`: HSDP (replicate over dim 0, shard over dim 1).
    Parameters that are already DTensors on other dims of the same root mesh (TP, spatial
    Replicate, ...) keep their placements there (see layout.py). Reading a parameter
    inside forward all-gathers it over the FSDP dims; its gradient is reduce-scattered
    (and all-reduced over the HSDP replicate dim), averaged, so each FSDP rank trains on
    its own batch and the result matches the unsharded model on the concatenated batch.
    Returns `module`. Every rank must call this with identical parameters (same seed).
    """
    check_fsdp_mesh(mesh)
    allow_plain_gradient_in_graph()
    spec = _GatherSpec(mp_policy or MixedPrecision(), bool(reshard_after_forward))
    for submodule in list(module.modules()):
        params = {name: p for name, p in submodule._parameters.items() if p is not None}
        names = tuple(params)
        if not names:
            continue
        if getattr(submodule, "_dt_fsdp_spec", None) is not None:
            raise ValueError("simple_fsdp: module already sharded")
        layouts: dict[str, ParamLayout] = {}
        for name, param in params.items():
            stored, layouts[name] = shard_parameter(name, param, mesh)
            submodule._parameters[name] = stored
        submodule.__class__ = _sharded_subclass(type(submodule), names)
        object.__setattr__(submodule, "_dt_fsdp_layouts", layouts)
        object.__setattr__(submodule, "_dt_fsdp_spec", spec)
    register_groups(mesh)
    if spec.reshard_after_forward:
        from dt_fsdp_passes.eager_reshard import wrap_forward

        wrap_forward(module)
    if spec.mp.param_dtype is not None and spec.mp.cast_forward_inputs:
        module.register_forward_pre_hook(_input_caster(spec.mp.param_dtype), with_kwargs=True)
    return module


def gathered_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """Full (unsharded) copies of all parameters, by name: for checks and checkpoints."""
    from torch.distributed.tensor import DTensor

    out: dict[str, torch.Tensor] = {}
    for name, param in module.named_parameters():
        value = param.detach()
        out[name] = value.full_tensor() if isinstance(value, DTensor) else value.clone()
    return out


def is_simple_fsdp(module: nn.Module) -> bool:
    """Whether simple_fsdp has been applied to `module` or one of its submodules."""
    return any(getattr(m, "_dt_fsdp_spec", None) is not None for m in module.modules())


__all__: list[str] = ["MixedPrecision", "gathered_state", "is_simple_fsdp", "simple_fsdp"]
