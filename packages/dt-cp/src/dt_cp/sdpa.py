"""DTensor handlers for torch's fused SDPA kernels on sequence-sharded q, k, v.

`F.scaled_dot_product_attention` reaches DTensor as one of torch's fused kernels: on CPU
`aten._scaled_dot_product_flash_attention_for_cpu` (causal, attn_mask, scale and GQA all
land there), on CUDA the flash / efficient / cuDNN kernels; each has a backward op.
Dropout, or value head dims unlike q's, make torch pick its decomposed math path
instead, which this plugin leaves to torch. The handlers run one of the exact
algorithms on the local shards — the executor of the path the plan decided
(`executors.EXECUTORS[plan.path]`) — and wrap the results as DTensors sharded like q; extra
outputs (RNG state, sequence offsets) are placeholders only our backward reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import torch
from dt_core.dtensors import as_dtensor
from dt_core.kit import Unsupported, bind_arguments, replicated_fallback
from torch.distributed.tensor import DTensor, Replicate

from .blocks import KV, AttentionSpec, Saved
from .executors import EXECUTORS
from .plan import (
    CpPlan,
    full_mask,
    make_plan,
    refuse_fallback_if_permuted,
    to_placements,
)


@dataclass(frozen=True)
class ForwardOp:
    """Where an SDPA forward op keeps its arguments, and how its outputs are laid out."""

    mask_arg: str | None  # name of the attn_mask / attn_bias argument
    extras: Callable[[torch.Tensor, int, int], tuple]  # outputs after (out, lse)


@dataclass(frozen=True)
class BackwardOp:
    mask_arg: str | None
    grad_arg: str
    lse_arg: str
    n_outputs: int  # 3, or 4 with a bias gradient


def _flash_extras(like: torch.Tensor, q_len: int, kv_len: int) -> tuple:
    e = like.new_empty(0)
    return (e, e, q_len, kv_len, e, e, e)


def _efficient_extras(like: torch.Tensor, q_len: int, kv_len: int) -> tuple:
    e = like.new_empty(0)
    return (e, e)


FORWARD: dict[str, ForwardOp] = {
    "_scaled_dot_product_flash_attention_for_cpu": ForwardOp("attn_mask", lambda *a: ()),
    "_scaled_dot_product_flash_attention": ForwardOp(None, _flash_extras),
    "_scaled_dot_product_efficient_attention": ForwardOp("attn_bias", _efficient_extras),
    "_scaled_dot_product_cudnn_attention": ForwardOp("attn_bias", _flash_extras),
}
BACKWARD: dict[str, BackwardOp] = {
    "_scaled_dot_product_flash_attention_for_cpu_backward": BackwardOp(
        "attn_mask", "grad_out", "logsumexp", 3
    ),
    "_scaled_dot_product_flash_attention_backward": BackwardOp(None, "grad_out", "logsumexp", 3),
    "_scaled_dot_product_efficient_attention_backward": BackwardOp(
        "attn_bias", "grad_out_", "logsumexp", 4
    ),
    "_scaled_dot_product_cudnn_attention_backward": BackwardOp(
        "attn_bias", "grad_out", "logsumexp", 3
    ),
}


def _spec(q: DTensor, k: DTensor, causal: object, mask: object, scale: object) -> AttentionSpec:
    return AttentionSpec(
        scale=1.0 / math.sqrt(q.shape[-1]) if scale is None else float(cast(float, scale)),
        causal=bool(causal),
        attn_mask=full_mask(mask, q.shape[2], k.shape[2]),
        native=q.device.type == "cpu",
    )


def _plan(a: dict[str, object], mask: object, bias_grad: bool = False) -> CpPlan:
    """`make_plan`, refusing also what these kernels cannot do: dropout, and a bias that
    needs a gradient (`bias_grad`: the backward op asks for one)."""
    plan = make_plan(a["query"], a["key"], a["value"], mask)
    if a.get("dropout_p"):
        raise Unsupported("dropout is not supported")
    if bias_grad or (isinstance(mask, torch.Tensor) and mask.requires_grad):
        raise Unsupported("attn_bias needs a gradient")
    return plan


def _qkv(a: dict[str, object]) -> tuple[DTensor, DTensor, DTensor]:
    """q, k, v once a plan exists (`make_plan` plans only for DTensors)."""
    return cast(DTensor, a["query"]), cast(DTensor, a["key"]), cast(DTensor, a["value"])


def _local(t: object) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else cast(torch.Tensor, t)


def forward_handler(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    info = FORWARD[op_call._schema.name.split("::")[-1]]
    a = bind_arguments(op_call, args, kwargs)
    mask = a[info.mask_arg] if info.mask_arg else None
    try:
        plan = _plan(a, mask)
    except Unsupported as exc:
        refuse_fallback_if_permuted(str(exc), a["query"], a["key"], a["value"])
        return replicated_fallback("cp", str(exc), op_call, args, kwargs, like=(a["query"],))
    q, k, v = _qkv(a)
    spec = _spec(q, k, a["is_causal"], mask, a["scale"])
    with torch.no_grad():
        kv = KV(k.to_local(), v.to_local())
        out, lse, _ = EXECUTORS[plan.path].forward(spec, plan.shards, q.to_local(), kv)
    b_, h_, n, _ = q.shape
    mesh, pl = plan.mesh, plan.placements
    rep = [Replicate()] * mesh.ndim
    extras = tuple(
        as_dtensor(e, mesh, rep, e.shape) if isinstance(e, torch.Tensor) else e
        for e in info.extras(out, n, k.shape[2])
    )
    return (
        as_dtensor(out, mesh, pl, (b_, h_, n, v.shape[-1])),
        as_dtensor(lse, mesh, pl, (b_, h_, n)),
        *extras,
    )


def backward_handler(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    info = BACKWARD[op_call._schema.name.split("::")[-1]]
    a = bind_arguments(op_call, args, kwargs)
    mask = a[info.mask_arg] if info.mask_arg else None
    wants_bias_grad = info.n_outputs == 4 and cast(Sequence[bool], a["grad_input_mask"])[3]
    try:
        plan = _plan(a, mask, wants_bias_grad)
    except Unsupported as exc:
        refuse_fallback_if_permuted(str(exc), a["query"], a["key"], a["value"])
        like = (a["query"], a["key"], a["value"])
        return replicated_fallback("cp", str(exc), op_call, args, kwargs, like=like)
    q, k, v = _qkv(a)
    mesh, pl = plan.mesh, plan.placements
    dout, out, lse = (to_placements(a[n], mesh, pl) for n in (info.grad_arg, "out", info.lse_arg))
    spec = _spec(q, k, a["is_causal"], mask, a["scale"])
    saved = Saved(*(_local(t) for t in (dout, q, out, lse)))
    with torch.no_grad():
        kv = KV(_local(k), _local(v))
        grads = EXECUTORS[plan.path].backward(spec, plan.shards, saved, kv)
    wrapped = tuple(
        as_dtensor(g.contiguous(), mesh, pl, t.shape) for g, t in zip(grads, (q, k, v), strict=True)
    )
    return wrapped + (None,) * (info.n_outputs - 3)
