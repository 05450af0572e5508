"""flex_attention on sequence-sharded DTensors.

`dt_cp.flex_attention(q, k, v, score_mod=..., block_mask=...)` takes DTensors sharded
along the sequence (dim 2) and returns the output sharded the same way, forward and
backward, on any device: torch 2.13's own flex_attention refuses backward on CPU before
any DTensor rule can run. Masks and score mods see global positions, also under head-tail
load balancing, so a BlockMask (or mask_mod) written for the whole sequence stays right.
The per-block kernel is an exact math kernel (chunked, float64 for float64 inputs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import torch
from dt_core.dtensors import as_dtensor
from dt_core.kit import Unsupported, replicated, warn_fallback
from torch.distributed.tensor import DTensor, Replicate

from .blocks import KV, AttentionSpec, Saved, autograd_vjp
from .executors import EXECUTORS
from .layout import Shards
from .plan import Path, batch_head_offsets, choose_path, make_plan, refuse_fallback_if_permuted
from .sparsity import BlockVisibility

LN2 = math.log(2.0)


def create_block_mask(
    mask_mod: Callable[..., torch.Tensor],
    B: int | None,
    H: int | None,
    Q_LEN: int,
    KV_LEN: int,
    device: torch.device | str = "cpu",
    **kwargs: Any,
) -> Any:
    """A BlockMask for the *global* sequence (what dt_cp.flex_attention expects).

    Same as torch's create_block_mask; it exists to say that masks are written in global
    positions whatever the sharding or load balancing: dt-cp evaluates `mask_mod` on the
    global positions of each rank's rows and columns.
    """
    from torch.nn.attention.flex_attention import create_block_mask as torch_create

    return torch_create(mask_mod, B, H, Q_LEN, KV_LEN, device=device, **kwargs)


class _ContextParallelFlex(torch.autograd.Function):
    """Autograd over local shards: backward re-runs the path's executor (the ring
    re-passes K/V); the path is the forward's plan's, decided once."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        spec: AttentionSpec,
        shards: Shards,
        path: Path,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse, _ = EXECUTORS[path].forward(spec, shards, q, KV(k, v))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.setup = (spec, shards, path)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor, _dlse: torch.Tensor | None) -> tuple:
        q, k, v, out, lse = ctx.saved_tensors
        spec, shards, path = ctx.setup
        saved = Saved(dout.contiguous(), q, out, lse)
        return *EXECUTORS[path].backward(spec, shards, saved, KV(k, v)), None, None, None


def _mods(score_mod: Any, block_mask: Any, q_len: int, kv_len: int) -> Any:
    """(score_mod, mask_mod, block visibility) for these arguments."""
    from dt_core.tracing import is_tracing

    mask_mod = visible = None
    if block_mask is not None:
        lengths = tuple(block_mask.seq_lengths)
        if lengths != (q_len, kv_len):
            raise ValueError(
                f"dt-cp: block_mask is for sequence lengths {lengths}, but q/k/v have "
                f"global lengths {(q_len, kv_len)}; build masks for the global sequence "
                "(dt_cp.create_block_mask)"
            )
        mask_mod = block_mask.mask_mod
        if not is_tracing(block_mask.kv_num_blocks):
            visible = BlockVisibility.from_block_mask(block_mask)
    return score_mod, mask_mod, visible


def flex_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    score_mod: Callable[..., torch.Tensor] | None = None,
    block_mask: Any = None,
    scale: float | None = None,
    enable_gqa: bool = False,
    return_lse: bool = False,
    mask_mod: Callable[..., torch.Tensor] | None = None,
) -> Any:
    """Exact flex attention on DTensors sharded along the sequence (dim 2).

    `block_mask` (a torch BlockMask for the global sequence) or `mask_mod` say which
    (query, key) pairs attend; `score_mod` changes scores; both see global positions.
    Returns the output (and the natural-log lse if `return_lse`) sharded like `query`.
    Plain tensors go to torch's own flex_attention.
    """
    if not isinstance(query, DTensor):
        from torch.nn.attention.flex_attention import flex_attention as torch_flex

        if mask_mod is not None:  # torch's flex takes masks as a BlockMask only
            if block_mask is not None:
                raise ValueError("dt-cp: pass block_mask or mask_mod, not both")
            q_len, kv_len = query.shape[2], key.shape[2]
            block_mask = create_block_mask(mask_mod, None, None, q_len, kv_len, query.device)
        options = {"score_mod": score_mod, "block_mask": block_mask, "scale": scale}
        if return_lse:
            return torch_flex(query, key, value, **options, enable_gqa=enable_gqa, return_lse=True)
        return torch_flex(query, key, value, **options, enable_gqa=enable_gqa)
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise ValueError(
            "dt-cp: query and key/value head counts differ; pass enable_gqa=True for GQA"
        )
    if query.shape[1] % key.shape[1]:
        raise ValueError("dt-cp: query heads must be a multiple of key/value heads")
    score, masked, visible = _mods(score_mod, block_mask, query.shape[2], key.shape[2])
    if mask_mod is not None:
        if masked is not None:
            raise ValueError("dt-cp: pass block_mask or mask_mod, not both")
        masked = mask_mod
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    try:
        plan = make_plan(query, key, value)
    except Unsupported as exc:
        refuse_fallback_if_permuted(str(exc), query, key, value)
        warn_fallback("cp", "flex_attention", str(exc))
        return _fallback(query, key, value, score, masked, scale, return_lse)
    b_off, h_off = batch_head_offsets(query)
    spec = AttentionSpec(
        scale,
        score_mod=score,
        mask_mod=masked,
        score_mod_vjp=autograd_vjp(score) if score is not None else None,
        batch_offset=b_off,
        head_offset=h_off,
        visible=visible,
    )
    key_local, value_local = (cast(DTensor, t).to_local() for t in (key, value))  # planned
    out, lse = _ContextParallelFlex.apply(
        query.to_local(), key_local, value_local, spec, plan.shards, plan.path
    )
    b_, h_, n, _ = query.shape
    out = as_dtensor(out, plan.mesh, plan.placements, (b_, h_, n, value.shape[-1]))
    if not return_lse:
        return out
    return out, as_dtensor(lse, plan.mesh, plan.placements, (b_, h_, n))


def _fallback(
    query: Any,
    key: Any,
    value: Any,
    score: Any,
    masked: Any,
    scale: float,
    return_lse: bool,
) -> Any:
    """Exact but unsharded: replicate, run the local math path, reshard like `query`.

    Not dt-core's `replicated_fallback`: the lse output keeps the query's sequence
    sharding (it is 3-D, the kit would leave it replicated)."""
    mesh = query.device_mesh
    rep = [Replicate()] * mesh.ndim
    vjp = autograd_vjp(score) if score is not None else None
    spec = AttentionSpec(scale, score_mod=score, mask_mod=masked, score_mod_vjp=vjp)
    shards = Shards.local(query.shape[2], key.shape[2])
    q, k, v = replicated(query), replicated(key), replicated(value)
    path = choose_path("allgather", q)  # the whole sequence here: local or simulated
    out, lse = _ContextParallelFlex.apply(q, k, v, spec, shards, path)
    target = [Replicate() if p.is_partial() else p for p in query.placements]
    out = as_dtensor(out, mesh, rep, out.shape).redistribute(mesh, target)
    if not return_lse:
        return out
    return out, as_dtensor(lse, mesh, rep, lse.shape).redistribute(mesh, target)
