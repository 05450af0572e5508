"""torch's own flex_attention on sequence-sharded DTensors, through dt-cp's HOP rule.

torch 2.13's front end refuses flex backward on CPU, so the front end is checked forward
only; forward and backward of the HOP rule are checked by calling the operator directly
(what the front end does on CUDA), against a dense float64 reference.
"""

from __future__ import annotations

import math

import pytest
import torch
from dt_core.testing import cpu_mesh


def dense(q, k, v, score_mod, mask_mod):
    b, h, s, e = q.shape
    scores = q @ k.transpose(-1, -2) / math.sqrt(e)
    idx = [
        torch.arange(n).view(*([1] * i), n, *([1] * (3 - i))) for i, n in enumerate((b, h, s, s))
    ]
    scores = score_mod(scores, *idx) + 0 * scores
    scores = scores.masked_fill(~torch.broadcast_to(mask_mod(*idx), scores.shape), float("-inf"))
    return torch.softmax(scores, -1) @ v


@pytest.mark.ranks(2)
def test_torch_flex_attention_on_dtensors() -> None:
    import dt_cp
    from dt_core.compat.attention import flex_attention_hops
    from torch.nn.attention.flex_attention import flex_attention

    mesh = cpu_mesh(2)
    hop, _ = flex_attention_hops()
    gen = torch.Generator().manual_seed(0)
    s = 13
    q, k, v, g = (torch.randn(1, 2, s, 8, generator=gen, dtype=torch.float64) for _ in "qkvg")

    # No captured tensors: torch traces mods with DTensor index values, and indexing a
    # captured plain tensor with those fails in torch (dt_cp.flex_attention has no such limit).
    def score_mod(score, b, h, qi, ki):
        return score - 0.1 * (h + 1) * (qi - ki)

    def mask_mod(b, h, qi, ki):
        return (ki <= qi) & (qi - ki < 6)

    block_mask = dt_cp.create_block_mask(mask_mod, None, None, s, s)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    want = dense(*ref, score_mod, mask_mod)
    (want * g).sum().backward()
    dt_cp.install_flex_rule()
    try:
        for algorithm, balancer in (("ring", "head_tail"), ("allgather", "none")):
            with dt_cp.settings(algorithm=algorithm, load_balancer=balancer):
                qd, kd, vd, gd = (dt_cp.shard_sequence(t, mesh, 2) for t in (q, k, v, g))
                out = flex_attention(qd, kd, vd, score_mod=score_mod, block_mask=block_mask)
                torch.testing.assert_close(
                    dt_cp.unshard_sequence(out, 2), want.detach(), atol=1e-10, rtol=0
                )
                # Forward and backward through the operator itself (autograd + our rules).
                leaves = [t.requires_grad_() for t in (qd, kd, vd)]
                out2, _, _ = hop(*leaves, score_mod, block_mask.as_tuple(), 1 / math.sqrt(8), {})
                (out2 * gd).sum().backward()
                for got, r in zip(leaves, ref, strict=True):
                    torch.testing.assert_close(
                        dt_cp.unshard_sequence(got.grad, 2), r.grad, atol=1e-10, rtol=0
                    )
    finally:
        dt_cp.remove_flex_rule()
    with pytest.raises(Exception):  # noqa: B017 - torch's own error, whatever its type
        flex_attention(qd.detach(), kd.detach(), vd.detach(), block_mask=block_mask)
