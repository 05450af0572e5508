"""The workloads of the GPU checks, shared by test_cuda_simulated.py (exactness) and
timings.py (speed), so both measure the same computation: each runs unsharded on one
device and sharded over simulated ranks (LocalTensorMode) holding tensors of that device.

DT_TEST_GPU_DEVICE=cpu puts every tensor on the CPU: a GPU-less machine can run the
checks' logic. There torch's one fused CPU SDPA kernel stands in for the CUDA ones.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor

DEVICE = torch.device(os.environ.get("DT_TEST_GPU_DEVICE", "cuda"))
WORLD = 2

# SDPA kernels as torch's sdpa_kernel selects them, and the dtypes each accepts on CUDA
# (flash and cuDNN are half-precision kernels; the memory-efficient one also takes fp32).
SDPA_KERNELS = ("flash", "efficient", "cudnn")
SDPA_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SDPA_SUPPORTED = {
    "flash": {torch.bfloat16, torch.float16},
    "efficient": {torch.bfloat16, torch.float16, torch.float32},
    "cudnn": {torch.bfloat16, torch.float16},
}
# The autograd node each kernel's forward op records: proves which kernel ran.
SDPA_NODES = {
    "flash": "ScaledDotProductFlashAttentionBackward0",
    "efficient": "ScaledDotProductEfficientAttentionBackward0",
    "cudnn": "ScaledDotProductCudnnAttentionBackward0",
    "cpu": "ScaledDotProductFlashAttentionForCpuBackward0",
}
# Bound on max |sharded - unsharded|, as a fraction of max(1, max |unsharded|): the two
# runs round differently (dt-cp's block algorithm vs one fused kernel), by the dtype's eps.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def exact_math() -> None:
    """No TF32: sharded and unsharded float32 runs then agree to float32 rounding."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def synchronize() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Seeded on the CPU generator, so every device sees the same values."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(device=DEVICE, dtype=dtype)


@dataclass(frozen=True)
class Case:
    """`fn(*inputs)`, with `placements[i]` the layout of input i on the simulated mesh."""

    name: str
    fn: Callable[..., torch.Tensor]
    inputs: Sequence[torch.Tensor]
    placements: Sequence[Sequence[Placement]]
    dtype: torch.dtype = torch.float32


def _conv_net(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    y = F.relu(F.conv2d(F.pad(x, (1, 1, 1, 1), mode="reflect"), a))
    y = F.max_pool2d(y, 2)
    y = F.interpolate(F.avg_pool2d(y, 3, stride=1, padding=1), scale_factor=2, mode="bilinear")
    return F.conv2d(y, b, padding=2, dilation=2)


def conv_case(dim: int) -> Case:
    """dt-conv: reflect pad, convolutions (cuDNN on CUDA), pooling and bilinear
    interpolation on an input sharded over H (dim 2) or W (dim 3)."""
    x = randn(2, 3, 20, 18, seed=0)
    w1, w2 = randn(6, 3, 3, 3, seed=1), randn(4, 6, 3, 3, seed=2)
    side = {2: "H", 3: "W"}[dim]
    return Case(
        f"conv {side}-sharded", _conv_net, (x, w1, w2), ([Shard(dim)], [Replicate()], [Replicate()])
    )


def _causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def sdpa_case(kernel: str, dtype: torch.dtype) -> Case:
    """dt-cp: causal SDPA on q, k, v sharded over the sequence."""
    q, k, v = (randn(1, 4, 256, 64, seed=s, dtype=dtype) for s in (3, 4, 5))
    name = f"sdpa {kernel} {dtype_name(dtype)}"
    return Case(name, _causal_sdpa, (q, k, v), [[Shard(2)]] * 3, dtype)


def sdpa_backend(kernel: str) -> Any:
    """The SDPBackend to select for `kernel`; on CPU the fused CPU kernel (FLASH there)."""
    from torch.nn.attention import SDPBackend

    if DEVICE.type != "cuda":
        return SDPBackend.FLASH_ATTENTION
    names = {
        "flash": "FLASH_ATTENTION",
        "efficient": "EFFICIENT_ATTENTION",
        "cudnn": "CUDNN_ATTENTION",
    }
    return getattr(SDPBackend, names[kernel])


def sdpa_node(kernel: str) -> str:
    return SDPA_NODES[kernel if DEVICE.type == "cuda" else "cpu"]


def autograd_nodes(t: torch.Tensor, depth: int = 6) -> set[str]:
    """Names of the autograd nodes within `depth` steps of `t`'s grad_fn."""
    found: set[str] = set()
    layer = [t.grad_fn]
    for _ in range(depth):
        layer = [n for n in layer if n is not None]
        found.update(type(n).__name__ for n in layer)
        layer = [nxt for n in layer for nxt, _ in n.next_functions]
    return found


def _weights(out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Distinct weights per output element (a loss whose gradients catch misplaced rows),
    rounded to the case's dtype also where `out` is float64 (the exact reference)."""
    w = torch.linspace(-1, 1, out.numel(), device=out.device).reshape(out.shape)
    return w.to(dtype).to(out.dtype)


def unsharded_step(case: Case) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Output and input gradients of (out * weights).sum() on one process."""
    leaves = [t.detach().requires_grad_() for t in case.inputs]
    out = case.fn(*leaves)
    grads = torch.autograd.grad((out * _weights(out, case.dtype)).sum(), leaves)
    return out.detach(), list(grads)


def in_float64(case: Case) -> Case:
    """The same case on the same (rounded) inputs in float64: the exact result to measure
    a low-precision kernel's own error against."""
    return replace(case, inputs=[t.double() for t in case.inputs])


def distribute(case: Case, mesh: Any) -> list[DTensor]:
    """The case's inputs as DTensor leaves on `mesh` (inside simulated_ranks)."""
    return [
        distribute_tensor(t, mesh, list(p)).requires_grad_()
        for t, p in zip(case.inputs, case.placements, strict=True)
    ]


def sharded_step(case: Case, leaves: Sequence[DTensor]) -> tuple[DTensor, list[torch.Tensor]]:
    """The same loss on DTensors; returns the sharded output and the inputs' gradients
    (DTensors laid out like the inputs)."""
    got = case.fn(*leaves)
    full = got.full_tensor()
    grads = torch.autograd.grad((full * _weights(full, case.dtype)).sum(), list(leaves))
    return got, list(grads)


def symm_mem_inputs() -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each rank's row block of A, and B: fused_all_gather_matmul computes cat(A) @ B."""
    return [randn(4, 8, seed=10 + r) for r in range(WORLD)], randn(8, 5, seed=20)


def symm_mem_sharded(mode: Any, shards: list[torch.Tensor], b: torch.Tensor) -> torch.Tensor:
    """dt-symm-mem's fused_all_gather_matmul under the mode (a LocalTensor per rank)."""
    import torch.distributed as dist
    import torch.distributed._symmetric_memory  # noqa: F401  (defines torch.ops.symm_mem.*)

    a = mode.rank_map(lambda r: shards[r])
    _, (out,) = torch.ops.symm_mem.fused_all_gather_matmul(
        a, [b], 0, dist.group.WORLD.group_name, return_A=False
    )
    return out


def fsdp_reference() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """A small MLP on the device and a batch of WORLD x 2 rows (inputs, targets)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    return model.to(DEVICE), randn(2 * WORLD, 6, seed=30), randn(2 * WORLD, 3, seed=31)


def mse_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Forward and backward of the mean squared error; gradients land in `.grad`."""
    for p in model.parameters():
        p.grad = None
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    return loss.detach()
