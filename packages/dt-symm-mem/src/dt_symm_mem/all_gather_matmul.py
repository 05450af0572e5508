"""CPU kernels of torch's all-gather + matmul fused ops (`symm_mem::fused_all_gather_matmul`
and its float8 `_scaled` form): each peer's shard of A is multiplied as it arrives,
through the micro-pipelined all-gather of `algorithms`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from dt_symm_mem.algorithms import all_gather_consume
from dt_symm_mem.counters import counters
from dt_symm_mem.op_checks import (
    _as_dtype,
    _check_ag_args,
    _check_scaled_inputs,
    _scale_mode,
    resolve_group,
)


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

    def unflatten(t: torch.Tensor) -> torch.Tensor:  # the last size given: shards may be empty
        return t.view(*leading, t.shape[-1]).flatten(0, 1).movedim(0, gather_dim)

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
        A = torch.cat(list(A_full.unbind(0)), dim=-1).view(*leading, world * k)
    # explicit sizes, not -1: an empty shard (no rows) has no size to infer
    results = [
        out.to(B.dtype).view(*leading, B.shape[1]) for out, B in zip(outputs, Bs, strict=True)
    ]
    return A, results


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
        if out.numel() == 0:  # a peer without rows: nothing to multiply, on any torch
            return
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
