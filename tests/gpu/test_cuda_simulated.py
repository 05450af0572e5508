"""Every plugin's CUDA path on one GPU: simulated ranks (LocalTensorMode) holding CUDA
tensors, each result checked against the same computation on one process on the GPU.

- dt-conv: halo convolution (cuDNN), pooling, interpolation and padding, values and
  gradients, on spatially sharded CUDA DTensors;
- dt-cp: SDPA on sequence-sharded CUDA DTensors, through the CUDA kernels' ops
  (flash in half precision, memory-efficient in float32), forward and backward;
- dt-symm-mem: its ops on CUDA tensors under the mode (torch alone refuses them there);
- dt-fsdp-passes: a SimpleFSDP model's forward and backward on CUDA parameters.
Run by `hatch run test-gpu:run`; with several GPUs the runner also starts NCCL ranks.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from dt_core.testing import rank_values, simulated_ranks
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

# DT_TEST_GPU_DEVICE=cpu runs the same checks on the CPU: a way to try this file's logic
# on a machine without a GPU (the runner itself only runs it where CUDA is).
CUDA = torch.device(os.environ.get("DT_TEST_GPU_DEVICE", "cuda"))
WORLD = 2


@pytest.fixture(autouse=True)
def exact_cuda_math() -> None:
    """No TF32: sharded and unsharded runs then agree to float32 rounding."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(device=CUDA, dtype=dtype)


def _check(fn, x, params, placements, tol, param_placements=None) -> None:  # type: ignore[no-untyped-def]
    """fn on sharded CUDA DTensors == fn on the full CUDA tensors: output and gradients
    (parameters replicated unless `param_placements` says otherwise)."""
    ref = [t.clone().requires_grad_() for t in (x, *params)]
    want = fn(*ref)
    weights = torch.linspace(-1, 1, want.numel(), device=CUDA).reshape(want.shape)
    (want * weights).sum().backward()
    with simulated_ranks(WORLD):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(CUDA.type, (WORLD,))
        xd = distribute_tensor(x, mesh, placements).requires_grad_()
        layouts = param_placements or [[Replicate()]] * len(params)
        pd = [
            distribute_tensor(p, mesh, pl).requires_grad_()
            for p, pl in zip(params, layouts, strict=True)
        ]
        got = fn(xd, *pd)
        full = got.full_tensor()
        (full * weights).sum().backward()
        grads = [t.grad.full_tensor() for t in (xd, *pd)]
        values = [rank_values(v, WORLD)[0] for v in (full, *grads)]
    for label, a, b in zip(
        ["out", "grad_x", *["grad_p"] * len(params)],
        values,
        [want.detach(), *(t.grad for t in ref)],
    ):
        assert a.device.type == CUDA.type, label
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=label)


@pytest.mark.parametrize("dim", [2, 3])
def test_conv_pool_pad_interpolate_on_cuda(dim: int) -> None:
    w1, w2 = _randn(6, 3, 3, 3, seed=1), _randn(4, 6, 3, 3, seed=2)

    def net(x, a, b):  # type: ignore[no-untyped-def]
        y = F.relu(F.conv2d(F.pad(x, (1, 1, 1, 1), mode="reflect"), a))
        y = F.max_pool2d(y, 2)
        y = F.interpolate(F.avg_pool2d(y, 3, stride=1, padding=1), scale_factor=2, mode="bilinear")
        return F.conv2d(y, b, padding=2, dilation=2)

    _check(net, _randn(2, 3, 20, 18, seed=0), [w1, w2], [Shard(dim)], tol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_context_parallel_sdpa_on_cuda_kernels(dtype: torch.dtype) -> None:
    """Half precision takes torch's flash kernel op, float32 the memory-efficient one;
    dt-cp owns both on sequence-sharded DTensors (its counters show the work)."""
    from dt_core.kit import reset_stats, stats

    q, k, v = (_randn(1, 4, 256, 64, seed=s, dtype=dtype) for s in (3, 4, 5))
    reset_stats()
    tol = 2e-2 if dtype == torch.float16 else 1e-4
    _check(
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True),
        q,
        [k, v],
        [Shard(2)],
        tol=tol,
        param_placements=[[Shard(2)], [Shard(2)]],
    )
    assert stats().get("cp", {}).get("score_elements", 0) > 0, stats()


def test_symm_mem_ops_on_cuda_tensors_under_the_mode() -> None:
    import torch.distributed._symmetric_memory  # noqa: F401  (defines torch.ops.symm_mem.*)

    shards = [_randn(4, 8, seed=10 + r) for r in range(WORLD)]
    b = _randn(8, 5, seed=20)
    with simulated_ranks(WORLD) as mode:
        a = mode.rank_map(lambda r: shards[r])
        _, (out,) = torch.ops.symm_mem.fused_all_gather_matmul(
            a, [b], 0, dist.group.WORLD.group_name, return_A=False
        )
        values = rank_values(out, WORLD)
    full = torch.cat(shards) @ b
    for value in values:
        assert value.device.type == CUDA.type
        torch.testing.assert_close(value, full, rtol=1e-5, atol=1e-5)


def test_simple_fsdp_forward_backward_on_cuda() -> None:
    """Each simulated rank trains on its own rows; averaged gradients equal one process's
    on the whole batch."""
    import copy

    from dt_fsdp_passes import simple_fsdp
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(0)
    reference = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
    ).to(CUDA)
    x, y = _randn(2 * WORLD, 6, seed=30), _randn(2 * WORLD, 3, seed=31)
    with simulated_ranks(WORLD) as mode:
        mesh = init_device_mesh(CUDA.type, (WORLD,), mesh_dim_names=("fsdp",))
        model = simple_fsdp(copy.deepcopy(reference), mesh)
        xs = mode.rank_map(lambda r: x.chunk(WORLD)[r])
        ys = mode.rank_map(lambda r: y.chunk(WORLD)[r])
        loss = ((model(xs) - ys) ** 2).mean()
        loss.backward()
        grads = {k: p.grad.full_tensor() for k, p in model.named_parameters()}
        losses = [float(v) for v in rank_values(loss.detach(), WORLD)]
    want = ((reference(x) - y) ** 2).mean()
    want.backward()
    assert abs(sum(losses) / WORLD - want.item()) < 1e-5, (losses, want.item())
    for name, p in reference.named_parameters():
        for got in rank_values(grads[name], WORLD):
            assert got.device.type == CUDA.type, name
            torch.testing.assert_close(got, p.grad, rtol=1e-5, atol=1e-5, msg=name)
