"""The fused CPU leaf kernel: torch's `aten._scaled_dot_product_flash_attention_for_cpu`.

Its own module because it is one of two interchangeable kernels for a (query range, key
range) pair (the other: math_kernel.py), used for SDPA on CPU. Pairs on the diagonal use
the kernel's own causal flag; partly hidden pairs and the user's mask become an explicit
additive mask. The kernel reports lse 0 for rows with no visible key, corrected here to
-inf.
"""

from __future__ import annotations

import torch

from .attention_spec import (
    KV,
    NEG_INF,
    AttentionSpec,
    Grads,
    Position,
    Saved,
    causal_mask,
    mask_slice,
)

aten = torch.ops.aten


def _native_mask(
    spec: AttentionSpec, rel: str, q0: int, qn: int, k0: int, kn: int, dtype: torch.dtype
) -> tuple[torch.Tensor | None, bool]:
    """(additive float mask or None, is_causal flag) for the fused kernel."""
    user = mask_slice(spec, q0, qn, k0, kn)
    if user is None and rel in ("full", "diag"):
        return None, rel == "diag"
    allowed = None
    if rel in ("diag", "partial"):
        allowed = causal_mask(q0, qn, k0, kn, user.device if user is not None else "cpu")
    if user is not None and user.dtype == torch.bool:
        allowed = user if allowed is None else user & allowed
        user = None
    additive = torch.zeros((), dtype=dtype) if user is None else user.to(dtype)
    if allowed is not None:
        additive = additive.masked_fill(~allowed, NEG_INF)
    return additive.expand(*additive.shape[:-2], qn, kn) if additive.dim() >= 2 else additive, False


def _dead_rows(mask: torch.Tensor | None, lse: torch.Tensor) -> torch.Tensor | None:
    """Rows whose every key is masked (the fused kernel reports lse 0 for them)."""
    if mask is None:
        return None
    dead = torch.isneginf(mask).all(-1)
    return torch.broadcast_to(dead, lse.shape)


def native_forward(
    spec: AttentionSpec, q: torch.Tensor, kv: KV, rel: str, pos: Position
) -> tuple[torch.Tensor, torch.Tensor]:
    mask, is_causal = _native_mask(spec, rel, *pos, q.dtype)
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
        q, kv.k, kv.v, 0.0, is_causal, attn_mask=mask, scale=spec.scale
    )
    dead = _dead_rows(mask, lse)
    if dead is not None and bool(dead.any()):
        lse = lse.masked_fill(dead, NEG_INF)
    return out, lse


def native_backward(spec: AttentionSpec, saved: Saved, kv: KV, rel: str, pos: Position) -> Grads:
    """`saved.lse` is +inf, not -inf, on rows with no visible key (zero probabilities)."""
    dout, q, out, lse = saved
    mask, is_causal = _native_mask(spec, rel, *pos, q.dtype)
    return Grads(
        *aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, kv.k, kv.v, out, lse, 0.0, is_causal, attn_mask=mask, scale=spec.scale
        )
    )
