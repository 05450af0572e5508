"""The plain math leaf kernel: any device, score_mod / mask_mod, forward and backward.

Its own module because it is one of two interchangeable kernels for a (query range, key
range) pair (the other: fused_cpu_kernel.py), used for flex attention and off CPU. It is
chunked over queries so it never holds more than a bounded score tile; its backward is
flash-style from the final lse, analytic except for score_mod's own vjp.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .attention_spec import KV, NEG_INF, AttentionSpec, Grads, Position, Saved, mask_slice

# Largest score tile (elements) the math kernel materialises at once.
MATH_TILE = 1 << 22


def _expand_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    if t.shape[1] == heads:
        return t
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def _scores(
    spec: AttentionSpec, q: torch.Tensor, k: torch.Tensor, rel: str, q0: int, k0: int
) -> torch.Tensor:
    """Masked, modded scores of a (query chunk, key block) pair; -inf where hidden."""
    b_, h_, qn, _ = q.shape
    kn = k.shape[2]
    s = torch.matmul(q, _expand_heads(k, h_).transpose(-1, -2)) * spec.scale
    dev = q.device
    qi = torch.arange(q0, q0 + qn, device=dev).view(1, 1, qn, 1)
    kj = torch.arange(k0, k0 + kn, device=dev).view(1, 1, 1, kn)
    bi = torch.arange(spec.batch_offset, spec.batch_offset + b_, device=dev).view(b_, 1, 1, 1)
    hi = torch.arange(spec.head_offset, spec.head_offset + h_, device=dev).view(1, h_, 1, 1)
    if spec.score_mod is not None:
        s = torch.broadcast_to(spec.score_mod(s, bi, hi, qi, kj), s.shape)
    allowed = None
    if rel in ("diag", "partial"):
        allowed = kj <= qi
    if spec.mask_mod is not None:
        m = spec.mask_mod(bi, hi, qi, kj)
        allowed = m if allowed is None else allowed & m
    user = mask_slice(spec, q0, qn, k0, kn)
    if user is not None:
        if user.dtype == torch.bool:
            allowed = user if allowed is None else allowed & user
        else:
            s = s + user.to(s.dtype)
    if allowed is not None:
        s = s.masked_fill(~torch.broadcast_to(allowed, s.shape), NEG_INF)
    return s


def _chunks(spec: AttentionSpec, q: torch.Tensor, kn: int) -> int:
    per_row = max(1, q.shape[0] * q.shape[1] * kn)
    return max(1, MATH_TILE // per_row)


def math_forward(
    spec: AttentionSpec, q: torch.Tensor, kv: KV, rel: str, pos: Position
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q0, qn, k0, kn = pos
    k = kv.k
    rows = _chunks(spec, q, kn)
    outs, lses, maxes = [], [], []
    vx = _expand_heads(kv.v, q.shape[1])
    for c in range(0, qn, rows):
        s = _scores(spec, q[:, :, c : c + rows], k, rel, q0 + c, k0)
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - torch.where(torch.isneginf(lse), 0.0, lse).unsqueeze(-1))
        outs.append(torch.matmul(p.to(vx.dtype), vx))
        lses.append(lse)
        maxes.append(s.amax(-1) if s.shape[-1] else lse)
    return torch.cat(outs, 2), torch.cat(lses, 2), torch.cat(maxes, 2)


def autograd_vjp(score_mod: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """d(score_mod)/d(score) applied to a gradient, by autograd (needs autograd enabled)."""

    def vjp(
        raw: torch.Tensor,
        b: torch.Tensor,
        h: torch.Tensor,
        qi: torch.Tensor,
        kj: torch.Tensor,
        grad: torch.Tensor,
    ) -> torch.Tensor:
        with torch.enable_grad():
            x = raw.detach().requires_grad_()
            y = torch.broadcast_to(score_mod(x, b, h, qi, kj), x.shape)
            return torch.autograd.grad(y, x, grad)[0]

    return vjp


def math_backward(spec: AttentionSpec, saved: Saved, kv: KV, rel: str, pos: Position) -> Grads:
    """Flash-style backward from the final lse; analytic except for score_mod's own vjp.

    Runs inside DTensor / HOP dispatch, below autograd, so it does not lean on autograd
    (the score_mod vjp comes from `spec.score_mod_vjp`: torch's joint graph, or autograd
    where that is available).
    """
    q0, qn, k0, kn = pos
    dout, q, out, lse = saved
    k, v = kv
    heads = q.shape[1]
    groups = heads // k.shape[1]
    rows = _chunks(spec, q, kn)
    kx, vx = _expand_heads(k, heads), _expand_heads(v, heads)
    dqs = []
    dkx = torch.zeros_like(kx)
    dvx = torch.zeros_like(vx)
    for c in range(0, qn, rows):
        sl = slice(c, c + rows)
        qc, do = q[:, :, sl], dout[:, :, sl]
        raw = _scores(AttentionSpec(spec.scale), qc, k, "full", q0 + c, k0)
        s = _scores(spec, qc, k, rel, q0 + c, k0)
        safe = torch.where(torch.isneginf(lse[:, :, sl]), float("inf"), lse[:, :, sl])
        p = torch.exp(s - safe.unsqueeze(-1))
        dvx += torch.matmul(p.transpose(-1, -2).to(do.dtype), do)
        delta = (do * out[:, :, sl]).sum(-1, keepdim=True)
        ds = p * (torch.matmul(do, vx.transpose(-1, -2)) - delta)
        if spec.score_mod is not None:
            if spec.score_mod_vjp is None:
                raise NotImplementedError("dt-cp: score_mod without a way to differentiate it")
            b_, h_ = qc.shape[0], qc.shape[1]
            dev = q.device
            bi = torch.arange(spec.batch_offset, spec.batch_offset + b_, device=dev)
            hi = torch.arange(spec.head_offset, spec.head_offset + h_, device=dev)
            qi = torch.arange(q0 + c, q0 + c + qc.shape[2], device=dev).view(1, 1, -1, 1)
            kj = torch.arange(k0, k0 + kn, device=dev).view(1, 1, 1, kn)
            ds = spec.score_mod_vjp(raw, bi.view(-1, 1, 1, 1), hi.view(1, -1, 1, 1), qi, kj, ds)
            ds = torch.where(p > 0, ds, 0.0)  # masked entries carry no gradient
        ds = ds.to(q.dtype) * spec.scale
        dqs.append(torch.matmul(ds, kx))
        dkx += torch.matmul(ds.transpose(-1, -2), qc)
    b_, _, n, e = dkx.shape
    dk = dkx.view(b_, heads // groups, groups, n, e).sum(2)
    dv = dvx.view(b_, heads // groups, groups, n, dvx.shape[-1]).sum(2)
    return Grads(torch.cat(dqs, 2), dk, dv)
