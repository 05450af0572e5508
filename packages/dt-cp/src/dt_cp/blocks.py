"""Exact attention of local queries against one block of keys/values, forward and backward.

A block is a run of keys whose global positions are a few contiguous ranges; queries
likewise. Range pairs that a causal mask hides entirely are skipped; pairs on the
diagonal use the kernel's own causal flag; others get an explicit mask from positions.
Each pair returns its output and log-sum-exp, merged across blocks by `Accumulator`.

Two leaf kernels: torch's fused CPU attention (fused_cpu_kernel.py, for SDPA on CPU) and a
plain math kernel (math_kernel.py: any device, score_mod / mask_mod, chunked over queries
so it never holds more than a bounded score tile). The types they share live in
attention_spec.py and are re-exported here, where callers import them. The row limits
below stay here: they are read at call time, and tests and benchmarks set them on this
module.
"""

from __future__ import annotations

import torch
from dt_core.kit import Counters

from .attention_spec import KV, NEG_INF, AttentionSpec, Grads, Saved
from .fused_cpu_kernel import native_backward, native_forward
from .layout import Range, Shards
from .math_kernel import (
    autograd_vjp,  # noqa: F401 - re-exported: flex.py imports it from here
    math_backward,
    math_forward,
)

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
