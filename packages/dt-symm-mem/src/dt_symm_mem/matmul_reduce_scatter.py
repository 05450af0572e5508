"""CPU kernels of the matmul + reduce-scatter fused ops: torch's
`symm_mem::fused_matmul_reduce_scatter` and its float8 `_scaled` form, and dt-symm-mem's
own sum of matmuls (`library`). Each destination's chunk of the product is computed
straight into shared memory while peers pull the previous one (`algorithms`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from dt_symm_mem.algorithms import produce_reduce_scatter
from dt_symm_mem.counters import counters
from dt_symm_mem.op_checks import (
    _as_dtype,
    _check_divisible,
    _check_reduce_op,
    _check_rs_args,
    _check_rs_divisible,
    _check_scaled_inputs,
    _check_summed_terms,
    _standard_contiguous,
    resolve_group,
    row_wise,
)


def fused_matmul_reduce_scatter(
    A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int, group_name: Any
) -> torch.Tensor:
    """`reduce_scatter(A @ B, reduce_op, scatter_dim)`: each destination's chunk is
    produced straight into shared memory while peers pull the previous one."""
    counters.add("fused_matmul_reduce_scatter")
    _check_rs_args(A, B, scatter_dim, "Invalid gather_dim")
    _check_reduce_op(reduce_op)
    return _matmuls_reduce_scatter(resolve_group(group_name), [A], [B], reduce_op, scatter_dim)


def fused_matmuls_reduce_scatter(
    As: Sequence[torch.Tensor],
    Bs: Sequence[torch.Tensor],
    reduce_op: str,
    scatter_dim: int,
    group_name: Any,
) -> torch.Tensor:
    """`reduce_scatter(As[0] @ Bs[0] + As[1] @ Bs[1] + ..., reduce_op, scatter_dim)`
    without joining the terms: each destination's chunk is the first product with each
    further one added to it in turn (the products and adds of the unfused sum), produced
    straight into shared memory. Joining them first (`cat` of the As) copies every A once
    per call, which cost more on a CPU than the fusion saves."""
    counters.add("fused_matmuls_reduce_scatter")
    _check_summed_terms(As, Bs, scatter_dim)
    _check_reduce_op(reduce_op)
    group = resolve_group(group_name)
    return _matmuls_reduce_scatter(group, list(As), list(Bs), reduce_op, scatter_dim)


Pieces = Callable[[int], list[tuple[torch.Tensor, torch.Tensor]]]


def _matmuls_reduce_scatter(
    group: Any, As: list[torch.Tensor], Bs: list[torch.Tensor], reduce_op: str, scatter_dim: int
) -> torch.Tensor:
    """The summed products' reduce-scatter over `group` (a ProcessGroup, as `algorithms`
    takes it); argument checks are the callers'."""
    world = group.size()
    A, B = As[0], Bs[0]
    _check_rs_divisible(A, B, scatter_dim, world)
    if scatter_dim == A.dim() - 1:
        flats = [a.flatten(0, -2) for a in As]
        columns = [b.chunk(world, dim=1) for b in Bs]

        def column_pieces(dest: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
            return [(a, cols[dest]) for a, cols in zip(flats, columns, strict=True)]

        chunk = (flats[0].shape[0], B.shape[1] // world)
        producer = _summed_products(column_pieces, chunk, A.dtype)
        reduced = produce_reduce_scatter(group, chunk, A.dtype, producer, reduce_op)
        return _standard_contiguous(reduced.view(*A.shape[:-1], reduced.shape[-1]))
    x = A.movedim(scatter_dim, 0)
    leading = [world, *x.shape[:-1]]
    leading[1] //= world
    row_chunks = [a.movedim(scatter_dim, 0).flatten(0, -2).chunk(world) for a in As]

    def row_pieces(dest: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(rows[dest], b) for rows, b in zip(row_chunks, Bs, strict=True)]

    chunk = (row_chunks[0][0].shape[0], B.shape[1])
    producer = _summed_products(row_pieces, chunk, A.dtype)
    reduced = produce_reduce_scatter(group, chunk, A.dtype, producer, reduce_op)
    return _standard_contiguous(
        reduced.view(*leading[1:], reduced.shape[-1]).movedim(0, scatter_dim)
    )


def _summed_products(
    pieces: Pieces, chunk: tuple[int, int], dtype: torch.dtype
) -> Callable[[int, torch.Tensor], None]:
    """A producer writing `sum(a @ b for (a, b) in pieces(dest))` into `out`: the first
    product in place, each further one through one scratch chunk and an add."""
    scratch: list[torch.Tensor] = []

    def produce(dest: int, out: torch.Tensor) -> None:
        (a, b), *rest = pieces(dest)
        torch.mm(a, b, out=out)
        for a, b in rest:
            if not scratch:
                scratch.append(torch.empty(chunk, dtype=dtype))
            torch.mm(a, b, out=scratch[0])
            out.add_(scratch[0])

    return produce


def fused_scaled_matmul_reduce_scatter(
    A: torch.Tensor,
    B: torch.Tensor,
    A_scale: torch.Tensor,
    B_scale: torch.Tensor,
    reduce_op: str,
    orig_scatter_dim: int,
    scatter_dim_after_maybe_reshape: int,
    group_name: Any,
    output_shape: list[int] | None,
    bias: torch.Tensor | None = None,
    result_scale: torch.Tensor | None = None,
    out_dtype: Any = None,
    use_fast_accum: bool = False,
) -> torch.Tensor:
    """`reduce_scatter(_scaled_mm(A.flatten(0, -2), B, ...).view(output_shape), reduce_op,
    orig_scatter_dim)`: the semantics of torch's Meta kernel. A's rows are viewed with
    output_shape's leading dims, so any scatter dim is split correctly (torch 2.13's CUDA
    kernel, which splits A's flattened rows along `scatter_dim_after_maybe_reshape`, is
    right only for dims 0 and 1 without a reshape). Scatter along the last dim chunks B's
    columns (and row-wise B scales, bias)."""
    counters.add("fused_scaled_matmul_reduce_scatter")
    sd = scatter_dim_after_maybe_reshape
    _check_rs_args(A, B, sd, "Invalid scatter dim for 2D tensor input to scaled_mm")
    if output_shape is None:
        output_shape = [*A.shape[:-1], B.shape[1]]
    output_shape = [int(s) for s in output_shape]
    dim = orig_scatter_dim
    if dim < 0 or dim >= len(output_shape):
        raise ValueError("Invalid scatter dim for 3D+ output tensor")
    lead = output_shape[:-1]
    if math.prod(lead) != math.prod(A.shape[:-1]) or output_shape[-1] != B.shape[1]:
        raise ValueError(
            f"output_shape {output_shape} does not match the product of A {tuple(A.shape)} "
            f"and B {tuple(B.shape)}"
        )
    _check_reduce_op(reduce_op)
    _check_scaled_inputs("fused_scaled_matmul_reduce_scatter", A, [B], [A_scale, B_scale])
    if A_scale.numel() > 1 and A_scale.shape[:-1] != A.shape[:-1]:
        raise ValueError(
            "For row-wise scaling, the leading dims of A_scale must match the leading dims "
            f"of A (A shape: {A.shape}, A_scale shape: {A_scale.shape})"
        )
    dtype = _as_dtype(out_dtype)
    group = resolve_group(group_name)
    world = group.size()
    k = A.shape[-1]
    rowwise = row_wise(A_scale)

    def scaled_mm(a: torch.Tensor, b: torch.Tensor, a_s: torch.Tensor, b_s: Any, bias_: Any):
        return torch._scaled_mm(
            a.contiguous(),
            b,
            a_s.contiguous(),
            b_s,
            bias_,
            result_scale,
            out_dtype=dtype,
            use_fast_accum=use_fast_accum,
        )

    if dim == len(output_shape) - 1:
        _check_divisible(B.shape[1], world, "B.shape[1]")
        A_rows = A.flatten(0, -2)
        a_scale = A_scale.flatten(0, -2) if rowwise else A_scale
        B_cols = B.chunk(world, dim=1)
        B_scales = B_scale.chunk(world, dim=-1) if B_scale.numel() > 1 else [B_scale] * world
        biases = bias.chunk(world, dim=-1) if bias is not None else [None] * world

        def produce_cols(dest: int, out: torch.Tensor) -> None:
            if out.numel() == 0:  # no rows: nothing to multiply, on any torch
                return
            b_s = B_scales[dest].contiguous()
            out.copy_(scaled_mm(A_rows, B_cols[dest], a_scale, b_s, biases[dest]))

        chunk = (A_rows.shape[0], B.shape[1] // world)
        reduced = produce_reduce_scatter(group, chunk, dtype or A.dtype, produce_cols, reduce_op)
        return _standard_contiguous(reduced.view(*lead, reduced.shape[-1]))
    _check_divisible(lead[dim], world, f"output_shape[{dim}]")
    x = A.reshape(*lead, k).movedim(dim, 0)
    rows = x.flatten(0, -2).chunk(world)
    if rowwise:
        scales = list(A_scale.reshape(*lead, 1).movedim(dim, 0).flatten(0, -2).chunk(world))
    else:
        scales = [A_scale] * world

    def produce(dest: int, out: torch.Tensor) -> None:
        if out.numel() == 0:  # no rows: nothing to multiply, on any torch
            return
        out.copy_(scaled_mm(rows[dest], B, scales[dest], B_scale, bias))

    chunk = (rows[0].shape[0], B.shape[1])
    reduced = produce_reduce_scatter(group, chunk, dtype or A.dtype, produce, reduce_op)
    leading = [*x.shape[:-1]]
    leading[0] //= world
    return _standard_contiguous(reduced.view(*leading, reduced.shape[-1]).movedim(0, dim))
