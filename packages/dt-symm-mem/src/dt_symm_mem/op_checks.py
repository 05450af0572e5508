"""What every implementation of the fused ops checks alike: torch's argument checks (in
its order and its words), the row-major strides of torch's Meta kernels, group names and
dtypes as the ops receive them. The CPU kernels (`all_gather_matmul`,
`matmul_reduce_scatter`, `ops`), the simulated ones (`simulated`) and the fake kernel of
the summed op (`library`) share them, so all refuse a call the same way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dt_symm_mem import compat

REDUCE_OPS = ("sum", "avg")


def resolve_group(group: Any) -> Any:
    """A ProcessGroup from a group name (what the ops receive) or a ProcessGroup."""
    if isinstance(group, str):
        return compat.resolve_process_group(group)
    return group


def _check_reduce_op(reduce_op: str) -> None:
    if reduce_op not in REDUCE_OPS:
        raise ValueError(f"reduce_op must be sum or avg, got {reduce_op!r}")


def _standard_contiguous(t: torch.Tensor) -> torch.Tensor:
    """`t` with the row-major strides torch's Meta kernels report, size-1 dims included
    (`.contiguous()` keeps odd strides on size-1 dims; Inductor compares them)."""
    strides, step = [], 1
    for size in reversed(t.shape):
        strides.append(step)
        step *= max(size, 1)
    if t.stride() == tuple(reversed(strides)):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _check_divisible(size: int, world: int, what: str) -> None:
    if size % world:
        raise ValueError(f"{what} ({size}) must be divisible by the group size ({world})")


def _check_rs_divisible(A: torch.Tensor, B: torch.Tensor, scatter_dim: int, world: int) -> None:
    """The product `A @ B` splits evenly along `scatter_dim`: B's columns for the last
    dim, A's `scatter_dim` otherwise (every term of a sum has the same shape)."""
    if scatter_dim == A.dim() - 1:
        _check_divisible(B.shape[1], world, "B.shape[1]")
    else:
        _check_divisible(A.shape[scatter_dim], world, f"A.shape[{scatter_dim}]")


def _check_ag_args(A_shard: torch.Tensor, Bs: list[torch.Tensor], gather_dim: int) -> None:
    if A_shard.dim() < 2:
        raise ValueError("A_shard must be a matrix")
    for B in Bs:
        if B.dim() != 2:
            raise ValueError("B must be a matrix")
    if gather_dim < 0 or gather_dim >= A_shard.dim():
        raise ValueError("Invalid gather_dim")


def _check_rs_args(A: torch.Tensor, B: torch.Tensor, scatter_dim: int, bad_dim: str) -> None:
    """torch's checks of the matmul-reduce-scatters' operands, in its order and words."""
    if A.dim() < 2:
        raise ValueError("A_shard must be a matrix")
    if scatter_dim < 0 or scatter_dim >= A.dim():
        raise ValueError(bad_dim)
    if B.dim() != 2:
        raise ValueError("B must be a matrix")


def _float8_dtypes() -> set[torch.dtype]:
    names = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    return {getattr(torch, n) for n in names if hasattr(torch, n)}


def _check_scaled_inputs(
    op: str, A: torch.Tensor, Bs: list[torch.Tensor], scales: list[torch.Tensor]
) -> None:
    """torch's CPU _scaled_mm takes float8 operands only, and row-wise scales only from
    torch 2.12 on: say so instead of failing deep."""
    fp8 = _float8_dtypes()
    bad = sorted({str(t.dtype) for t in [A, *Bs] if t.dtype not in fp8})
    if bad:
        raise NotImplementedError(
            f"dt-symm-mem: {op} on CPU needs float8 A and B (torch's CPU _scaled_mm supports "
            f"only float8 operands with tensor-wise or row-wise float32 scales); got {bad}"
        )
    if any(row_wise(s) for s in scales) and not compat.cpu_scaled_mm_takes_row_scales():
        raise NotImplementedError(
            f"dt-symm-mem: {op} on CPU with row-wise scales needs row-wise scaling in "
            f"torch's CPU _scaled_mm, which torch {torch.__version__} lacks (it takes "
            "tensor-wise scales only; torch 2.12 and later take both)"
        )


def _as_dtype(value: Any) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    return compat.scalar_types_to_dtypes([value])[0]


def row_wise(scale: torch.Tensor) -> bool:
    """Whether a float8 scale is one per row: one scale is tensor-wise, as torch reads it
    (a one-row row-wise scale too); any other count is row-wise, none (an empty shard's)
    included."""
    return scale.numel() != 1


def _scale_mode(shard: torch.Tensor, scale: torch.Tensor, gather_dim: int, world: int) -> str:
    """Same classification as torch: row-wise sharded wins when ambiguous."""
    full = list(shard.shape)
    full[gather_dim] *= world
    if scale.shape[:-1] == shard.shape[:-1] and scale.shape[-1] == 1:
        return "row-sharded"
    if scale.numel() == 1:
        return "tensor"
    if list(scale.shape[:-1]) == full[:-1]:
        return "row-replicated"
    raise ValueError(
        f"Invalid scale shape for fp8 all-gather (shard shape: {shard.shape}, "
        f"scale shape: {scale.shape})"
    )


def _check_summed_terms(
    As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor], scatter_dim: int
) -> None:
    """Every term `As[i] @ Bs[i]` valid on its own and of one shape and dtype."""
    if not As or len(As) != len(Bs):
        raise ValueError(f"As and Bs must be of one non-zero length, got {len(As)}, {len(Bs)}")
    for A, B in zip(As, Bs, strict=True):
        _check_rs_args(A, B, scatter_dim, "Invalid scatter_dim")
        if A.shape[:-1] != As[0].shape[:-1] or B.shape[1] != Bs[0].shape[1]:
            raise ValueError("every term A @ B must have the same shape")
        if A.dtype != As[0].dtype or B.dtype != As[0].dtype:
            raise ValueError("every A and B must have one dtype")
