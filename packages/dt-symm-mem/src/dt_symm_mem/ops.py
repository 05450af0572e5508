"""CPU kernels of torch's `symm_mem` fused ops, with torch's signatures and semantics.

Each kernel reshapes exactly as torch's CUDA implementation does (gather/scatter dim moved
to the front and flattened to a matrix), so outputs have the sizes and strides of torch's
Meta kernels (Inductor asserts them), and runs the micro-pipelined exchange of
`algorithms` over the group's shared-memory workspace.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from dt_symm_mem import compat
from dt_symm_mem.algorithms import all_gather_consume, all_gather_into, produce_reduce_scatter
from dt_symm_mem.counters import counters  # how often each kernel ran (tests read ops.counters)

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


# --- all-gather + matmul ----------------------------------------------------------------


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


def _all_gather_mm_rows(
    group: Any,
    A_shard: torch.Tensor,
    n_out: list[int],
    out_dtypes: list[torch.dtype],
    gather_dim: int,
    return_A: bool,
    mm: Callable[[int, torch.Tensor, list[torch.Tensor], int, torch.Tensor], object],
    extra_shards: Sequence[torch.Tensor] = (),
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """Gather along a non-last dim: rank r's rows of A (gather dim first, flattened)
    are consumed into rows r of each output as they arrive."""
    world = group.size()
    moved = A_shard.movedim(gather_dim, 0)
    leading = [world, *moved.shape[:-1]]
    A_flat = moved.flatten(0, -2).contiguous()
    m = A_flat.shape[0]
    outputs = [
        torch.empty((world * m, n), dtype=dt) for n, dt in zip(n_out, out_dtypes, strict=False)
    ]
    A_full = torch.empty((world, *A_flat.shape), dtype=A_flat.dtype) if return_A else None

    def consume(pieces: list[torch.Tensor], src: int) -> None:
        for i, out in enumerate(outputs):
            mm(i, pieces[0], pieces[1:], src, out[src * m : (src + 1) * m])

    outs = [A_full] + [None] * len(extra_shards)
    all_gather_consume(group, [A_flat, *extra_shards], consume, outs)

    def unflatten(t: torch.Tensor) -> torch.Tensor:
        return t.view(*leading, -1).flatten(0, 1).movedim(0, gather_dim)

    A = unflatten(A_full.flatten(0, 1)) if A_full is not None else None
    return A, [unflatten(out) for out in outputs]


def fused_all_gather_matmul(
    A_shard: torch.Tensor,
    Bs: list[torch.Tensor],
    gather_dim: int,
    group_name: Any,
    *,
    return_A: bool = True,
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """`all_gather(A_shard, gather_dim) @ B` for each B; returns (A or None, [A @ B...])."""
    counters.add("fused_all_gather_matmul")
    _check_ag_args(A_shard, Bs, gather_dim)
    group = resolve_group(group_name)
    if gather_dim == A_shard.dim() - 1:
        return _all_gather_matmul_last_dim(group, A_shard, Bs, return_A)

    def mm(i: int, a: torch.Tensor, _extra: list[torch.Tensor], _src: int, out: torch.Tensor):
        torch.mm(a, Bs[i], out=out)

    return _all_gather_mm_rows(
        group, A_shard, [B.shape[1] for B in Bs], [B.dtype for B in Bs], gather_dim, return_A, mm
    )


def _all_gather_matmul_last_dim(
    group: Any, A_shard: torch.Tensor, Bs: list[torch.Tensor], return_A: bool
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """Gather along K: rank r's columns multiply rows r of each B, accumulated."""
    world = group.size()
    leading = list(A_shard.shape[:-1])
    A_flat = A_shard.flatten(0, -2).contiguous()
    k = A_flat.shape[1]
    for B in Bs:
        if B.shape[0] != world * k:
            raise ValueError(f"B has {B.shape[0]} rows; the gathered A has {world * k} columns")
    # Partial products are summed over ranks: in half precision accumulate in float32
    # and round once at the end, as one big matmul would (torch's CUDA path rounds every
    # partial sum, which can miss the plain matmul's tolerance).
    acc_dtypes = [
        torch.float32 if B.dtype in (torch.bfloat16, torch.float16) else B.dtype for B in Bs
    ]
    B_rows = [B.to(acc).chunk(world) for B, acc in zip(Bs, acc_dtypes, strict=True)]
    outputs = [
        torch.empty((A_flat.shape[0], B.shape[1]), dtype=acc)
        for B, acc in zip(Bs, acc_dtypes, strict=True)
    ]
    A_full = torch.empty((world, *A_flat.shape), dtype=A_flat.dtype) if return_A else None
    started = [False]

    def consume(pieces: list[torch.Tensor], src: int) -> None:
        for out, rows in zip(outputs, B_rows, strict=True):
            piece = pieces[0].to(out.dtype)
            if started[0]:
                out.addmm_(piece, rows[src])
            else:
                torch.mm(piece, rows[src], out=out)
        started[0] = True

    all_gather_consume(group, [A_flat], consume, [A_full])
    A = None
    if A_full is not None:
        A = torch.cat(list(A_full.unbind(0)), dim=-1).view(*leading, -1)
    results = [out.to(B.dtype).view(*leading, -1) for out, B in zip(outputs, Bs, strict=True)]
    return A, results


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
    if any(s.numel() > 1 for s in scales) and not compat.cpu_scaled_mm_takes_row_scales():
        raise NotImplementedError(
            f"dt-symm-mem: {op} on CPU with row-wise scales needs row-wise scaling in "
            f"torch's CPU _scaled_mm, which torch {torch.__version__} lacks (it takes "
            "tensor-wise scales only; torch 2.12 and later take both)"
        )


def _as_dtype(value: Any) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    return compat.scalar_types_to_dtypes([value])[0]


def fused_all_gather_scaled_matmul(
    A_shard: torch.Tensor,
    Bs: list[torch.Tensor],
    A_scale: torch.Tensor,
    B_scales: list[torch.Tensor],
    gather_dim: int,
    group_name: Any,
    biases: list[torch.Tensor | None],
    result_scales: list[torch.Tensor | None],
    out_dtypes: list[Any],
    use_fast_accum: list[bool],
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """`_scaled_mm(all_gather(A_shard, gather_dim), B, A_scale, B_scale, ...)` for each B.
    A_scale is tensor-wise, row-wise sharded (like A_shard) or row-wise replicated."""
    counters.add("fused_all_gather_scaled_matmul")
    _check_ag_args(A_shard, Bs, gather_dim)
    for name, items in (
        ("B_scales", B_scales),
        ("biases", biases),
        ("result_scales", result_scales),
        ("out_dtypes", out_dtypes),
        ("use_fast_accum", use_fast_accum),
    ):
        if len(items) != len(Bs):
            raise ValueError(f"len({name}) must be the same as len(Bs)")
    if gather_dim == A_shard.dim() - 1:
        raise NotImplementedError(
            "dt-symm-mem: fused_all_gather_scaled_matmul along the last dim is not supported "
            "(torch does not support it either: row-wise scales do not split along K)"
        )
    _check_scaled_inputs("fused_all_gather_scaled_matmul", A_shard, Bs, [A_scale, *B_scales])
    dtypes = [_as_dtype(d) for d in out_dtypes]
    group = resolve_group(group_name)
    world = group.size()
    mode = _scale_mode(A_shard, A_scale, gather_dim, world)
    extra: list[torch.Tensor] = []
    if mode == "row-sharded":
        extra = [A_scale.movedim(gather_dim, 0).flatten(0, -2).contiguous()]
    elif mode == "row-replicated":
        replicated = A_scale.movedim(gather_dim, 0).flatten(0, -2).chunk(world)

    def mm(i: int, a: torch.Tensor, more: list[torch.Tensor], src: int, out: torch.Tensor):
        if mode == "row-sharded":
            scale = more[0].contiguous()
        elif mode == "row-replicated":
            scale = replicated[src].contiguous()
        else:
            scale = A_scale
        res = torch._scaled_mm(
            a,
            Bs[i],
            scale,
            B_scales[i],
            biases[i],
            result_scales[i],
            out_dtype=dtypes[i],
            use_fast_accum=use_fast_accum[i],
        )
        out.copy_(res)

    res_dtypes = [d or B.dtype for d, B in zip(dtypes, Bs, strict=False)]
    A, outs = _all_gather_mm_rows(
        group, A_shard, [B.shape[1] for B in Bs], res_dtypes, gather_dim, True, mm, extra
    )
    if A is None:
        raise RuntimeError("dt-symm-mem: internal error, the gathered A is missing")
    return A, outs


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


# --- matmul + reduce-scatter ------------------------------------------------------------


def fused_matmul_reduce_scatter(
    A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int, group_name: Any
) -> torch.Tensor:
    """`reduce_scatter(A @ B, reduce_op, scatter_dim)`: each destination's chunk is
    produced straight into shared memory while peers pull the previous one."""
    counters.add("fused_matmul_reduce_scatter")
    _check_rs_args(A, B, scatter_dim, "Invalid gather_dim")
    _check_reduce_op(reduce_op)
    return _matmuls_reduce_scatter([A], [B], reduce_op, scatter_dim, group_name)


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
    return _matmuls_reduce_scatter(list(As), list(Bs), reduce_op, scatter_dim, group_name)


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


Pieces = Callable[[int], list[tuple[torch.Tensor, torch.Tensor]]]


def _matmuls_reduce_scatter(
    As: list[torch.Tensor],
    Bs: list[torch.Tensor],
    reduce_op: str,
    scatter_dim: int,
    group_name: Any,
) -> torch.Tensor:
    """The summed products' reduce-scatter; argument checks are the callers'."""
    group = resolve_group(group_name)
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
        return _standard_contiguous(reduced.view(*A.shape[:-1], -1))
    x = A.movedim(scatter_dim, 0)
    leading = [world, *x.shape[:-1]]
    leading[1] //= world
    row_chunks = [a.movedim(scatter_dim, 0).flatten(0, -2).chunk(world) for a in As]

    def row_pieces(dest: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(rows[dest], b) for rows, b in zip(row_chunks, Bs, strict=True)]

    chunk = (row_chunks[0][0].shape[0], B.shape[1])
    producer = _summed_products(row_pieces, chunk, A.dtype)
    reduced = produce_reduce_scatter(group, chunk, A.dtype, producer, reduce_op)
    return _standard_contiguous(reduced.view(*leading[1:], -1).movedim(0, scatter_dim))


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
    rowwise = A_scale.numel() > 1

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
            b_s = B_scales[dest].contiguous()
            out.copy_(scaled_mm(A_rows, B_cols[dest], a_scale, b_s, biases[dest]))

        chunk = (A_rows.shape[0], B.shape[1] // world)
        reduced = produce_reduce_scatter(group, chunk, dtype or A.dtype, produce_cols, reduce_op)
        return _standard_contiguous(reduced.view(*lead, -1))
    _check_divisible(lead[dim], world, f"output_shape[{dim}]")
    x = A.reshape(*lead, k).movedim(dim, 0)
    rows = x.flatten(0, -2).chunk(world)
    if rowwise:
        scales = list(A_scale.reshape(*lead, 1).movedim(dim, 0).flatten(0, -2).chunk(world))
    else:
        scales = [A_scale] * world

    def produce(dest: int, out: torch.Tensor) -> None:
        out.copy_(scaled_mm(rows[dest], B, scales[dest], B_scale, bias))

    chunk = (rows[0].shape[0], B.shape[1])
    reduced = produce_reduce_scatter(group, chunk, dtype or A.dtype, produce, reduce_op)
    leading = [*x.shape[:-1]]
    leading[0] //= world
    return _standard_contiguous(reduced.view(*leading, -1).movedim(0, dim))


# --- low-contention collectives ---------------------------------------------------------


def low_contention_all_gather(
    tensor: torch.Tensor, group_name: Any, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """all-gather along dim 0 through shared memory (pull, ring order). `out` (shape
    (world * tensor.shape[0], ...), contiguous) avoids allocating the result."""
    counters.add("low_contention_all_gather")
    group = resolve_group(group_name)
    world = group.size()
    shape = (world * tensor.shape[0], *tensor.shape[1:])
    if out is None:
        out = torch.empty(shape, dtype=tensor.dtype)
    elif tuple(out.shape) != shape or not out.is_contiguous() or out.dtype != tensor.dtype:
        raise ValueError(f"out must be a contiguous {tensor.dtype} tensor of shape {shape}")
    all_gather_into(group, tensor.contiguous(), out)
    return out


def low_contention_reduce_scatter(
    tensor: torch.Tensor, reduce_op: str, group_name: Any
) -> torch.Tensor:
    """reduce-scatter along dim 0 (sum or avg): all-to-all of chunks, then one reduction."""
    counters.add("low_contention_reduce_scatter")
    _check_reduce_op(reduce_op)
    group = resolve_group(group_name)
    world = group.size()
    _check_divisible(tensor.shape[0], world, "tensor.shape[0]")
    chunks = tensor.chunk(world)

    def produce(dest: int, out: torch.Tensor) -> None:
        out.copy_(chunks[dest])

    reduced = produce_reduce_scatter(group, chunks[0].shape, tensor.dtype, produce, reduce_op)
    return _standard_contiguous(reduced)
