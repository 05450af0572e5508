"""Compiles that follow compiles in one process: other placements, image and batch sizes,
train and eval, another backend, `mark_dynamic` — each exact against one process.

`test_compile.compare` resets Dynamo before each compile; nothing here does, because
Dynamo's state between compiles is the point: a second call with other sizes makes
Dynamo recompile with those sizes symbolic (automatic dynamic shapes). dt-conv keeps
the batch symbolic and turns every other size into a number at its handlers' boundary
(`dt_conv.static_sizes`), so one compiled graph serves every batch size and a new image
size compiles a new graph. A user's `mark_dynamic` on a spatial dim is refused by torch
with its own error naming the dim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from dt_core.testing import cpu_mesh
from test_compile import _randn, ops_1d, ops_3d, small_net, transposed, window_ops_2d


def check_compiled(
    compiled: Callable[..., torch.Tensor],
    fn: Callable[..., torch.Tensor],
    mesh: Any,
    x: torch.Tensor,
    placements: list,
    params: list[torch.Tensor],
    dynamic_dims: tuple[int, ...] = (),
) -> None:
    """`compiled` (fn under torch.compile, already used for other calls) on DTensors
    equals `fn` on full tensors: values and every gradient."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    ref = [t.clone().requires_grad_(True) for t in (x, *params)]
    expected = fn(*ref)
    g = torch.randn(expected.shape, generator=torch.Generator().manual_seed(3), dtype=x.dtype)
    (expected * g).sum().backward()
    xd = distribute_tensor(x, mesh, placements).requires_grad_(True)
    for dim in dynamic_dims:
        torch._dynamo.mark_dynamic(xd, dim)
    pd = [distribute_tensor(p, mesh, [Replicate()]).requires_grad_(True) for p in params]
    got = compiled(xd, *pd)
    assert tuple(got.placements) == tuple(placements), got.placements
    (got * distribute_tensor(g, mesh, list(got.placements))).sum().backward()
    torch.testing.assert_close(got.full_tensor(), expected, rtol=1e-9, atol=1e-9)
    for name, d, r in zip(["input"] + [f"param{i}" for i in range(len(params))], [xd, *pd], ref):
        assert d.grad is not None, name
        torch.testing.assert_close(d.grad.full_tensor(), r.grad, rtol=1e-9, atol=1e-9, msg=name)


class Counted:
    """A compile backend that counts the graphs Dynamo hands it, then compiles them with
    `backend` (a recompile is one more graph)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        from dt_core.testing.compiled import lookup_backend

        self.graphs += 1
        return lookup_backend(self.backend)(gm, example_inputs)


def _net_params() -> list[torch.Tensor]:
    return [_randn(4, 2, 3, 3, seed=1), _randn(4, 4, 3, 3, seed=2), _randn(2, 4, 3, 3, seed=3)]


def _compiles_that_follow(backend: str) -> None:
    """The issue's sequence on one compiled function: sharded on H, then W (Dynamo
    recompiles with the sizes that changed symbolic), then another image and batch size,
    then only another batch (no new graph: the batch stays symbolic)."""
    from torch.distributed.tensor import Shard

    torch._dynamo.reset()
    mesh = cpu_mesh(2)
    counted = Counted(backend)
    compiled = torch.compile(small_net, backend=counted, fullgraph=True)
    params = _net_params()
    check_compiled(compiled, small_net, mesh, _randn(1, 2, 16, 16), [Shard(2)], params)
    check_compiled(compiled, small_net, mesh, _randn(1, 2, 16, 16), [Shard(3)], params)
    check_compiled(compiled, small_net, mesh, _randn(3, 2, 22, 18), [Shard(2)], params)
    graphs = counted.graphs
    check_compiled(compiled, small_net, mesh, _randn(5, 2, 22, 18), [Shard(2)], params)
    assert counted.graphs == graphs, "another batch size compiled a new graph"
    # uneven shards (11 rows on 2 ranks), a new batch and image size at once
    check_compiled(compiled, small_net, mesh, _randn(2, 2, 11, 14), [Shard(2)], params)


@pytest.mark.compile_heavy
@pytest.mark.ranks(2, timeout=600)
def test_compiles_that_follow_compiles_aot_eager() -> None:
    torch.set_num_threads(1)
    _compiles_that_follow("aot_eager")


@pytest.mark.compile_heavy
@pytest.mark.ranks(2, timeout=900)
def test_compiles_that_follow_compiles_inductor() -> None:
    """The failure as reported: Inductor, H then W (the second compile died in the
    partitioner on torch 2.14 and 2.15; on 2.11 and 2.12 Inductor's C++ code for the
    dynamic-shape recompile did not compile until dt-conv gave it 2.13's tile-2D rule,
    `dt_conv.compat`), then other sizes."""
    torch.set_num_threads(1)
    _compiles_that_follow("inductor")


@pytest.mark.compile_heavy
@pytest.mark.ranks(2, timeout=600)
def test_every_op_kind_at_a_second_size() -> None:
    """Each op family compiled once, then called at another image and batch size (and
    placement): pads of every mode, pooling, interpolation, transposed conv, 1-D, 3-D."""
    from torch.distributed.tensor import Shard

    torch.set_num_threads(1)
    torch._dynamo.reset()
    mesh = cpu_mesh(2)
    cases: list[tuple[Callable[..., torch.Tensor], list[torch.Tensor], list[tuple]]] = [
        (
            window_ops_2d,
            [_randn(4, 3, 3, 3, seed=4), _randn(4, 2, 4, 4, seed=5)],
            [((2, 3, 11, 10), [Shard(2)]), ((3, 3, 13, 12), [Shard(3)])],
        ),
        (ops_1d, [_randn(4, 3, 3, seed=6)], [((2, 3, 17), [Shard(2)]), ((3, 3, 21), [Shard(2)])]),
        (
            ops_3d,
            [_randn(3, 2, 3, 3, 3, seed=7)],
            [((1, 2, 6, 7, 8), [Shard(3)]), ((2, 2, 8, 7, 6), [Shard(4)])],
        ),
        (
            transposed,
            [_randn(4, 2, 3, 3, seed=8)],
            [((2, 4, 9, 8), [Shard(2)]), ((3, 4, 7, 10), [Shard(3)])],
        ),
    ]
    for fn, params, calls in cases:
        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
        for seed, (shape, placements) in enumerate(calls):
            check_compiled(compiled, fn, mesh, _randn(*shape, seed=seed), placements, params)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(2, 4, 3, padding=1, dtype=torch.float64)
        self.conv2 = torch.nn.Conv2d(4, 2, 3, padding=2, dilation=2, dtype=torch.float64)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.avg_pool2d(F.relu(self.conv1(x)), 2)
        return self.conv2(self.drop(y) * 0.5 + 0.5 * y)


@pytest.mark.compile_heavy
@pytest.mark.ranks(2, timeout=600)
def test_train_then_eval_and_mark_dynamic_batch() -> None:
    """One module compiled for a training step, then in eval mode without grad (a second
    graph), then with the batch marked dynamic by the user: each exact."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.set_num_threads(1)
    torch._dynamo.reset()
    mesh = cpu_mesh(2)
    torch.manual_seed(0)
    model = _Block()
    model.drop.p = 0.0  # dropout's mask is per-rank random; exactness needs none
    sharded = _Block()
    sharded.load_state_dict(model.state_dict())
    for name, p in list(sharded.named_parameters()):
        module, attr = name.rsplit(".", 1)
        dp = torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Replicate()]))
        setattr(sharded.get_submodule(module), attr, dp)
    sharded.drop.p = 0.0
    compiled = torch.compile(sharded, backend="aot_eager", fullgraph=True)

    x = _randn(2, 2, 12, 10)
    expected = model(x)
    expected.sum().backward()
    got = compiled(distribute_tensor(x, mesh, [Shard(2)]))
    got.sum().backward()
    torch.testing.assert_close(got.full_tensor(), expected, rtol=1e-9, atol=1e-9)
    for (name, p), (_, dp) in zip(model.named_parameters(), sharded.named_parameters()):
        torch.testing.assert_close(dp.grad.full_tensor(), p.grad, rtol=1e-9, atol=1e-9, msg=name)

    model.eval()
    sharded.eval()
    with torch.no_grad():
        x = _randn(3, 2, 14, 10, seed=1)
        got = compiled(distribute_tensor(x, mesh, [Shard(3)]))
        torch.testing.assert_close(got.full_tensor(), model(x), rtol=1e-9, atol=1e-9)
        for batch in (4, 6):
            x = _randn(batch, 2, 12, 12, seed=batch)
            xd = distribute_tensor(x, mesh, [Shard(2)])
            torch._dynamo.mark_dynamic(xd, 0)
            got = compiled(xd)
            torch.testing.assert_close(got.full_tensor(), model(x), rtol=1e-9, atol=1e-9)


@pytest.mark.ranks(2, timeout=600)
def test_mark_dynamic_on_a_sharded_dim_is_refused_by_name() -> None:
    """A halo exchange needs the size it exchanges along: marking that dim dynamic gets
    torch's constraint error naming the dim, never a wrong result."""
    from torch.distributed.tensor import Shard

    torch.set_num_threads(1)
    torch._dynamo.reset()
    mesh = cpu_mesh(2)
    compiled = torch.compile(small_net, backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match=r"size\(\)\[2\]") as caught:
        check_compiled(
            compiled, small_net, mesh, _randn(1, 2, 16, 16), [Shard(2)], _net_params(), (2,)
        )
    assert "AssertionError" not in type(caught.value).__name__
