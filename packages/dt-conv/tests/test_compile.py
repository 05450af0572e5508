"""torch.compile(fullgraph=True) of sharded spatial ops equals the same ops on one process.

The halo exchange is made of functional collectives, so Dynamo and AOTAutograd trace
dt-conv's handlers with fake tensors and the compiled graph carries the exchange. Each
rank test compiles a few small models (compiling is slow on 2 cores) covering every op
kind; float64, forward and gradients of the input and every parameter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from dt_core.testing import cpu_mesh


def compare(
    fn: Callable[..., torch.Tensor],
    mesh: Any,
    x: torch.Tensor,
    placements: list,
    params: list[torch.Tensor],
    backend: str = "aot_eager",
) -> None:
    """fn(x, *params) compiled with fullgraph on DTensors == eager fn on full tensors."""
    import torch._dynamo
    from torch.distributed.tensor import Replicate, distribute_tensor

    torch._dynamo.reset()
    ref = [t.clone().requires_grad_(True) for t in (x, *params)]
    expected = fn(*ref)
    gen = torch.Generator().manual_seed(7)
    g = torch.randn(expected.shape, generator=gen, dtype=expected.dtype)
    (expected * g).sum().backward()

    rep = [Replicate()] * mesh.ndim
    xd = distribute_tensor(x, mesh, placements).requires_grad_(True)
    pd = [distribute_tensor(p, mesh, rep).requires_grad_(True) for p in params]
    got = torch.compile(fn, backend=backend, fullgraph=True)(xd, *pd)
    assert tuple(got.placements) == tuple(placements), got.placements
    gd = distribute_tensor(g, mesh, list(got.placements))
    (got * gd).sum().backward()
    torch.testing.assert_close(got.full_tensor(), expected, rtol=1e-9, atol=1e-9)
    for name, d, r in zip(["input"] + [f"param{i}" for i in range(len(params))], [xd, *pd], ref):
        assert d.grad is not None, name
        torch.testing.assert_close(d.grad.full_tensor(), r.grad, rtol=1e-9, atol=1e-9, msg=name)


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def small_net(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor):  # type: ignore[no-untyped-def]
    """The issue's net: 3x3 convs, ReLU, avg_pool2d, a dilated conv."""
    y = F.relu(F.conv2d(x, w1, padding=1))
    y = F.avg_pool2d(y, 2)
    y = F.relu(F.conv2d(y, w2, padding=2, dilation=2))
    return F.conv2d(y, w3, padding=1)


@pytest.mark.ranks(2)
def test_conv2d_compiles_fullgraph_on_a_1d_mesh() -> None:
    from torch.distributed.tensor import Shard

    torch.set_num_threads(1)
    mesh = cpu_mesh(2)
    x = _randn(2, 3, 12, 10)
    params = [_randn(4, 3, 3, 3, seed=1), _randn(4, 4, 3, 3, seed=2), _randn(2, 4, 3, 3, seed=3)]
    for placements in ([Shard(2)], [Shard(3)]):
        compare(small_net, mesh, x, placements, params)
