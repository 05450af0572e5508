"""The fused ops as documented Python functions, for CPU and CUDA tensors alike.

`group` is a ProcessGroup or a group name. Calls go through `torch.ops.symm_mem.*`, so
torch.compile sees one opaque op with torch's Meta kernel: CUDA tensors reach torch's own
symmetric-memory kernels, CPU tensors our CPU kernels (shared memory within a host, the
group's ordinary collectives across hosts). When the plugin's CPU kernels are not
installed (plugin disabled), CPU calls run our implementation directly.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dt_symm_mem import compat


def _group_name(group: Any) -> str:
    if isinstance(group, str):
        return group
    if group is None:
        import torch.distributed as dist

        group = dist.group.WORLD
    return compat.group_name_of(group)


def uses_torch_kernels(*tensors: Any) -> bool:
    """True when the call belongs to torch's CUDA symmetric memory (any CUDA operand)."""
    cuda = other = False
    for t in tensors:
        device = getattr(t, "device", None)
        if device is not None:
            if device.type == "cuda":
                cuda = True
            else:
                other = True
    if cuda and other:
        devices = sorted({t.device.type for t in tensors if hasattr(t, "device")})
        raise ValueError(f"dt-symm-mem: operands on mixed devices {devices}")
    return cuda


def _dim(dim: int, ndim: int) -> int:
    """A negative dim counted from the end (torch's kernels take only dims >= 0); out of
    range dims are passed on for the op to reject."""
    return dim + ndim if -ndim <= dim < 0 else dim


def _wait(tensor: torch.Tensor) -> torch.Tensor:
    """torch's CUDA low-contention collectives run on a side stream and register async
    work on the result: wait for it (as Inductor's wait_tensor does) before handing the
    tensor to code on the current stream."""
    return torch.ops._c10d_functional.wait_tensor(tensor)


def _torch_op(name: str) -> Any:
    compat.ensure_symm_mem_ops_defined()
    return getattr(torch.ops.symm_mem, name)


@torch.compiler.assume_constant_result
def _cpu_kernel_installed(op_name: str) -> bool:
    """Whether our CPU kernel is registered (a constant to torch.compile: no graph break)."""
    return compat.has_kernel(f"symm_mem::{op_name}", "CPU")


def _plain_eager(op_name: str, operands: tuple) -> bool:
    """Whether our kernel may run directly: plain CPU tensors outside any tracing (torch's
    op would only dispatch to it, and the round trip through the dispatcher into a Python
    kernel costs more than a 64 KiB all-gather). Compiled, traced or wrapped calls keep
    the op, so tracers see one opaque node. CPU operands that need gradients are refused
    with a clear error: these ops have no autograd formula (torch's CUDA ones neither)."""
    if torch.compiler.is_compiling():
        return False
    plain = True
    for t in operands:
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            return False
        if t.requires_grad and torch.is_grad_enabled():
            raise RuntimeError(
                f"dt-symm-mem: symm_mem.{op_name} has no autograd formula (torch's CUDA op "
                "has none either); call it under torch.no_grad() or on detached tensors"
            )
        plain = plain and type(t) is torch.Tensor
    return plain and not compat.tracing_modes_active()


def _call(op_name: str, function_name: str, operands: tuple, *args: Any, **kwargs: Any) -> Any:
    """Send the call to torch's op (CUDA, traced, or CPU with our kernel installed) or
    run ours."""
    if not _plain_eager(op_name, operands) and (
        uses_torch_kernels(*operands) or _cpu_kernel_installed(op_name)
    ):
        return _torch_op(op_name)(*args, **kwargs)
    from dt_symm_mem import ops

    return getattr(ops, function_name)(*args, **kwargs)


def fused_all_gather_matmul(
    A_shard: torch.Tensor,
    Bs: list[torch.Tensor],
    gather_dim: int,
    group: Any = None,
    *,
    return_A: bool = True,
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """`A = all_gather(A_shard, gather_dim)`; returns `(A if return_A else None, [A @ B
    for B in Bs])`, consuming each peer's shard as it arrives."""
    args = (A_shard, list(Bs), _dim(gather_dim, A_shard.dim()), _group_name(group))
    return _call(
        "fused_all_gather_matmul",
        "fused_all_gather_matmul",
        (A_shard, *Bs),
        *args,
        return_A=return_A,
    )


def fused_all_gather_scaled_matmul(
    A_shard: torch.Tensor,
    Bs: list[torch.Tensor],
    A_scale: torch.Tensor,
    B_scales: list[torch.Tensor],
    gather_dim: int,
    group: Any = None,
    biases: list[torch.Tensor | None] | None = None,
    result_scales: list[torch.Tensor | None] | None = None,
    out_dtypes: list[torch.dtype | None] | None = None,
    use_fast_accum: list[bool] | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """`_scaled_mm(all_gather(A_shard, gather_dim), B, A_scale, B_scale)` for each B
    (float8 operands; A_scale tensor-wise, row-wise sharded or row-wise replicated)."""
    n = len(Bs)
    dim = _dim(gather_dim, A_shard.dim())
    if dim == A_shard.dim() - 1:
        # torch's CUDA kernel fails deep inside (it passes the scales to a plain mm)
        raise NotImplementedError(
            "dt-symm-mem: fused_all_gather_scaled_matmul along the last dim is not supported "
            "(row-wise scales do not split along K; torch's kernel does not support it)"
        )
    args = (
        A_shard,
        list(Bs),
        A_scale,
        list(B_scales),
        dim,
        _group_name(group),
        list(biases) if biases is not None else [None] * n,
        list(result_scales) if result_scales is not None else [None] * n,
        list(out_dtypes) if out_dtypes is not None else [None] * n,
        list(use_fast_accum) if use_fast_accum is not None else [False] * n,
    )
    name = "fused_all_gather_scaled_matmul"
    return _call(name, name, (A_shard, *Bs), *args)


def fused_matmul_reduce_scatter(
    A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int, group: Any = None
) -> torch.Tensor:
    """`reduce_scatter(A @ B, reduce_op, scatter_dim)` ("sum" or "avg"), producing each
    destination's chunk while peers pull the previous one."""
    name = "fused_matmul_reduce_scatter"
    args = (A, B, reduce_op, _dim(scatter_dim, A.dim()), _group_name(group))
    return _call(name, name, (A, B), *args)


def _scatter_dim_after_reshape(A: torch.Tensor, lead: list[int], dim: int) -> int:
    """Where output dim `dim` lies in A when A's leading dims were reshaped (torch's
    micro-pipeline-TP rule; A's own dim when A has the output's leading dims)."""
    if list(A.shape[:-1]) == lead:
        return dim
    if dim == 0:
        return 0
    if dim == len(lead):
        return A.dim() - 1
    return 0 if A.shape[0] == math.prod(lead) else 1


def fused_scaled_matmul_reduce_scatter(
    A: torch.Tensor,
    B: torch.Tensor,
    A_scale: torch.Tensor,
    B_scale: torch.Tensor,
    reduce_op: str,
    scatter_dim: int,
    group: Any = None,
    *,
    output_shape: list[int] | None = None,
    bias: torch.Tensor | None = None,
    result_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    use_fast_accum: bool = False,
) -> torch.Tensor:
    """`reduce_scatter(_scaled_mm(A.flatten(0, -2), B, A_scale, B_scale, ...)
    .view(output_shape), reduce_op, scatter_dim)` for float8 A and B; `output_shape`
    defaults to `[*A.shape[:-1], B.shape[1]]` and `scatter_dim` is one of its dims.

    On CUDA, A (and row-wise A_scale) are viewed with the output's leading dims and the
    scatter dim moved to the front before calling torch's kernel, which splits rows
    correctly only in that form; scattering along the last dim raises there."""
    shape = list(output_shape) if output_shape is not None else [*A.shape[:-1], B.shape[1]]
    dim = _dim(scatter_dim, len(shape))
    kwargs = dict(bias=bias, result_scale=result_scale, out_dtype=out_dtype)
    name = "fused_scaled_matmul_reduce_scatter"
    if not uses_torch_kernels(A, B):
        after = _scatter_dim_after_reshape(A, shape[:-1], dim)
        args = (A, B, A_scale, B_scale, reduce_op, dim, after, _group_name(group), shape)
        return _call(name, name, (A, B), *args, **kwargs, use_fast_accum=use_fast_accum)
    if dim == len(shape) - 1:
        raise NotImplementedError(
            "dt-symm-mem: fused_scaled_matmul_reduce_scatter along the last (output "
            "column) dim is not supported by torch's CUDA symmetric memory"
        )
    lead = shape[:-1]
    A_front = A.reshape(*lead, A.shape[-1]).movedim(dim, 0)
    scale = A_scale
    if A_scale.numel() > 1:
        scale = A_scale.reshape(*lead, A_scale.shape[-1]).movedim(dim, 0)
    front_shape = [lead[dim], *lead[:dim], *lead[dim + 1 :], shape[-1]]
    args = (A_front, B, scale, B_scale, reduce_op, 0, 0, _group_name(group), front_shape)
    out = _torch_op(name)(*args, **kwargs, use_fast_accum=use_fast_accum)
    return out.movedim(0, dim)


def low_contention_all_gather(
    tensor: torch.Tensor, group: Any = None, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """All-gather along dim 0 (through shared memory on CPU). On CPU, `out` (contiguous,
    world * tensor.shape[0] rows) receives the result without a fresh allocation."""
    name = _group_name(group)
    if uses_torch_kernels(tensor):
        if out is not None:
            raise ValueError("dt-symm-mem: out= is only supported for CPU tensors")
        return _wait(_torch_op("_low_contention_all_gather")(tensor, name))
    if out is None:
        return _call(
            "_low_contention_all_gather", "low_contention_all_gather", (tensor,), tensor, name
        )
    from dt_symm_mem import ops

    # The group object itself: a name would only be looked up again (a 64 KiB all-gather
    # takes ~20 us, so each us of overhead shows).
    return ops.low_contention_all_gather(tensor, name if group is None else group, out=out)


def low_contention_reduce_scatter(
    tensor: torch.Tensor, reduce_op: str = "sum", group: Any = None
) -> torch.Tensor:
    """Reduce-scatter along dim 0, "sum" or "avg" (through shared memory on CPU)."""
    if uses_torch_kernels(tensor):
        op = _torch_op("_low_contention_reduce_scatter")
        return _wait(op(tensor, reduce_op, _group_name(group)))
    return _call(
        "_low_contention_reduce_scatter",
        "low_contention_reduce_scatter",
        (tensor,),
        tensor,
        reduce_op,
        _group_name(group),
    )
