"""Exact attention of local queries against one block of keys/values, forward and backward.

A block is a run of keys whose global positions are a few contiguous ranges; queries
likewise. Range pairs that a causal mask hides entirely are skipped; pairs on the
diagonal use the kernel's own causal flag; others get an explicit mask from positions.
Each pair returns its output and log-sum-exp, merged across blocks by `Accumulator`.

Two leaf kernels: torch's fused CPU attention (`aten._scaled_dot_product_flash_attention
_for_cpu`, for SDPA on CPU) and a plain math kernel (any device, score_mod / mask_mod,
chunked over queries so it never holds more than a bounded score tile).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from dt_core.kit import Counters

from .layout import Range, Shards

Position = tuple[int, int, int, int]  # (q0, qn, k0, kn): a range pair in global positions

aten = torch.ops.aten
NEG_INF = float("-inf")
# Largest score tile (elements) the math kernel materialises at once.
MATH_TILE = 1 << 22
# Longest run of rows one kernel call sees (bounds per-call temporaries; see with_offsets).
# 1024 keeps a backward call's dq/dk/dv pieces small next to the O(S/P) state (ring memory
# at P=2) and measured no slower than 4096 at S=16k (the fused kernel tiles internally).
MAX_RANGE_ROWS = 1024
# The same where a rank holds the whole K/V anyway (the all-gather): larger calls run the
# fused kernel faster (one thread, 2 heads x 128: 84 GFLOP/s forward / 81 backward on
# 1024-row calls, 91 / 92 on 4096-row ones), and the all-gather's memory is O(S) regardless.
GATHERED_RANGE_ROWS = 4096
# A fused backward call of q query rows against k key rows allocates dq and a copy of
# grad_out's rows (q rows each), dk and dv (k rows each) and a ~1 MB work buffer.
# The ring's calls on its own block: 2048 rows took its fwd+bwd from 1.17x to 1.10x of one
# process at S=16k, P=2 (quiet machine, 2026-11-25); 9 MB per backward call there (B*H*D =
# 256, fp32), run with nothing in flight: the own-block phase of the ring's peak.
RING_RANGE_ROWS = 2048
# The ring's calls against a received chunk (query rows; the chunk is the key side). They
# run while chunks and dK/dV shares are in flight, so 2048 here would set the ring's peak
# (32 MB instead of 30 at S=8k, P=2); measured about 1% slower than 2048 (README).
RING_CHUNK_RANGE_ROWS = 1024
# The same when a BlockMask's sparsity can skip pieces (flex attention), whatever the above.
SPARSE_RANGE_ROWS = 512
# dt-cp's counters (dt-core's kit): "score_elements", the (query, key) scores this
# process computed, read by the benchmark and by `dt-plugins stats -- <command>`.
COUNTERS = Counters("cp")


@dataclass(frozen=True)
class AttentionSpec:
    """What to compute, in global coordinates (masks see global positions)."""

    scale: float
    causal: bool = False
    attn_mask: torch.Tensor | None = None  # additive float or bool, broadcast to (B,H,L,S)
    score_mod: Callable[..., torch.Tensor] | None = None
    mask_mod: Callable[..., torch.Tensor] | None = None
    native: bool = False  # use torch's fused CPU kernel (no score_mod / mask_mod)
    score_mod_vjp: Callable[..., torch.Tensor] | None = None  # (raw, b, h, q, kv, grad)
    batch_offset: int = 0  # global index of the first local batch row (score/mask mods)
    head_offset: int = 0  # global index of the first local head
    # (q0, qn, k0, kn) -> whether a BlockMask lists any block of the pair (None: all run)
    visible: Callable[[int, int, int, int], bool] | None = None


class KV(NamedTuple):
    """A block's keys and values (sequence on dim 2), or their gradients: they travel,
    slice and accumulate together."""

    k: torch.Tensor
    v: torch.Tensor

    def rows(self, lo: int, hi: int) -> KV:
        return KV(self.k[:, :, lo:hi], self.v[:, :, lo:hi])


class Saved(NamedTuple):
    """The query side of backward: the incoming gradient, the queries, and the forward's
    final (merged) output and log-sum-exp, which make each block's gradient exact alone."""

    dout: torch.Tensor
    q: torch.Tensor
    out: torch.Tensor
    lse: torch.Tensor

    def rows(self, lo: int, hi: int) -> Saved:
        return Saved(*(t[:, :, lo:hi] for t in self))


class Grads(NamedTuple):
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor


def with_offsets(ranges: list[Range], max_rows: int | None = None) -> list[tuple[int, int, int]]:
    """(local offset, global start, length) for each non-empty range, cut to `max_rows`.

    Cutting query and key ranges at the same global grid keeps causal pairs on the
    diagonal exact squares (fused kernel's own causal flag) and bounds the temporaries
    each kernel call makes (its dq/dk/dv and outputs) to `max_rows` rows.
    """
    step = max_rows or MAX_RANGE_ROWS
    out, offset = [], 0
    for start, n in ranges:
        cut = start
        while cut < start + n:
            end = min(start + n, (cut // step + 1) * step)
            out.append((offset + cut - start, cut, end - cut))
            cut = end
        offset += n
    return out


def relation(spec: AttentionSpec, q0: int, qn: int, k0: int, kn: int) -> str:
    """How a causal mask treats this (query range, key range) pair."""
    if not spec.causal:
        return "full"
    if k0 + kn - 1 <= q0:
        return "full"
    if k0 > q0 + qn - 1:
        return "skip"
    if k0 == q0 and kn == qn:
        return "diag"
    return "partial"


def mask_slice(spec: AttentionSpec, q0: int, qn: int, k0: int, kn: int) -> torch.Tensor | None:
    """The user's attn_mask for this pair of global ranges (or None)."""
    m = spec.attn_mask
    if m is None:
        return None
    return m[..., q0 : q0 + qn, k0 : k0 + kn]


def causal_mask(q0: int, qn: int, k0: int, kn: int, device: torch.device | str) -> torch.Tensor:
    qi = torch.arange(q0, q0 + qn, device=device)[:, None]
    kj = torch.arange(k0, k0 + kn, device=device)[None, :]
    return kj <= qi


# --- fused CPU kernel ---------------------------------------------------------------------


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


# --- math kernel --------------------------------------------------------------------------


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


# --- one block, every range pair ----------------------------------------------------------


class Accumulator:
    """Running output and log-sum-exp of the local queries over the blocks seen so far."""

    def __init__(self, q: torch.Tensor, v_dim: int) -> None:
        b_, h_, n, _ = q.shape
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        self.out = torch.zeros(b_, h_, n, v_dim, dtype=acc, device=q.device)
        self.lse = torch.full((b_, h_, n), NEG_INF, dtype=acc, device=q.device)
        self.max = torch.full((b_, h_, n), NEG_INF, dtype=acc, device=q.device)

    def merge(
        self, lo: int, out: torch.Tensor, lse: torch.Tensor, mx: torch.Tensor | None = None
    ) -> None:
        n = out.shape[2]
        if mx is not None:
            running = self.max[:, :, lo : lo + n]
            running.copy_(torch.maximum(running, mx.to(running.dtype)))
        o = self.out[:, :, lo : lo + n]
        old = self.lse[:, :, lo : lo + n]
        lse = lse.to(old.dtype)
        new = torch.logaddexp(old, lse)
        ref = torch.where(torch.isneginf(new), 0.0, new)
        w_old = torch.exp(old - ref).unsqueeze(-1)
        w_new = torch.exp(lse - ref).unsqueeze(-1)
        # In place, one temporary: this runs once per block on O(S/P)-sized outputs.
        out = out.to(o.dtype).masked_fill_(torch.isneginf(lse).unsqueeze(-1), 0.0)
        o.mul_(w_old).add_(out.mul_(w_new))
        old.copy_(new)

    def result(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(out in `dtype`, lse, max score): what the algorithms return."""
        return self.out.to(dtype), self.lse, self.max


def _pair_work(rel: str, qn: int, kn: int) -> int:
    """Visible (query, key) pairs of a range pair: what a causal-skipping kernel computes."""
    return qn * (qn + 1) // 2 if rel == "diag" else qn * kn


def _piece_rows(spec: AttentionSpec, rows: int | None) -> int | None:
    # With a BlockMask, finer pieces let its sparsity skip most of what it leaves out.
    return SPARSE_RANGE_ROWS if spec.visible is not None else rows


def piece_starts(spec: AttentionSpec, ranges: list[Range], rows: int | None = None) -> list[int]:
    """Local rows where the kernel pieces of a block laid out as `ranges` begin: the
    block cut there runs exactly the same kernel calls."""
    return [offset for offset, _, _ in with_offsets(ranges, _piece_rows(spec, rows))]


def _pairs(spec: AttentionSpec, q_ranges: list[Range], kv_ranges: list[Range], rows: int | None):
    rows = _piece_rows(spec, rows)
    for ql, q0, qn in with_offsets(q_ranges, rows):
        for kl, k0, kn in with_offsets(kv_ranges, rows):
            rel = relation(spec, q0, qn, k0, kn)
            if rel == "skip" or (spec.visible is not None and not spec.visible(q0, qn, k0, kn)):
                continue
            yield ql, kl, rel, (q0, qn, k0, kn)


def block_forward(
    spec: AttentionSpec,
    acc: Accumulator,
    q: torch.Tensor,
    q_ranges: list[Range],
    kv: KV,
    kv_ranges: list[Range],
    rows: int | None = None,
) -> None:
    """Merge this key/value block's contribution into `acc` (kernel calls of at most
    `rows` rows; None: `MAX_RANGE_ROWS`)."""
    leaf = native_forward if spec.native else math_forward
    for ql, kl, rel, pos in _pairs(spec, q_ranges, kv_ranges, rows):
        qn, kn = pos[1], pos[3]
        work = q.shape[0] * q.shape[1] * _pair_work(rel, qn, kn)
        if type(work) is int:  # not while tracing with symbolic shapes
            COUNTERS.add("score_elements", work)
        result = leaf(spec, q[:, :, ql : ql + qn], kv.rows(kl, kl + kn), rel, pos)
        acc.merge(ql, *result)


def block_backward(
    spec: AttentionSpec,
    dq: torch.Tensor,
    saved: Saved,
    q_ranges: list[Range],
    kv: KV,
    kv_ranges: list[Range],
    into: KV | None = None,
    rows: int | None = None,
) -> KV:
    """Add this block's share of dq into `dq`; return the block's (dk, dv).

    `into`, when given, is the (dk, dv) accumulated into in place (a rank's own sums);
    `rows` as in `block_forward`.
    """
    leaf = native_backward if spec.native else math_backward
    grads = KV(torch.zeros_like(kv.k), torch.zeros_like(kv.v)) if into is None else into
    if spec.native:  # rows with no visible key: lse +inf gives the fused kernel zero weights
        lse = saved.lse
        saved = saved._replace(lse=torch.where(torch.isneginf(lse), float("inf"), lse))
    for ql, kl, rel, pos in _pairs(spec, q_ranges, kv_ranges, rows):
        qn, kn = pos[1], pos[3]
        g = leaf(spec, saved.rows(ql, ql + qn), kv.rows(kl, kl + kn), rel, pos)
        dq[:, :, ql : ql + qn] += g.dq
        grads.k[:, :, kl : kl + kn] += g.dk
        grads.v[:, :, kl : kl + kn] += g.dv
        del g  # the next call's temporaries must not meet this call's
    return grads


# --- every block at once: the local path, the traced and the simulated all-gather ---------


def gathered_forward(
    spec: AttentionSpec, shards: Shards, q: torch.Tensor, kv_all: KV
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The local queries over K/V of every rank, here in rank order (gathered, simulated,
    or the whole sequence when nothing is sharded)."""
    acc = Accumulator(q, kv_all.v.shape[-1])
    rows = GATHERED_RANGE_ROWS
    block_forward(spec, acc, q, shards.q_ranges(), kv_all, shards.all_kv_ranges(), rows)
    return acc.result(q.dtype)


def gathered_backward(spec: AttentionSpec, shards: Shards, saved: Saved, kv_all: KV) -> Grads:
    """dq and this rank's share of dK/dV for the whole gathered sequence (to be summed)."""
    dq = torch.zeros_like(saved.q)
    q_ranges, kv_ranges = shards.q_ranges(), shards.all_kv_ranges()
    grads = block_backward(spec, dq, saved, q_ranges, kv_all, kv_ranges, rows=GATHERED_RANGE_ROWS)
    return Grads(dq, *grads)
