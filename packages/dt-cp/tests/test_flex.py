"""dt_cp.flex_attention on sequence-sharded DTensors equals dense attention on one process.

The reference is a dense float64 softmax attention with the same score_mod / mask_mod
applied on full index grids (torch's own flex_attention has no CPU backward); its forward
is itself checked against torch's flex_attention. Causal, sliding-window, document and
arbitrary masks, score mods, GQA, uneven lengths, ring and all-gather, with and without
head-tail balancing, on 2 and 4 ranks.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from cp_cases import compare, run_all
from dt_core.testing import cpu_mesh


def dense_reference(score_mod=None, mask_mod=None, gqa=False):
    """Softmax attention with mods on full (b, h, q, kv) index grids; rows with no key: 0."""

    def attend(q, k, v):
        b, h, s, e = q.shape
        if gqa:
            k = k.repeat_interleave(h // k.shape[1], 1)
            v = v.repeat_interleave(h // v.shape[1], 1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(e)
        bi = torch.arange(b).view(-1, 1, 1, 1)
        hi = torch.arange(h).view(1, -1, 1, 1)
        qi = torch.arange(s).view(1, 1, -1, 1)
        ki = torch.arange(k.shape[2]).view(1, 1, 1, -1)
        if score_mod is not None:
            scores = score_mod(scores, bi, hi, qi, ki) + 0 * scores
        if mask_mod is not None:
            keep = torch.broadcast_to(mask_mod(bi, hi, qi, ki), scores.shape)
            scores = scores.masked_fill(~keep, float("-inf"))
        p = torch.softmax(scores, -1).nan_to_num(0.0)
        return p @ v

    return attend


def causal(b, h, q, kv):
    return kv <= q


def sliding(b, h, q, kv):
    return (kv <= q) & (q - kv < 4)


def make_document(length: int):
    doc = torch.tensor([i * 3 // length for i in range(length)])  # three documents

    def document(b, h, q, kv):
        return (doc[q] == doc[kv]) & (kv <= q)

    return document


def checker(b, h, q, kv):
    return (q + kv + h) % 3 != 0


def alibi(score, b, h, q, kv):
    return score - (h + 1) * 0.1 * (q - kv).abs()


def flex_cases(world: int) -> None:
    import dt_cp

    mesh = cpu_mesh(world)
    cases = []
    for algorithm, balancer, s in itertools.product(
        ("ring", "allgather"), ("none", "head_tail"), (16, 11)
    ):
        mods = [
            ("causal", None, causal),
            ("sliding", None, sliding),
            ("document", None, make_document(s)),
            ("checker+alibi", alibi, checker),
        ]
        for label, score_mod, mask_mod in mods:

            def run(
                algorithm=algorithm, balancer=balancer, s=s, label=label, sm=score_mod, mm=mask_mod
            ):
                block_mask = dt_cp.create_block_mask(mm, None, None, s, s)
                ours = lambda q, k, v: dt_cp.flex_attention(  # noqa: E731
                    q, k, v, score_mod=sm, block_mask=block_mask
                )
                gqa = lambda q, k, v: dt_cp.flex_attention(  # noqa: E731
                    q, k, v, score_mod=sm, block_mask=block_mask, enable_gqa=True
                )
                name = f"flex {label} {algorithm} {balancer} S={s}"
                with dt_cp.settings(algorithm=algorithm):
                    return compare(
                        name,
                        ours,
                        dense_reference(sm, mm),
                        mesh,
                        (2, 2, s, 8),
                        balancer=balancer,
                    ) or compare(
                        name + " gqa",
                        gqa,
                        dense_reference(sm, mm, gqa=True),
                        mesh,
                        (1, 4, s, 8),
                        kv_heads=2,
                        balancer=balancer,
                    )

            cases.append((label, run))

    run_all(cases)


@pytest.mark.ranks(2, 4)
def test_flex(world_size: int) -> None:
    flex_cases(world_size)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_dense_reference_matches_torch_flex() -> None:
    """The reference itself agrees with torch's own flex_attention (forward, one process)."""
    import dt_cp
    from torch.nn.attention.flex_attention import flex_attention as torch_flex

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 16, 8, generator=gen, dtype=torch.float64) for _ in "qkv")
    for sm, mm in ((None, causal), (alibi, checker), (None, make_document(16))):
        bm = dt_cp.create_block_mask(mm, None, None, 16, 16)
        want = torch_flex(q, k, v, score_mod=sm, block_mask=bm)
        got = dense_reference(sm, mm)(q, k, v)
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0, msg=mm.__name__)
