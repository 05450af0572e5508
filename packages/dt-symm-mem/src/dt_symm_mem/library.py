"""The op dt-symm-mem defines itself: `dt_symm_mem::fused_matmuls_reduce_scatter`.

torch's `symm_mem` namespace has a fused reduce-scatter of ONE matmul; a sum of matmuls
before a reduce-scatter (SwiGLU's w1 + w3 and attention's q + k + v input gradients) needs
its own op so the CPU kernel can accumulate the products chunk by chunk instead of joining
the operands first (see `summed_matmuls`). dt-core installs it (`LibraryOps`) and takes
it out again on deactivate; its fake kernel lets Inductor's graphs carry it.
"""

from __future__ import annotations

from typing import Any

NAMESPACE = "dt_symm_mem"
NAME = "fused_matmuls_reduce_scatter"
QUALIFIED_NAME = f"{NAMESPACE}::{NAME}"
SCHEMA = "(Tensor[] As, Tensor[] Bs, str reduce_op, int scatter_dim, str group_name) -> Tensor"


def define(lib: Any) -> None:
    """Define the op on `lib` (a torch.library.Library dt-core owns): CPU kernel, fake."""
    import torch

    lib.define(NAME + SCHEMA)
    lib.impl(NAME, _cpu_kernel, "CPU")
    torch.library.register_fake(QUALIFIED_NAME, _fake, lib=lib)


def _cpu_kernel(As: Any, Bs: Any, reduce_op: str, scatter_dim: int, group_name: str) -> Any:
    from dt_symm_mem import ops

    return ops.fused_matmuls_reduce_scatter(As, Bs, reduce_op, scatter_dim, group_name)


def _fake(As: Any, Bs: Any, reduce_op: str, scatter_dim: int, group_name: str) -> Any:
    """The kernel's output: the summed product's shape, `scatter_dim` divided by the group."""
    from dt_symm_mem import compat, ops

    ops._check_summed_terms(As, Bs, scatter_dim)
    ops._check_reduce_op(reduce_op)
    world = int(compat.resolve_process_group(group_name).size())
    ops._check_rs_divisible(As[0], Bs[0], scatter_dim, world)
    shape = [*As[0].shape[:-1], Bs[0].shape[1]]
    shape[scatter_dim] //= world
    return As[0].new_empty(shape)
