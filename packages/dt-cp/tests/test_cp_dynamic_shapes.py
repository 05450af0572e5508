"""Compiles that follow compiles: one compiled attention called with other sequence
lengths and batch sizes in the same process (Dynamo recompiles with the changed sizes
symbolic), each exact against one process, values and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from dt_core.testing import cpu_mesh


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.compile_heavy
@pytest.mark.ranks(2, timeout=600)
def test_sequence_and_batch_sizes_that_follow_each_other() -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.set_num_threads(1)
    torch._dynamo.reset()
    mesh = cpu_mesh(2)
    compiled = torch.compile(_attend, backend="aot_eager", fullgraph=True)
    # 16 then 24 positions, a new batch, a longer sequence, one that splits unevenly
    for shape in [(1, 2, 16, 8), (1, 2, 24, 8), (3, 2, 24, 8), (2, 2, 40, 8), (2, 2, 21, 8)]:
        gen = torch.Generator().manual_seed(sum(shape))
        full = [torch.randn(shape, generator=gen, dtype=torch.float64) for _ in "qkv"]
        ref = [t.clone().requires_grad_() for t in full]
        expected = _attend(*ref)
        expected.sum().backward()
        sharded = [distribute_tensor(t, mesh, [Shard(2)]).requires_grad_() for t in full]
        got = compiled(*sharded)
        got.sum().backward()
        torch.testing.assert_close(got.full_tensor(), expected, msg=str(shape))
        for name, d, r in zip("qkv", sharded, ref):
            assert d.grad is not None, name
            torch.testing.assert_close(d.grad.full_tensor(), r.grad, msg=f"{shape} d{name}")
