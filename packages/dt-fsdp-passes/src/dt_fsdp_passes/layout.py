"""Where a parameter lives once simple_fsdp has sharded it, on 1-D (FSDP) or 2-D (HSDP) meshes.

A plain parameter becomes a DTensor on the FSDP mesh: `Shard(0)` on a 1-D mesh, or
`(Replicate(), Shard(0))` on a 2-D mesh (HSDP as FSDP2 spells it: replicate over dim 0,
shard over dim 1). A parameter that is already a DTensor on other dims of the same root
mesh (TP from `parallelize_module`, Replicate from `distribute_module`, ...) is stored on
the FSDP dims followed by its own dims, keeping its own placements there (FSDP2's 2-D
layout). When its own placements already shard tensor dim 0, the FSDP dims shard each
own shard further (torch's strided shard), so gathering over the FSDP dims gives back
exactly the parameter's own local shard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class ParamLayout:
    """How one stored parameter is gathered: over `fsdp_ndim` leading mesh dims, leaving a
    DTensor on `own_mesh` with `own_placements` (None for a parameter that was plain).

    HSDP (`fsdp_ndim == 2`): `replicate_mesh` is the replicate dim, `inner_mesh` the shard
    dim followed by the own dims (the stored DTensor without its replicate dim).
    """

    fsdp_ndim: int
    own_mesh: Any | None
    own_placements: tuple[Any, ...]
    replicate_mesh: Any | None = None
    inner_mesh: Any | None = None


def fsdp_placements(mesh: Any) -> list[Any]:
    """The FSDP dims' placements of a plain parameter on `mesh` (1-D: FSDP, 2-D: HSDP)."""
    from torch.distributed.tensor import Replicate, Shard

    return [Shard(0)] if mesh.ndim == 1 else [Replicate(), Shard(0)]


def check_fsdp_mesh(mesh: Any) -> None:
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"simple_fsdp: mesh must be a DeviceMesh, got {type(mesh).__name__}")
    if mesh.ndim not in (1, 2):
        raise ValueError(
            f"simple_fsdp: got a {mesh.ndim}-D mesh {mesh}; pass a 1-D mesh (FSDP) or a 2-D "
            "mesh (HSDP: replicate over dim 0, shard over dim 1). Tensor-, context- or "
            "spatial-parallel dims belong to the parameters' own DTensor placements "
            "(parallelize_module / distribute_module on a sub-mesh of the same root)"
        )


def _describe(name: str, param: Any, mesh: Any) -> str:
    return f"parameter {name!r} (on {param.device_mesh}, {param.placements}) and FSDP mesh {mesh}"


def _own_dim0_split(name: str, placements: tuple[Any, ...], mesh: Any, param: Any) -> int:
    """How many pieces the parameter's own placements cut tensor dim 0 into."""
    from dt_core.compat.placements import is_strided_shard
    from torch.distributed.tensor import Partial, Shard

    split = 1
    for i, placement in enumerate(placements):
        if isinstance(placement, Partial):
            raise ValueError(
                f"simple_fsdp: {_describe(name, param, mesh)}: a Partial parameter holds "
                "pending sums, not values; redistribute it to Replicate or Shard first"
            )
        if is_strided_shard(placement):
            raise ValueError(
                f"simple_fsdp: {_describe(name, param, mesh)}: strided-sharded parameters "
                "are not supported; is simple_fsdp applied twice?"
            )
        if isinstance(placement, Shard) and placement.dim in (0, -param.dim()):
            split *= param.device_mesh.size(i)
    return split


def source_rank(mesh: Any) -> int | None:
    """Whose values a parameter's shards take: rank 0's, scattered, on a real world; on
    torch's fake backend (a dry run, no peers) each shard is cut from the local value,
    since the fake scatter leaves it unwritten before torch 2.13."""
    from dt_core.compat.process_groups import is_fake_group

    return None if is_fake_group(mesh.get_group(mesh.ndim - 1)) else 0


def shard_parameter(name: str, param: nn.Parameter, mesh: Any) -> tuple[nn.Parameter, ParamLayout]:
    """The stored (sharded) parameter for `param` and how to gather it."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if param.dim() == 0:
        raise ValueError(
            f"simple_fsdp: 0-dim parameter {name!r} cannot be Shard(0); reshape it to (1,)"
        )
    fsdp = fsdp_placements(mesh)
    value = param.detach()
    if not isinstance(value, DTensor):
        stored = distribute_tensor(value, mesh, fsdp, src_data_rank=source_rank(mesh))
        layout = ParamLayout(mesh.ndim, None, ())
    else:
        stored, layout = _shard_dtensor(name, value, mesh, fsdp)
    if mesh.ndim == 2:
        layout = _with_hsdp_meshes(layout, mesh)
    return nn.Parameter(stored, requires_grad=param.requires_grad), layout


def _with_hsdp_meshes(layout: ParamLayout, mesh: Any) -> ParamLayout:
    from dataclasses import replace

    from dt_fsdp_passes.compat import concatenate_meshes

    names = mesh.mesh_dim_names
    if names is None:
        raise ValueError(f"simple_fsdp: a 2-D (HSDP) mesh needs mesh_dim_names, got {mesh}")
    shard = mesh[names[1]]
    inner = shard if layout.own_mesh is None else concatenate_meshes([shard, layout.own_mesh])
    return replace(layout, replicate_mesh=mesh[names[0]], inner_mesh=inner)


def _shard_dtensor(name: str, value: Any, mesh: Any, fsdp: list[Any]) -> tuple[Any, ParamLayout]:
    from dt_core.compat.placements import strided_shard
    from torch.distributed.tensor import distribute_tensor

    from dt_fsdp_passes.compat import concatenate_meshes, same_rank_map

    own_mesh = value.device_mesh
    own = tuple(value.placements)
    if not same_rank_map(own_mesh, mesh):
        raise ValueError(
            f"simple_fsdp: {_describe(name, value, mesh)} come from different root meshes "
            "(different rank arrangements); slice both from one init_device_mesh"
        )
    try:
        combined = concatenate_meshes([mesh, own_mesh])
    except ValueError as exc:
        raise ValueError(
            f"simple_fsdp: {_describe(name, value, mesh)}: the parameter is already "
            f"sharded over (or shares ranks with) the FSDP dims ({exc})"
        ) from None
    split = _own_dim0_split(name, own, mesh, value)
    if split > 1:
        fsdp = [*fsdp[:-1], strided_shard(0, split)]
    # Values are identical on every rank after full_tensor(), so distributing is exact.
    full = value.full_tensor()
    stored = distribute_tensor(full, combined, [*fsdp, *own], src_data_rank=source_rank(mesh))
    return stored, ParamLayout(mesh.ndim, own_mesh, own)


def gather(param: Any, layout: ParamLayout, mp: Any) -> torch.Tensor:
    """All-gather over the FSDP dims only; gradients reduce-scatter (and, for HSDP,
    all-reduce) averaged over them.

    A parameter that was plain comes back as a full local tensor; one that was a DTensor
    comes back as a DTensor on its own mesh with its own placements, so TP / spatial /
    context-parallel code sees what it was written for.
    """
    from torch.distributed.tensor import DTensor, Partial, Replicate

    if layout.replicate_mesh is not None:
        param = _without_replicate_dim(param, layout)
    fsdp_ndim = 1 if layout.replicate_mesh is not None else layout.fsdp_ndim
    fsdp_avg = [Partial("avg")] * fsdp_ndim
    full = param.redistribute(
        placements=[Replicate()] * fsdp_ndim + list(layout.own_placements),
        forward_dtype=mp.param_dtype,
        backward_dtype=mp.reduce_dtype,
    )
    if layout.own_mesh is None:
        local = full.to_local(grad_placements=fsdp_avg)
        return _plain_gradient(local)
    local = full.to_local(grad_placements=fsdp_avg + list(layout.own_placements))
    return DTensor.from_local(
        local,
        layout.own_mesh,
        layout.own_placements,
        run_check=False,
        shape=full.shape,
        stride=full.stride(),
    )


class _LocalGradient(torch.autograd.Function):
    """Identity whose backward turns a DTensor gradient into the plain full tensor.

    A plain gathered parameter used with DTensor activations on another mesh dim (a conv
    weight on a spatially sharded input, which dt-conv treats as replicated) gets its
    gradient back as a DTensor there (Partial or Replicate); its sum over that dim is the
    gradient of the plain parameter, which `to_local`'s backward expects.
    """

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        return grad.full_tensor() if isinstance(grad, DTensor) else grad


def allow_plain_gradient_in_graph() -> None:
    """Let Dynamo keep `_plain_gradient` as one call in the graph (see its docstring).

    `simple_fsdp` calls it, not this module's import: marking a function loads Dynamo
    (~1 s), which `import torch` with the plugin installed must not pay. It marks only
    our own function, as a decorator would.
    """
    torch.compiler.allow_in_graph(_plain_gradient)


def _plain_gradient(tensor: torch.Tensor) -> torch.Tensor:
    """`_LocalGradient`, also under torch.compile.

    Dynamo would trace the backward once, ahead of time, with a plain gradient (the
    forward output's type), keeping only the identity; the DTensor gradient that arrives
    when AOTAutograd traces the joint graph then reaches `to_local`'s backward, which
    refuses it. Left in the graph as a call (allow_in_graph marks only this function),
    AOTAutograd runs the real backward on the real gradient type and traces the sum.
    """
    return _LocalGradient.apply(tensor)


def _without_replicate_dim(param: Any, layout: ParamLayout) -> Any:
    """The HSDP parameter as a DTensor on its shard (and own) dims; the gradient coming back
    is all-reduced (averaged) over the replicate dim at shard size.

    One redistribute from (Replicate, Shard) would reduce the gradient over both dims in
    the opposite order (a full-size all-reduce, then the reduce-scatter); FSDP2 reduces
    the shard first, and so does this.
    """
    from torch.distributed.tensor import DTensor, Partial, Replicate

    local = param.to_local()
    replicated = DTensor.from_local(local, layout.replicate_mesh, [Replicate()], run_check=False)
    reduced = replicated.to_local(grad_placements=[Partial("avg")])
    return DTensor.from_local(
        reduced,
        layout.inner_mesh,
        param.placements[1:],
        run_check=False,
        shape=param.shape,
        stride=param.stride(),
    )


__all__ = ["ParamLayout", "check_fsdp_mesh", "fsdp_placements", "gather", "shard_parameter"]
