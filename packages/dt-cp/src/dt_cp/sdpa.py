"""DTensor handlers for torch's SDPA kernels on sequence-sharded q, k, v.

`F.scaled_dot_product_attention` on CPU reaches DTensor as
`aten._scaled_dot_product_flash_attention_for_cpu` (causal, attn_mask, scale and GQA
included) and its backward; dropout takes torch's decomposed math path instead, which
this plugin leaves alone. The handlers run one of the exact algorithms on the local
shards and wrap the results as DTensors sharded like q.
"""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate

from .algorithms import run_backward, run_forward
from .blocks import AttentionSpec
from .plan import CpPlan, as_dtensor, full_mask, make_plan, to_placements, warn_fallback

aten = torch.ops.aten
FORWARD_CPU = "sdpa (CPU)"


def bind(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[object]:
    """All arguments of `op_call` positionally, defaults filled in."""
    values: list[object] = []
    for i, arg in enumerate(op_call._schema.arguments):
        if i < len(args):
            values.append(args[i])
        elif arg.name in kwargs:
            values.append(kwargs[arg.name])
        else:
            values.append(arg.default_value)
    return values


def _spec(q: DTensor, k: DTensor, causal: bool, mask: object, scale: float | None) -> AttentionSpec:
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return AttentionSpec(
        scale=scale,
        causal=causal,
        attn_mask=full_mask(mask, q.shape[2], k.shape[2]),
        native=q.device.type == "cpu",
    )


def _replicated(t: object, mesh: object) -> object:
    if isinstance(t, DTensor):
        return t.redistribute(mesh, [Replicate()] * mesh.ndim).to_local()
    return t


def _target(placements: tuple) -> list:
    return [Replicate() if isinstance(p, Partial) else p for p in placements]


def cpu_forward(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    q, k, v, dropout_p, causal, mask, scale = bind(op_call, args, kwargs)
    plan = make_plan(q, k, v, mask)
    if isinstance(plan, CpPlan) and dropout_p:
        plan = "dropout is not supported"
    if isinstance(plan, str):
        return _forward_fallback(op_call, plan, q, k, v, dropout_p, causal, mask, scale)
    spec = _spec(q, k, causal, mask, scale)
    ql, kl, vl = q.to_local(), k.to_local(), v.to_local()
    with torch.no_grad():
        if plan.shards is None:
            out, lse = op_call(ql, kl, vl, 0.0, causal, attn_mask=_local_mask(mask), scale=scale)
        else:
            out, lse, _ = run_forward(plan.algorithm, spec, plan.shards, ql, kl, vl)
    b_, h_, n, _ = q.shape
    out_shape = (b_, h_, n, v.shape[-1])
    return (
        as_dtensor(out, plan.mesh, plan.placements, out_shape),
        as_dtensor(lse, plan.mesh, plan.placements, (b_, h_, n)),
    )


def _local_mask(mask: object) -> object:
    return mask.full_tensor() if isinstance(mask, DTensor) else mask


def cpu_backward(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    dout, q, k, v, out, lse, dropout_p, causal, mask, scale = bind(op_call, args, kwargs)
    plan = make_plan(q, k, v, mask)
    if isinstance(plan, CpPlan) and dropout_p:
        plan = "dropout is not supported"
    if isinstance(plan, str):
        return _backward_fallback(op_call, plan, args, kwargs, q, k, v)
    mesh, pl = plan.mesh, plan.placements
    dout, out, lse = (to_placements(t, mesh, pl) for t in (dout, out, lse))
    spec = _spec(q, k, causal, mask, scale)
    locals_ = [t.to_local() if isinstance(t, DTensor) else t for t in (dout, q, k, v, out, lse)]
    with torch.no_grad():
        if plan.shards is None:
            grads = op_call(*locals_, 0.0, causal, attn_mask=_local_mask(mask), scale=scale)
        else:
            grads = run_backward(plan.algorithm, spec, plan.shards, *locals_)
    return tuple(
        as_dtensor(g.contiguous(), mesh, pl, t.shape) for g, t in zip(grads, (q, k, v), strict=True)
    )


def _forward_fallback(
    op_call: torch._ops.OpOverload,
    reason: str,
    q: object,
    k: object,
    v: object,
    dropout_p: float,
    causal: bool,
    mask: object,
    scale: float | None,
) -> object:
    warn_fallback("scaled_dot_product_attention", reason)
    mesh = next(t.device_mesh for t in (q, k, v) if isinstance(t, DTensor))
    full = [_replicated(t, mesh) for t in (q, k, v, mask)]
    out, lse = op_call(*full[:3], dropout_p, causal, attn_mask=full[3], scale=scale)
    rep = [Replicate()] * mesh.ndim
    target = _target(tuple(q.placements)) if isinstance(q, DTensor) else rep
    return tuple(as_dtensor(t, mesh, rep, t.shape).redistribute(mesh, target) for t in (out, lse))


def _backward_fallback(
    op_call: torch._ops.OpOverload,
    reason: str,
    args: tuple,
    kwargs: dict,
    q: object,
    k: object,
    v: object,
) -> object:
    warn_fallback("scaled_dot_product_attention backward", reason)
    mesh = next(t.device_mesh for t in (q, k, v) if isinstance(t, DTensor))
    args = tuple(_replicated(a, mesh) for a in args)
    kwargs = {key: _replicated(a, mesh) for key, a in kwargs.items()}
    grads = op_call(*args, **kwargs)
    rep = [Replicate()] * mesh.ndim
    return tuple(
        as_dtensor(g, mesh, rep, g.shape).redistribute(mesh, _target(tuple(t.placements)))
        if isinstance(t, DTensor)
        else g
        for g, t in zip(grads, (q, k, v), strict=True)
    )
