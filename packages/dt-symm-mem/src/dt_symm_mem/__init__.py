"""dt-symm-mem: symmetric-memory fused collectives that also run on CPU hosts.

The ranks of a process group on one host exchange through a shared-memory workspace;
torch's `symm_mem` fused ops (all-gather + matmul, matmul + reduce-scatter, low-contention
all-gather / reduce-scatter) get CPU kernels, and the same ops are offered as Python
functions that delegate to torch's own symmetric memory for CUDA tensors.
"""

from __future__ import annotations

from dt_core.lazy import lazy_exports

__version__ = "0.1.0"

# The public names load on first use: dt-core imports `dt_symm_mem.plugin` (and so this
# package) during `import torch`, and `api` pulls in torch.compiler machinery (~1.4 s).
# Nothing here imports torch.distributed._symmetric_memory (~30 ms): as in torch, the
# `torch.ops.symm_mem.*` ops exist once it is imported, and `api` imports it.
_LAZY = {
    "fused_all_gather_matmul": "api",
    "fused_all_gather_scaled_matmul": "api",
    "fused_matmul_reduce_scatter": "api",
    "fused_scaled_matmul_reduce_scatter": "api",
    "low_contention_all_gather": "api",
    "low_contention_reduce_scatter": "api",
    "ShmSymmMemory": "handle",
    "SymmMemTimeoutError": "handle",
    "get_workspace": "workspace",
}


__getattr__ = lazy_exports(__name__, _LAZY)


def __dir__() -> list[str]:
    """The lazy names too, so `dir()`, completion and the API reference see them."""
    return sorted({*globals(), *_LAZY})


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
