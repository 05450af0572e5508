"""The six ops, and dt-symm-mem's own summed one, under torch's LocalTensorMode, where
one process simulates every rank.

LocalTensorMode runs an op once per simulated rank, which cannot work for a kernel that
waits on its peers through shared memory, and torch refuses `symm_mem` ops there. These
rules give the same results from functional collectives, which LocalTensorMode does
simulate: a one-process test of a model using the fused ops sees what real ranks compute.
Arguments are checked as the real kernels check them, with the same messages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from dt_core.kit import bind_arguments

from dt_symm_mem import compat, ops
from dt_symm_mem.op_checks import row_wise


def _world(group_name: str) -> int:
    return int(compat.resolve_process_group(group_name).size())


def _gather(x: torch.Tensor, dim: int, group_name: str) -> torch.Tensor:
    """all_gather(x) along `dim`, every rank's piece in rank order."""
    world = _world(group_name)
    stacked = torch.ops._c10d_functional.all_gather_into_tensor(x.contiguous(), world, group_name)
    stacked = torch.ops._c10d_functional.wait_tensor(stacked)
    return torch.cat(stacked.chunk(world), dim=dim)


def _reduce_scatter(x: torch.Tensor, reduce_op: str, dim: int, group_name: str) -> torch.Tensor:
    """reduce_scatter(x) along `dim`: rank r keeps the r-th chunk of the reduction."""
    world = _world(group_name)
    front = x.movedim(dim, 0).contiguous()
    out = torch.ops._c10d_functional.reduce_scatter_tensor(front, reduce_op, world, group_name)
    return torch.ops._c10d_functional.wait_tensor(out).movedim(0, dim).contiguous()


def _rows_scaled_mm(
    A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor, **kw: Any
) -> torch.Tensor:
    """_scaled_mm over A's leading dims (row-wise scales follow A's rows)."""
    scale = A_scale.flatten(0, -2) if row_wise(A_scale) else A_scale
    flat = torch._scaled_mm(A.flatten(0, -2).contiguous(), B, scale.contiguous(), B_scale, **kw)
    return flat.unflatten(0, A.shape[:-1])


def fused_all_gather_matmul(a: dict[str, Any]) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    A_shard, Bs, dim, name = a["A"], list(a["Bs"]), a["gather_dim"], a["group_name"]
    ops._check_ag_args(A_shard, Bs, dim)
    A = _gather(A_shard, dim, name)
    return (A if a["return_A"] else None), [A @ B for B in Bs]


def fused_all_gather_scaled_matmul(a: dict[str, Any]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    A_shard, Bs, dim, name = a["A"], list(a["Bs"]), a["gather_dim"], a["group_name"]
    per_b = ("B_scales", "biases", "result_scales", "out_dtypes", "use_fast_accum")
    ops._check_ag_args(A_shard, Bs, dim)
    for key in per_b:
        if len(a[key]) != len(Bs):
            raise ValueError(f"len({key}) must be the same as len(Bs)")
    if dim == A_shard.dim() - 1:
        raise NotImplementedError(
            "dt-symm-mem: fused_all_gather_scaled_matmul along the last dim is not supported "
            "(torch does not support it either: row-wise scales do not split along K)"
        )
    scales = [a["A_scale"], *a["B_scales"]]
    ops._check_scaled_inputs("fused_all_gather_scaled_matmul", A_shard, Bs, scales)
    A = _gather(A_shard, dim, name)
    A_scale = a["A_scale"]
    if ops._scale_mode(A_shard, A_scale, dim, _world(name)) == "row-sharded":
        A_scale = _gather(A_scale, dim, name)
    outs = [
        _rows_scaled_mm(
            A, B, A_scale, B_scale, bias=bias, scale_result=result_scale,
            out_dtype=ops._as_dtype(out_dtype), use_fast_accum=fast,
        )
        for B, B_scale, bias, result_scale, out_dtype, fast in zip(
            Bs, *(a[key] for key in per_b), strict=True
        )
    ]  # fmt: skip
    return A, outs


def fused_matmul_reduce_scatter(a: dict[str, Any]) -> torch.Tensor:
    A, B, op, dim, name = a["A"], a["B"], a["reduce_op"], a["scatter_dim"], a["group_name"]
    ops._check_rs_args(A, B, dim, "Invalid gather_dim")
    ops._check_reduce_op(op)
    ops._check_rs_divisible(A, B, dim, _world(name))
    return _reduce_scatter(A @ B, op, dim, name)


def fused_matmuls_reduce_scatter(a: dict[str, Any]) -> torch.Tensor:
    As, Bs, op, dim, name = a["As"], a["Bs"], a["reduce_op"], a["scatter_dim"], a["group_name"]
    ops._check_summed_terms(As, Bs, dim)
    ops._check_reduce_op(op)
    ops._check_rs_divisible(As[0], Bs[0], dim, _world(name))
    total = As[0] @ Bs[0]
    for A, B in zip(As[1:], Bs[1:], strict=True):
        total = total + A @ B
    return _reduce_scatter(total, op, dim, name)


def fused_scaled_matmul_reduce_scatter(a: dict[str, Any]) -> torch.Tensor:
    A, B, op, name = a["A"], a["B"], a["reduce_op"], a["group_name"]
    dim, after = a["orig_scatter_dim"], a["scatter_dim_after_maybe_reshape"]
    ops._check_rs_args(A, B, after, "Invalid scatter dim for 2D tensor input to scaled_mm")
    shape = [int(s) for s in (a["output_shape"] or [*A.shape[:-1], B.shape[1]])]
    if dim < 0 or dim >= len(shape):
        raise ValueError("Invalid scatter dim for 3D+ output tensor")
    ops._check_reduce_op(op)
    scales = [a["A_scale"], a["B_scale"]]
    ops._check_scaled_inputs("fused_scaled_matmul_reduce_scatter", A, [B], scales)
    ops._check_divisible(shape[dim], _world(name), f"output_shape[{dim}]")
    full = _rows_scaled_mm(
        A, B, a["A_scale"], a["B_scale"], bias=a["bias"], scale_result=a["result_scale"],
        out_dtype=ops._as_dtype(a["out_dtype"]), use_fast_accum=a["use_fast_accum"],
    ).reshape(shape)  # fmt: skip
    return _reduce_scatter(full, op, dim, name)


def low_contention_all_gather(a: dict[str, Any]) -> torch.Tensor:
    return _gather(a["tensor"], 0, a["group_name"])


def low_contention_reduce_scatter(a: dict[str, Any]) -> torch.Tensor:
    x, op, name = a["tensor"], a["reduce_op"], a["group_name"]
    ops._check_reduce_op(op)
    ops._check_divisible(x.shape[0], _world(name), "tensor.shape[0]")
    return _reduce_scatter(x, op, 0, name)


RULES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "fused_all_gather_matmul": fused_all_gather_matmul,
    "fused_all_gather_scaled_matmul": fused_all_gather_scaled_matmul,
    "fused_matmul_reduce_scatter": fused_matmul_reduce_scatter,
    "fused_scaled_matmul_reduce_scatter": fused_scaled_matmul_reduce_scatter,
    "fused_matmuls_reduce_scatter": fused_matmuls_reduce_scatter,  # dt_symm_mem's own
    "_low_contention_all_gather": low_contention_all_gather,
    "_low_contention_reduce_scatter": low_contention_reduce_scatter,
}


def dispatch_rule(mode: Any, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
    """LocalTensorMode's rule for every op in RULES (torch.library.register_torch_dispatch)."""
    ops.counters.add(f"simulated.{func._schema.name.split('::')[-1]}")
    return RULES[func._schema.name.split("::")[-1]](bind_arguments(func, args, kwargs))
