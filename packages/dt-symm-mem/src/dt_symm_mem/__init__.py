"""dt-symm-mem: symmetric-memory fused collectives that also run on CPU hosts.

The ranks of a process group on one host exchange through a shared-memory workspace;
torch's `symm_mem` fused ops (all-gather + matmul, matmul + reduce-scatter, low-contention
all-gather / reduce-scatter) get CPU kernels, and the same ops are offered as Python
functions that delegate to torch's own symmetric memory for CUDA tensors.
"""

from __future__ import annotations

from dt_core.compat.symm_mem import ensure_symm_mem_ops_defined

from dt_symm_mem.api import (
    fused_all_gather_matmul,
    fused_all_gather_scaled_matmul,
    fused_matmul_reduce_scatter,
    fused_scaled_matmul_reduce_scatter,
    low_contention_all_gather,
    low_contention_reduce_scatter,
)
from dt_symm_mem.workspace import ShmSymmMemory, SymmMemTimeoutError, get_workspace

ensure_symm_mem_ops_defined()  # `import dt_symm_mem` makes torch.ops.symm_mem.* exist

__all__ = [
    "ShmSymmMemory",
    "SymmMemTimeoutError",
    "fused_all_gather_matmul",
    "fused_all_gather_scaled_matmul",
    "fused_matmul_reduce_scatter",
    "fused_scaled_matmul_reduce_scatter",
    "get_workspace",
    "low_contention_all_gather",
    "low_contention_reduce_scatter",
]
