"""Scaled (float8) variants on CPU against gloo all-gather / reduce-scatter + _scaled_mm.

torch's CPU `_scaled_mm` takes float8 operands with tensor-wise or row-wise float32
scales. Small-integer operands and power-of-two scales make every result exact, so the
comparison is torch.equal, including sizes and strides against torch's Meta kernels.
"""

from __future__ import annotations

import pytest
import torch
from test_symm_ops import gather, ints, reduce_scatter, same

FP8 = torch.float8_e4m3fn


def fp8(shape: tuple, seed: int) -> torch.Tensor:
    return ints(shape, seed).to(FP8)


def torch_takes_row_scales() -> bool:
    """Whether torch's own CPU _scaled_mm takes row-wise scales (torch 2.11 takes
    tensor-wise ones only): where it does not, dt-symm-mem must refuse them by name."""
    a, b = fp8((16, 16), 1), fp8((16, 16), 2).t().contiguous().t()
    try:
        torch._scaled_mm(a, b, torch.ones(16, 1), torch.ones(1, 16), out_dtype=torch.bfloat16)
    except RuntimeError:
        return False
    return True


REFUSED = "with row-wise scales needs row-wise scaling in torch's CPU _scaled_mm"


def refused(call: object) -> str | None:
    """None if `call()` raises dt-symm-mem's error for row-wise scales, else what it did."""
    try:
        call()  # type: ignore[operator]
    except NotImplementedError as error:
        return None if REFUSED in str(error) else f"another error: {error}"
    return "computed where torch's _scaled_mm refuses row-wise scales"


def check_ag_scaled(case: tuple, name: str) -> str | None:
    import torch.distributed as dist

    shape, gather_dim, mode, out_dtype, n_b = case
    rank, world = dist.get_rank(), dist.get_world_size()
    A = fp8(shape, rank)
    Bs = [fp8((shape[-1], 16), 40 + i).t().contiguous().t() for i in range(n_b)]  # col-major
    full_A = gather(A, gather_dim)
    full_rows = full_A.movedim(gather_dim, 0).flatten(0, -2)
    if mode == "tensor":
        A_scale = torch.tensor(0.5)
        full_scale = A_scale
    elif mode == "row-sharded":
        A_scale = torch.full((*shape[:-1], 1), 2.0 ** (rank - 1))
        full_scale = gather(A_scale, gather_dim).movedim(gather_dim, 0).flatten(0, -2)
    else:  # row-replicated: every rank holds the full scales
        full_shape = list(shape[:-1])
        full_shape[gather_dim] *= world
        A_scale = 2.0 ** ints((*full_shape, 1), 5, low=-1).float()
        full_scale = A_scale.movedim(gather_dim, 0).flatten(0, -2)
    B_scales = [torch.full((1, 16), 0.25) if mode != "tensor" else torch.tensor(2.0)] * n_b
    args = (A, Bs, A_scale, B_scales, gather_dim, name, [None] * n_b, [None] * n_b)
    run = lambda: torch.ops.symm_mem.fused_all_gather_scaled_matmul(  # noqa: E731
        *args, [out_dtype] * n_b, [False] * n_b
    )
    if mode != "tensor" and not torch_takes_row_scales():
        problem = refused(run)
        return problem and f"{problem}: {case}"
    got_A, got = run()
    if not same(got_A, full_A):
        return f"A differs: {case}"
    lead = full_A.movedim(gather_dim, 0).shape[:-1]
    for i, B in enumerate(Bs):
        want = (
            torch._scaled_mm(full_rows, B, full_scale, B_scales[i], out_dtype=out_dtype)
            .view(*lead, B.shape[1])
            .movedim(0, gather_dim)
        )
        if not same(got[i], want):
            return f"output {i} differs: {case}"
    return None


def check_rs_scaled(case: tuple, name: str) -> str | None:
    """Reference: torch's Meta semantics, reduce_scatter(C.view(output_shape), dim), through
    torch.ops (with the "after reshape" dim torch's TP pass would pass) and the API."""
    import dt_symm_mem
    import torch.distributed as dist

    shape, out_lead, dim, after, mode, reduce_op = case
    rank = dist.get_rank()
    out_lead = list(out_lead or shape[:-1])
    A = fp8(shape, 10 + rank)
    B = fp8((shape[-1], 8), 77).t().contiguous().t()
    if mode == "tensor":
        A_scale, B_scale = torch.tensor(0.5), torch.tensor(2.0)
    else:
        A_scale = 2.0 ** ints((*shape[:-1], 1), 20 + rank, low=-1).clamp(max=1).float()
        B_scale = torch.full((1, 8), 2.0)
    if mode != "tensor" and not torch_takes_row_scales():
        problem = refused(
            lambda: torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(
                A, B, A_scale, B_scale, reduce_op, dim, after, name, [*out_lead, 8]
            )
        )
        return problem and f"{problem}: {case}"
    flat_scale = A_scale if mode == "tensor" else A_scale.flatten(0, -2)
    full = torch._scaled_mm(
        A.flatten(0, -2), B, flat_scale, B_scale, out_dtype=torch.bfloat16
    ).view(*out_lead, 8)
    want = reduce_scatter(full, reduce_op, dim)
    got = torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(
        A, B, A_scale, B_scale, reduce_op, dim, after, name, [*out_lead, 8],
        out_dtype=torch.bfloat16,
    )  # fmt: skip
    api = dt_symm_mem.fused_scaled_matmul_reduce_scatter(
        A, B, A_scale, B_scale, reduce_op, dim - len(out_lead) - 1, name,
        output_shape=[*out_lead, 8], out_dtype=torch.bfloat16,
    )  # fmt: skip
    if not same(got, want):
        return f"torch.ops differs: {case}"
    return None if same(api, want) else f"API differs: {case}"


def run_scaled_cases() -> None:
    import torch.distributed as dist
    import torch.distributed._symmetric_memory  # noqa: F401  (defines torch.ops.symm_mem.*)

    name = dist.group.WORLD.group_name
    world = dist.get_world_size()
    ag = [
        ((4, 16), 0, "tensor", torch.float32, 1),
        ((4, 16), 0, "row-sharded", torch.bfloat16, 2),
        ((4, 16), 0, "row-replicated", torch.bfloat16, 1),
        ((2, 4, 16), 1, "tensor", torch.bfloat16, 2),
        ((2, 4, 16), 1, "row-sharded", torch.bfloat16, 1),
        ((2, 4, 16), 0, "row-replicated", torch.bfloat16, 1),
        ((0, 16), 0, "tensor", torch.float32, 1),  # empty shards: empty results
        ((2, 0, 16), 1, "row-sharded", torch.bfloat16, 2),
    ]
    w = world
    rs = [  # (A shape, output leading dims, scatter dim, dim after reshape, scales, op)
        ((w * 4, 16), None, 0, 0, "tensor", "sum"),
        ((w * 4, 16), None, 0, 0, "row", "avg"),
        ((2, w * 2, 16), None, 1, 1, "row", "sum"),
        ((2, 3, w * 2, 16), None, 2, 2, "row", "sum"),  # torch's CUDA form is wrong here
        ((2 * w * 2, 16), (2, w * 2), 1, 0, "row", "sum"),  # TP pass: reshape -> mm -> reshape
        ((w * 2 * 3, 16), (w * 2, 3), 0, 0, "tensor", "avg"),
        ((16, 16), None, 1, 1, "row", "sum"),  # along N (square A: a transposed split fits)
        ((0, 16), None, 0, 0, "row", "sum"),  # no rows anywhere: an empty result
        ((2, 0, 16), None, 1, 1, "tensor", "avg"),
    ]
    failures = [f for c in ag if (f := check_ag_scaled(c, name))]
    failures += [f for c in rs if (f := check_rs_scaled(c, name))]
    assert not failures, "\n".join(failures)


@pytest.mark.ranks(2, 4)
def test_scaled_ops() -> None:
    run_scaled_cases()
