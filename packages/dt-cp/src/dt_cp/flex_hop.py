"""A DTensor rule for torch's flex_attention higher-order operator.

With it, torch's own `flex_attention(q, k, v, score_mod=..., block_mask=...)` on
sequence-sharded DTensors returns the exact sequence-sharded result (the block mask is
built for the global sequence), forward and backward. HOP statistics are in log2 units,
converted here.

The plugin contributes these rules through dt-core's `dt_hop_rules` hook, so they are in
place as soon as DTensor is imported. torch 2.13's front end refuses CPU inputs that need
gradients before any rule runs (`_validate_device`); dt-cp's compat area contributes a
patch (installed and put back by dt-core) that defers that one check for DTensors while a
DTensor backward rule is registered.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from dt_core.dtensors import as_dtensor
from dt_core.kit import Unsupported
from torch.distributed.tensor import DTensor

from .blocks import KV, AttentionSpec, Saved
from .compat import attention
from .config import settings
from .executors import EXECUTORS
from .plan import CpPlan, batch_head_offsets, make_plan, refuse_fallback_if_permuted
from .sparsity import BlockVisibility

LN2 = math.log(2.0)
# Whether the deprecated `install_flex_rule` activated dt-core (so `remove_flex_rule` may
# deactivate it again).
_activated_here = False


def _plain(buffers: tuple) -> tuple:
    return tuple(b.full_tensor() if isinstance(b, DTensor) else b for b in buffers)


def _bind_mod(fn: Callable[..., Any], buffers: tuple) -> Callable[..., Any]:
    plain = _plain(buffers)
    return lambda *args: fn(*args, *plain)


def _joint_vjp(joint_graph: Any, buffers: tuple) -> Callable[..., Any] | None:
    """score_mod's vjp from torch's joint graph (autograd is off inside HOP dispatch)."""
    if joint_graph is None:
        return None
    plain = _plain(buffers)

    def vjp(raw: Any, b: Any, h: Any, qi: Any, kj: Any, grad: Any) -> Any:
        return torch.broadcast_to(joint_graph(raw, b, h, qi, kj, grad, *plain)[0], raw.shape)

    return vjp


def _setup(
    query: DTensor,
    key: DTensor,
    value: DTensor,
    scale: float,
    score_mod: Any,
    block_mask: tuple,
    score_buffers: tuple,
    mask_buffers: tuple,
    joint_graph: Any = None,
) -> tuple[CpPlan, AttentionSpec]:
    """The plan (its path decided once) and what to compute, as the HOP gives them."""
    from dt_core.tracing import is_tracing, simulates_ranks

    traced = is_tracing(block_mask[2])
    if traced and simulates_ranks(query, key, value):
        # torch's front end compiles even in eager, and Dynamo's fake tensors cannot hold
        # the per-rank values LocalTensorMode simulates: say so instead of torch's assert
        raise NotImplementedError(attention.SIMULATED_RANKS_FRONT_END)
    # torch's eager front end traces the operator once (fake tensors) before running it
    # for real: that trace only needs shapes, so it takes the traceable algorithm quietly.
    with settings(algorithm="allgather") if traced else contextlib.nullcontext():
        try:
            plan = make_plan(query, key, value)
        except Unsupported as exc:
            refuse_fallback_if_permuted(str(exc), query, key, value)
            raise NotImplementedError(
                f"dt-cp: flex_attention on these DTensors is not supported ({exc}); "
                "use dt_cp.flex_attention, which falls back exactly"
            ) from None
    q_len, kv_len = block_mask[0], block_mask[1]
    no_mask = attention.is_default_block_mask(block_mask)  # flex_attention(..., block_mask=None)
    if not no_mask and (q_len, kv_len) != (query.shape[2], key.shape[2]):
        raise ValueError(
            f"dt-cp: block_mask is for lengths {(q_len, kv_len)}, but the global sequence "
            f"lengths are {(query.shape[2], key.shape[2])}; build it for the global sequence"
        )
    b_off, h_off = batch_head_offsets(query)
    spec = AttentionSpec(
        scale,
        score_mod=_bind_mod(score_mod, score_buffers),
        mask_mod=_bind_mod(block_mask[-1], mask_buffers),
        score_mod_vjp=_joint_vjp(joint_graph, score_buffers),
        batch_offset=b_off,
        head_offset=h_off,
        visible=None if traced or no_mask else BlockVisibility.from_tuple(block_mask),
    )
    return plan, spec


def hop_forward(
    query: DTensor,
    key: DTensor,
    value: DTensor,
    score_mod: Callable[..., Any],
    block_mask: tuple,
    scale: float,
    kernel_options: dict,
    score_mod_other_buffers: tuple = (),
    mask_mod_other_buffers: tuple = (),
) -> tuple:
    plan, spec = _setup(
        query,
        key,
        value,
        scale,
        score_mod,
        block_mask,
        score_mod_other_buffers,
        mask_mod_other_buffers,
    )
    with torch.no_grad():
        kv = KV(key.to_local(), value.to_local())
        out, lse, mx = EXECUTORS[plan.path].forward(spec, plan.shards, query.to_local(), kv)
    b_, h_, n, _ = query.shape
    stats = (b_, h_, n)
    return (
        as_dtensor(out, plan.mesh, plan.placements, (b_, h_, n, value.shape[-1])),
        as_dtensor(lse / LN2, plan.mesh, plan.placements, stats),
        as_dtensor(mx / LN2, plan.mesh, plan.placements, stats),
    )


def hop_backward(
    query: DTensor,
    key: DTensor,
    value: DTensor,
    out: DTensor,
    logsumexp: DTensor,
    grad_out: DTensor,
    grad_logsumexp: Any,
    fw_graph: Callable[..., Any],
    joint_graph: Any,
    block_mask: tuple,
    scale: float,
    kernel_options: dict,
    score_mod_other_buffers: tuple,
    mask_mod_other_buffers: tuple,
) -> tuple:
    if isinstance(grad_logsumexp, torch.Tensor):
        g = grad_logsumexp.to_local() if isinstance(grad_logsumexp, DTensor) else grad_logsumexp
        if bool((g != 0).any()):
            raise NotImplementedError("dt-cp: gradients through flex_attention's lse")
    plan, spec = _setup(
        query,
        key,
        value,
        scale,
        fw_graph,
        block_mask,
        score_mod_other_buffers,
        mask_mod_other_buffers,
        joint_graph,
    )
    pl = plan.placements
    locals_ = [
        t.redistribute(plan.mesh, list(pl)).to_local()
        if tuple(t.placements) != pl
        else t.to_local()
        for t in (grad_out, query, key, value, out, logsumexp)
    ]
    dout, q, k, v, o, lse2 = locals_
    lse = lse2.to(torch.float64 if q.dtype == torch.float64 else torch.float32) * LN2
    with torch.no_grad():
        saved = Saved(dout.contiguous(), q, o, lse)
        dq, dk, dv = EXECUTORS[plan.path].backward(spec, plan.shards, saved, KV(k, v))
    wrapped = tuple(
        as_dtensor(g_.contiguous(), plan.mesh, pl, t.shape)
        for g_, t in zip((dq, dk, dv), (query, key, value), strict=True)
    )
    return (*wrapped, tuple(None for _ in score_mod_other_buffers))


def install_flex_rule() -> None:
    """Deprecated: installing dt-cp contributes these rules through dt-core (hook
    `dt_hop_rules`), the one install path. Kept for old callers (e.g. with autoload off):
    activates dt-core's plugins if nothing did yet; `remove_flex_rule()` undoes that."""
    import dt_core

    global _activated_here
    warnings.warn(
        "dt_cp.install_flex_rule() is no longer needed: installing dt-cp registers the "
        "flex_attention rules (dt-core hook dt_hop_rules); with autoload off, call "
        "dt_core.activate()",
        DeprecationWarning,
        stacklevel=2,
    )
    if not dt_core.is_active():
        dt_core.activate()
        _activated_here = True


def remove_flex_rule() -> None:
    """Deprecated with `install_flex_rule`: deactivates dt-core's plugins if that call
    activated them (otherwise they stay: dt-core owns the rules)."""
    import dt_core

    global _activated_here
    if _activated_here:
        _activated_here = False
        dt_core.deactivate()
