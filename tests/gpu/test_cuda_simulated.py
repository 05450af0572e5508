"""Every plugin's CUDA path on one GPU: simulated ranks (LocalTensorMode) holding CUDA
tensors, each result checked against the same computation on one process on the GPU.

- dt-conv: halo convolution (cuDNN), pooling, interpolation and padding, values and
  gradients, on H- and W-sharded CUDA DTensors;
- dt-cp: causal SDPA on sequence-sharded CUDA DTensors through each kernel torch's
  `sdpa_kernel` selects (flash, memory-efficient, cuDNN) in bf16, fp16 and fp32 where the
  kernel takes the dtype, forward and backward;
- dt-symm-mem: its ops on CUDA tensors under the mode (torch alone refuses them there);
- dt-fsdp-passes: a SimpleFSDP model's forward and backward on CUDA parameters.
Each test records its max error (`record_property`), which tools/gpu_check.py reports.
Run by `hatch run test-gpu:run` or `bash tools/gpu_check.sh`; the workloads live in
gpu_cases.py, shared with timings.py.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import gpu_cases as gc
import pytest
import torch
from dt_core.testing import rank_values, simulated_ranks
from torch.distributed.device_mesh import init_device_mesh

DEVICE, WORLD = gc.DEVICE, gc.WORLD
Record = Callable[[str, object], None]  # pytest's record_property fixture
Results = tuple[torch.Tensor, list[torch.Tensor]]  # output and input gradients
STRICT = 1e-5  # float32 results of a few short sums (symm-mem, FSDP): their tighter bound


@pytest.fixture(autouse=True)
def exact_cuda_math() -> None:
    gc.exact_math()


def _errors(label: str, got: torch.Tensor, want: torch.Tensor) -> tuple[float, float, str]:
    """(max |got - want|, that / max(1, max |want|), label); checks the device and dtype
    at once, so a result computed elsewhere fails."""
    assert got.device.type == DEVICE.type, f"{label} on {got.device}, expected {DEVICE.type}"
    assert (got.dtype, got.shape) == (want.dtype, want.shape), label
    error = (got.double() - want.double()).abs().max().item()
    return error, error / max(1.0, want.abs().max().item()), label


def _record(record_property: Record, errors: list[tuple[float, float, str]], tol: float) -> None:
    """Report the max errors (also of a failing check), then hold the worst to `tol`."""
    error, relative, label = max(errors, key=lambda e: e[1])
    record_property("max_error", max(e[0] for e in errors))
    record_property("max_relative_error", relative)
    record_property("tolerance", tol)
    assert relative <= tol, f"{label}: max error {error:.3g}, relative {relative:.3g} > {tol:g}"


def _check_case(
    case: gc.Case, tol: float, record_property: Record, exact: Results | None = None
) -> set[str]:
    """The case sharded on simulated ranks == unsharded, output and every input gradient,
    on every rank. Returns the autograd node names near the sharded output.

    With `exact` (the float64 results), the unsharded kernel's own error is measured too
    and the bound is max(tol, 3 x that error): in half precision, dt-cp's blocks and the
    fused kernel each round their own way, so they may differ by about what the kernel
    itself is off; a sharding mistake is off by the values themselves."""
    want, want_grads = gc.unsharded_step(case)
    if exact is not None:
        pairs = zip([want, *want_grads], [exact[0], *exact[1]], strict=True)
        kernel = max(_errors("kernel", a, b.to(a.dtype))[1] for a, b in pairs)
        record_property("kernel_error", kernel)
        tol = max(tol, 3 * kernel)
    with simulated_ranks(WORLD):
        mesh = init_device_mesh(DEVICE.type, (WORLD,))
        got, grads = gc.sharded_step(case, gc.distribute(case, mesh))
        nodes = gc.autograd_nodes(got)
        full = [t.full_tensor().detach() for t in (got, *grads)]
        per_rank = [rank_values(t, WORLD) for t in full]
    labels = ["out", *(f"grad_input{i}" for i in range(len(grads)))]
    errors = [
        _errors(f"{label} rank {rank}", value, reference)
        for label, values, reference in zip(labels, per_rank, [want, *want_grads], strict=True)
        for rank, value in enumerate(values)
    ]
    _record(record_property, errors, tol)
    return nodes


@pytest.mark.parametrize("dim", [2, 3], ids=["H", "W"])
def test_conv_pool_pad_interpolate_on_cuda(dim: int, record_property: Record) -> None:
    if DEVICE.type == "cuda":
        assert torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled
        record_property("kernel", f"cuDNN {torch.backends.cudnn.version()}")
    _check_case(gc.conv_case(dim), gc.TOLERANCE[torch.float32], record_property)


@pytest.mark.parametrize("dtype", gc.SDPA_DTYPES, ids=gc.dtype_name)
@pytest.mark.parametrize("kernel", gc.SDPA_KERNELS)
def test_context_parallel_sdpa_on_cuda_kernels(
    kernel: str, dtype: torch.dtype, record_property: Record
) -> None:
    """dt-cp owns each kernel's forward and backward op on sequence-sharded DTensors: the
    selected kernel's autograd node sits on the sharded output and dt-cp's counters show
    the work (no replicated fallback)."""
    from dt_core.kit import reset_stats, stats
    from torch.nn.attention import sdpa_kernel

    if dtype not in gc.SDPA_SUPPORTED[kernel]:
        pytest.skip(f"{kernel} {gc.dtype_name(dtype)}: not supported by the kernel")
    node = gc.sdpa_node(kernel)
    record_property("kernel", node.removesuffix("Backward0"))
    case = gc.sdpa_case(kernel, dtype)
    exact = gc.unsharded_step(gc.in_float64(case)) if dtype != torch.float32 else None
    reset_stats()
    with sdpa_kernel([gc.sdpa_backend(kernel)]):
        nodes = _check_case(case, gc.TOLERANCE[dtype], record_property, exact)
    assert node in nodes, f"sharded SDPA did not run {node}: {sorted(nodes)}"
    assert stats().get("cp", {}).get("score_elements", 0) > 0, stats()


def test_symm_mem_ops_on_cuda_tensors_under_the_mode(record_property: Record) -> None:
    shards, b = gc.symm_mem_inputs()
    with simulated_ranks(WORLD) as mode:
        values = rank_values(gc.symm_mem_sharded(mode, shards, b), WORLD)
    full = torch.cat(shards) @ b
    errors = [_errors(f"rank {r}", v, full) for r, v in enumerate(values)]
    _record(record_property, errors, STRICT)


def test_simple_fsdp_forward_backward_on_cuda(record_property: Record) -> None:
    """Each simulated rank trains on its own rows; averaged gradients equal one process's
    on the whole batch."""
    from dt_fsdp_passes import simple_fsdp

    reference, x, y = gc.fsdp_reference()
    with simulated_ranks(WORLD) as mode:
        mesh = init_device_mesh(DEVICE.type, (WORLD,), mesh_dim_names=("fsdp",))
        model = simple_fsdp(copy.deepcopy(reference), mesh)
        xs = mode.rank_map(lambda r: x.chunk(WORLD)[r])
        ys = mode.rank_map(lambda r: y.chunk(WORLD)[r])
        loss = gc.mse_step(model, xs, ys)
        grads = {k: p.grad.full_tensor() for k, p in model.named_parameters()}
        losses = rank_values(loss, WORLD)
        got = {k: rank_values(g, WORLD) for k, g in grads.items()}
    want = gc.mse_step(reference, x, y)
    errors = [_errors("mean loss", sum(losses) / WORLD, want)]
    for name, p in reference.named_parameters():
        errors += [_errors(f"{name} rank {r}", v, p.grad) for r, v in enumerate(got[name])]
    _record(record_property, errors, STRICT)
