"""2-D meshes: the sequence sharded on one mesh dim, batch or heads on the other.

Score / mask mods that read the batch and head index must see global indices.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from dt_core.testing import cpu_mesh


@pytest.mark.ranks(4)
def test_sequence_and_batch_or_heads_sharded() -> None:
    import dt_cp
    from test_flex import dense_reference
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = cpu_mesh((2, 2))
    gen = torch.Generator().manual_seed(0)
    q, k, v, g = (torch.randn(2, 4, 10, 8, generator=gen, dtype=torch.float64) for _ in "qkvg")

    def head_bias(score, b, h, qi, ki):
        return score + 0.3 * h - 0.2 * b * (qi - ki)

    def batch_mask(b, h, qi, ki):
        return (ki <= qi) | ((b == 1) & (h >= 2))

    attends = {
        "sdpa": (
            lambda *t: F.scaled_dot_product_attention(*t, is_causal=True),
            lambda *t: F.scaled_dot_product_attention(*t, is_causal=True),
        ),
        "flex": (
            lambda *t: dt_cp.flex_attention(*t, score_mod=head_bias, mask_mod=batch_mask),
            dense_reference(head_bias, batch_mask),
        ),
    }
    failures = []
    for placements in ([Shard(0), Shard(2)], [Shard(1), Shard(2)], [Shard(2), Shard(1)]):
        for algorithm in ("ring", "allgather"):
            for name, (ours, reference) in attends.items():
                ref = [t.clone().requires_grad_() for t in (q, k, v)]
                want = reference(*ref)
                (want * g).sum().backward()
                with dt_cp.settings(algorithm=algorithm):
                    dts = [
                        distribute_tensor(t, mesh, placements).requires_grad_() for t in (q, k, v)
                    ]
                    y = ours(*dts)
                    (y * distribute_tensor(g, mesh, placements)).sum().backward()
                case = f"{name} {placements} {algorithm}"
                if tuple(y.placements) != tuple(placements):
                    failures.append(f"{case}: placements {y.placements}")
                got = [y.full_tensor(), *(t.grad.full_tensor() for t in dts)]
                for label, a, b in zip(
                    ("out", "dq", "dk", "dv"), got, [want, *(r.grad for r in ref)]
                ):
                    if not torch.allclose(a, b.detach(), atol=1e-10, rtol=0):
                        failures.append(f"{case}: {label}")
    assert not failures, failures
