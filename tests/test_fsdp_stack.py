"""simple_fsdp composed with the other parallelisms on a 2x2 CPU mesh (4 gloo ranks).

Each body trains a small model for two SGD steps on its rank's share of the batch and
compares losses and the gathered parameters with one process training on the whole
batch (computed on the same rank, without collectives). All run in one shared 4-rank
world; dt-conv, dt-cp and dt-symm-mem are active when installed (autoload).
"""

from __future__ import annotations

import pytest

TOL = 1e-5  # fp32: reduction order differs between sharded and unsharded math
STEPS = 2


def _setup() -> None:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)


def _train(reference, sharded, step_ref, step_sharded, batches, lr=0.1, loss_mesh=None):
    """Train both models on `batches`; return (max loss error, max param error).

    The sharded loss is averaged over `loss_mesh` (the data-parallel ranks; all ranks
    when None) before it is compared with the whole-batch loss.
    """
    import torch
    import torch.distributed as dist
    from dt_fsdp_passes import gathered_state

    opt_ref = torch.optim.SGD(reference.parameters(), lr=lr)
    opt = torch.optim.SGD(sharded.parameters(), lr=lr)
    loss_err = 0.0
    for batch in batches:
        for model, step, o in ((reference, step_ref, opt_ref), (sharded, step_sharded, opt)):
            o.zero_grad()
            loss = step(model, batch)
            loss.backward()
            o.step()
            value = loss.detach().clone()
            if model is reference:
                ref_loss = float(value)
                continue
            group = None if loss_mesh is None else loss_mesh.get_group()
            dist.all_reduce(value, group=group)
            mean = float(value) / dist.get_world_size(group)
            loss_err = max(loss_err, abs(mean - ref_loss))
    want = {k: v.detach() for k, v in reference.named_parameters()}
    got = gathered_state(sharded)
    assert want.keys() == got.keys(), (want.keys(), got.keys())
    param_err = max(float((want[k] - got[k].to(want[k].dtype)).abs().max()) for k in want)
    return loss_err, param_err


class _MLP:
    """Two linears, TP-ready (fc1 colwise, fc2 rowwise), built lazily inside rank bodies."""

    @staticmethod
    def make(width: int = 8, hidden: int = 16):
        import torch
        from torch import nn

        class MLP(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.fc1 = nn.Linear(width, hidden)
                self.fc2 = nn.Linear(hidden, width)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.fc2(torch.relu(self.fc1(x)))

        return MLP()


def _clone(model):
    import copy

    return copy.deepcopy(model)


def _mse_step(slice_of):
    def step(model, batch):
        x, y = batch
        x, y = slice_of(x), slice_of(y)
        return ((model(x) - y) ** 2).mean()

    return step


def _batches(shape, n=STEPS):
    import torch

    return [(torch.randn(*shape), torch.randn(*shape)) for _ in range(n)]


def _fsdp_tp(compile_backend: str | None, reshard: bool, mp: bool = False) -> tuple:
    import torch
    from dt_core.testing import cpu_mesh
    from dt_fsdp_passes import MixedPrecision, simple_fsdp
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    _setup()
    mesh = cpu_mesh((2, 2), ("dp", "tp"))
    reference = _MLP.make()
    model = _clone(reference)
    parallelize_module(model, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    policy = MixedPrecision(torch.bfloat16, torch.float32) if mp else None
    simple_fsdp(model, mesh["dp"], reshard_after_forward=reshard, mp_policy=policy)
    placements = {k: str(p.placements) for k, p in model.named_parameters()}
    dp = mesh["dp"].get_local_rank()
    run = model if compile_backend is None else torch.compile(model, backend=compile_backend)

    def sharded_step(m, batch):
        x, y = batch
        x, y = x.chunk(2)[dp], y.chunk(2)[dp]
        return ((run(x).float() - y) ** 2).mean()

    errors = _train(
        reference,
        model,
        _mse_step(lambda t: t),
        sharded_step,
        _batches((8, 8)),
        loss_mesh=mesh["dp"],
    )
    return errors, placements


@pytest.mark.ranks(4, timeout=300)
def test_fsdp_x_tp_eager_both_reshard_modes_and_layout() -> None:
    errors, placements = _fsdp_tp(None, reshard=True)
    assert errors[0] < TOL and errors[1] < TOL, errors
    # FSDP2's 2-D layout: fc1's TP shards dim 0 too, so FSDP shards each TP shard (strided).
    assert placements["fc1.weight"] == "(_StridedShard(dim=0, sf=2), Shard(dim=0))", placements
    assert placements["fc2.weight"] == "(Shard(dim=0), Shard(dim=1))", placements
    assert placements["fc2.bias"] == "(Shard(dim=0), Replicate())", placements
    errors, _ = _fsdp_tp(None, reshard=False)
    assert errors[0] < TOL and errors[1] < TOL, errors


@pytest.mark.ranks(4, timeout=300)
def test_fsdp_x_tp_mixed_precision_bf16_params_fp32_reduce() -> None:
    loss_err, param_err = _fsdp_tp(None, reshard=True, mp=True)[0]
    assert loss_err < 3e-2 and param_err < 1e-2, (loss_err, param_err)  # bf16 compute
    assert param_err > 0, "bf16 compute gave bit-identical fp32 results: was it cast?"


def _hsdp(compile_backend: str | None) -> tuple:
    import torch
    import torch.distributed as dist
    from dt_core.testing import cpu_mesh
    from dt_fsdp_passes import simple_fsdp

    _setup()
    mesh = cpu_mesh((2, 2), ("rep", "shard"))
    reference = _MLP.make()
    model = simple_fsdp(_clone(reference), mesh)
    placements = {k: str(p.placements) for k, p in model.named_parameters()}
    rank = dist.get_rank()
    run = model if compile_backend is None else torch.compile(model, backend=compile_backend)
    errors = _train(
        reference,
        model,
        _mse_step(lambda t: t),
        lambda m, b: ((run(b[0].chunk(4)[rank]) - b[1].chunk(4)[rank]) ** 2).mean(),
        _batches((8, 8)),
    )
    return errors, placements


@pytest.mark.ranks(4, timeout=300)
def test_hsdp_eager_and_flattened_mesh() -> None:
    import torch.distributed as dist
    from dt_core.testing import cpu_mesh
    from dt_fsdp_passes import simple_fsdp

    (loss_err, param_err), placements = _hsdp(None)
    assert loss_err < TOL and param_err < TOL, (loss_err, param_err)
    assert placements["fc1.weight"] == "(Replicate(), Shard(dim=0))", placements
    # A flattened 2x2 mesh is a 1-D FSDP mesh over all four ranks.
    _setup()
    flat = cpu_mesh((2, 2), ("dp", "cp"))["dp", "cp"]._flatten("dp_cp_fsdp_stack")
    reference = _MLP.make()
    model = simple_fsdp(_clone(reference), flat)
    rank = dist.get_rank()
    errors = _train(
        reference,
        model,
        _mse_step(lambda t: t),
        lambda m, b: ((m(b[0].chunk(4)[rank]) - b[1].chunk(4)[rank]) ** 2).mean(),
        _batches((8, 8)),
    )
    assert errors[0] < TOL and errors[1] < TOL, errors


@pytest.mark.ranks(4, timeout=300)
def test_fsdp_x_spatial_conv_replicated_params() -> None:
    from dt_core.testing import cpu_mesh
    from dt_fsdp_passes import simple_fsdp
    from torch import nn
    from torch.distributed.tensor import Shard, distribute_module, distribute_tensor

    _setup()
    mesh = cpu_mesh((2, 2), ("dp", "sp"))
    reference = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 3, padding=1)
    )
    model = _clone(reference)
    distribute_module(model, mesh["sp"])  # parameters Replicate on "sp"
    simple_fsdp(model, mesh["dp"])
    dp = mesh["dp"].get_local_rank()

    def sharded_step(m, batch):
        x, y = (t.chunk(2)[dp] for t in batch)
        x, y = (distribute_tensor(t, mesh["sp"], [Shard(2)]) for t in (x, y))
        out = m(x)
        assert out.placements == (Shard(2),), out.placements  # stays spatially sharded
        return ((out - y) ** 2).mean().full_tensor()

    errors = _train(
        reference,
        model,
        _mse_step(lambda t: t),
        sharded_step,
        _batches((4, 2, 8, 6)),
        loss_mesh=mesh["dp"],
    )
    assert errors[0] < TOL and errors[1] < TOL, errors


@pytest.mark.ranks(4, timeout=300)
def test_fsdp_x_cp_flattened_mesh_attention() -> None:
    import torch.nn.functional as F
    from dt_core.testing import cpu_mesh
    from dt_fsdp_passes import simple_fsdp
    from torch import nn
    from torch.distributed.tensor import DTensor, Shard

    _setup()
    mesh = cpu_mesh((2, 2), ("dp", "cp"))
    fsdp_mesh = mesh["dp", "cp"]._flatten("dp_cp_fsdp_stack")
    heads, dim = 2, 8

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(dim, 3 * dim)
            self.out = nn.Linear(dim, dim)

        def forward(self, x, cp_mesh=None):
            b, s, _ = x.shape
            q, k, v = (
                t.reshape(b, s, heads, dim // heads).transpose(1, 2)
                for t in self.qkv(x).chunk(3, dim=-1)
            )
            if cp_mesh is not None:
                q, k, v = (DTensor.from_local(t, cp_mesh, [Shard(2)]) for t in (q, k, v))
            o = F.scaled_dot_product_attention(q, k, v)
            if cp_mesh is not None:
                o = o.to_local()
            return self.out(o.transpose(1, 2).reshape(b, s, dim))

    reference = Attention()
    model = simple_fsdp(_clone(reference), fsdp_mesh)
    dp, cp = mesh["dp"].get_local_rank(), mesh["cp"].get_local_rank()

    def sharded_step(m, batch):
        x, y = (t.chunk(2)[dp].chunk(2, dim=1)[cp] for t in batch)
        return ((m(x, mesh["cp"]) - y) ** 2).mean()

    errors = _train(reference, model, _mse_step(lambda t: t), sharded_step, _batches((4, 8, dim)))
    assert errors[0] < TOL and errors[1] < TOL, errors


@pytest.mark.ranks(4, timeout=120)
def test_bad_meshes_and_parameters_name_the_problem() -> None:
    import torch
    from dt_core.testing import cpu_mesh
    from dt_fsdp_passes import simple_fsdp
    from torch import nn
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    def error_of(fn) -> str:
        try:
            fn()
        except ValueError as exc:
            return str(exc)
        raise AssertionError("no ValueError")

    mesh = cpu_mesh((2, 2), ("dp", "tp"))
    other = cpu_mesh((2, 2), ("a", "b"))

    def linear_with(weight) -> nn.Module:
        layer = nn.Linear(2, 4, bias=False)
        layer.weight = nn.Parameter(weight)
        return layer

    w = torch.ones(4, 2)
    msg = error_of(
        lambda: simple_fsdp(
            linear_with(distribute_tensor(w, other["b"], [Replicate()])), mesh["dp"]
        )
    )
    assert "'weight'" in msg and "different root meshes" in msg and "dp" in msg, msg
    msg = error_of(
        lambda: simple_fsdp(linear_with(distribute_tensor(w, mesh["dp"], [Shard(0)])), mesh["dp"])
    )
    assert "'weight'" in msg and "already sharded over" in msg, msg
    partial = DTensor.from_local(w, mesh["tp"], [Partial()])
    msg = error_of(lambda: simple_fsdp(linear_with(partial), mesh["dp"]))
    assert "'weight'" in msg and "Partial" in msg, msg
    cube = cpu_mesh((1, 2, 2), ("x", "y", "z"))
    msg = error_of(lambda: simple_fsdp(nn.Linear(2, 2), cube))
    assert "3-D mesh" in msg and "HSDP" in msg, msg
