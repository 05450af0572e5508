"""CPU kernels of torch's `symm_mem` fused ops, with torch's signatures and semantics: the
functions torch's ops dispatch to (`plugin.KERNELS`) and `api` calls directly.

Each kernel reshapes exactly as torch's CUDA implementation does (gather/scatter dim moved
to the front and flattened to a matrix), so outputs have the sizes and strides of torch's
Meta kernels (Inductor asserts them), and runs the micro-pipelined exchange of
`algorithms` over the group's shared-memory workspace. The fused matmuls live in
`all_gather_matmul` and `matmul_reduce_scatter`, the argument checks in `op_checks`; the
low-contention collectives are here.
"""

from __future__ import annotations

from typing import Any

import torch

from dt_symm_mem.algorithms import all_gather_into, produce_reduce_scatter
from dt_symm_mem.all_gather_matmul import fused_all_gather_matmul, fused_all_gather_scaled_matmul
from dt_symm_mem.counters import counters  # how often each kernel ran (tests read ops.counters)
from dt_symm_mem.matmul_reduce_scatter import (
    fused_matmul_reduce_scatter,
    fused_matmuls_reduce_scatter,
    fused_scaled_matmul_reduce_scatter,
)
from dt_symm_mem.op_checks import (
    REDUCE_OPS,
    _check_divisible,
    _check_reduce_op,
    _standard_contiguous,
    resolve_group,
)

# The simulated kernels (`simulated`) and the summed op's fake kernel (`library`) run the
# fused kernels' checks through this module.
from dt_symm_mem.op_checks import _as_dtype as _as_dtype
from dt_symm_mem.op_checks import _check_ag_args as _check_ag_args
from dt_symm_mem.op_checks import _check_rs_args as _check_rs_args
from dt_symm_mem.op_checks import _check_rs_divisible as _check_rs_divisible
from dt_symm_mem.op_checks import _check_scaled_inputs as _check_scaled_inputs
from dt_symm_mem.op_checks import _check_summed_terms as _check_summed_terms
from dt_symm_mem.op_checks import _scale_mode as _scale_mode

__all__ = [
    "REDUCE_OPS",
    "counters",
    "fused_all_gather_matmul",
    "fused_all_gather_scaled_matmul",
    "fused_matmul_reduce_scatter",
    "fused_matmuls_reduce_scatter",
    "fused_scaled_matmul_reduce_scatter",
    "low_contention_all_gather",
    "low_contention_reduce_scatter",
    "resolve_group",
]


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
