"""Private torch APIs that dt-symm-mem needs: symmetric memory and the micro-pipeline TP
matchers (dt-symm-mem's own compat area, on dt-core's shared version check). Checked
against torch 2.11.x to 2.15.x (`CHECKED_WITH_TORCH`).

Interface (plain functions):
    resolve_process_group(group_name) -> ProcessGroup
    group_name_of(group) -> str
    ensure_symm_mem_ops_defined()          imports torch's module that defines symm_mem::*
    ensure_fused_ops_resolvable()          the same, only where the ops do not resolve yet
    torch_symm_mem_module() -> module       torch.distributed._symmetric_memory
    find_all_gather_matches(graph) / find_reduce_scatter_matches(graph)
    fuse_all_gather_match(match, accept) / fuse_reduce_scatter_match(match, accept)
    match_tensor(node) -> the example tensor of an FX node ("val" meta)
    all_gather_match_parts(match) / reduce_scatter_match_parts(match) -> (node, group name)
    reduce_scatter_match_reduction(match) -> (reduce op, scatter dim)
    reduce_scatter_match_start(match) -> the reduce-scatter node
    replace_reduce_scatter_match(match, new_node)
    scalar_types_to_dtypes(values)
    has_kernel(qualified_name, dispatch_key) -> bool
    tracing_modes_active() -> bool          a torch function or dispatch mode is active
    op_arguments(op_name) -> [(name, keyword_only, has_default)] of symm_mem::<op_name>
    cpu_scaled_mm_takes_row_scales() -> bool  torch 2.11's CPU _scaled_mm: tensor-wise only
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from typing import Any

from dt_core.compat import ensure_supported_torch
from dt_core.compat.process_groups import resolve_process_group  # noqa: F401 - part of this area's interface

CHECKED_WITH_TORCH = ">=2.11.0,<2.16"


def group_name_of(group: Any) -> str:
    """The registered name of `group` (public `ProcessGroup.group_name`)."""
    return group.group_name


def has_kernel(qualified_name: str, dispatch_key: str) -> bool:
    """Whether op `ns::name` has a kernel registered for `dispatch_key` (e.g. "CPU")."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch

    if not torch._C._dispatch_has_kernel(qualified_name):
        return False
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualified_name, dispatch_key)


def tracing_modes_active() -> bool:
    """Whether a TorchFunctionMode or TorchDispatchMode (make_fx's proxy mode, fake
    tensors, FLOP counters...) is active: such calls must reach ops, not their kernels."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch

    return torch._C._is_torch_function_mode_enabled() or torch._C._len_torch_dispatch_stack() > 0


def op_arguments(op_name: str) -> list[tuple[str, bool, bool]]:
    """(name, keyword-only, has a default) of each argument of `symm_mem::<op_name>`, from
    the op's registered schema (tests bind recorded calls to it)."""
    ensure_symm_mem_ops_defined()
    import torch

    schema = getattr(torch.ops.symm_mem, op_name).default._schema
    return [(a.name, a.kwarg_only, a.has_default_value()) for a in schema.arguments]


def torch_symm_mem_module() -> Any:
    """torch.distributed._symmetric_memory: importing it defines the symm_mem::* ops."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch.distributed._symmetric_memory as symm_mem

    return symm_mem


def ensure_symm_mem_ops_defined() -> None:
    """torch defines `symm_mem::fused_*` in Python; make sure that module ran."""
    torch_symm_mem_module()


def ensure_fused_ops_resolvable() -> None:
    """`torch.ops.symm_mem.fused_all_gather_matmul` resolves: on torch releases that
    register the ops in C++ it already does, elsewhere torch's Python module defines them
    (and dt-core then installs this plugin's CPU kernels on them)."""
    import torch

    if not hasattr(torch.ops.symm_mem, "fused_all_gather_matmul"):
        ensure_symm_mem_ops_defined()


# --- Inductor: torch's micro-pipeline TP matchers, reused for CPU groups ----------------


def _micro_pipeline_tp() -> Any:
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch._inductor.fx_passes.micro_pipeline_tp as mptp

    return mptp


def find_all_gather_matches(graph: Any) -> list[Any]:
    """all_gather_into_tensor + wait (+ split/cat for other gather dims) matches."""
    return list(_micro_pipeline_tp().find_all_gather_patterns(graph))


def find_reduce_scatter_matches(graph: Any) -> list[Any]:
    """(chunk/cat +) reduce_scatter_tensor + wait matches."""
    return list(_micro_pipeline_tp().find_reduce_scatter_patterns(graph))


def match_tensor(node: Any) -> Any:
    """The fake/example tensor Inductor recorded for `node`."""
    return _micro_pipeline_tp()._get_tensor(node)


@contextlib.contextmanager
def _fusion_enabled_for(group_name: str) -> Iterator[None]:
    """torch's fusion functions bail out unless NCCL is built and symm-mem is enabled for
    the group; for a CPU group we vouch for both while the rewrite of ONE match runs
    (graph rewriting only; nothing is executed). Restored on exit."""
    import torch
    import torch.distributed as dist

    symm_mem = torch_symm_mem_module()
    saved = dist.is_nccl_available
    dist.is_nccl_available = lambda: True
    try:
        with symm_mem._test_mode({group_name}):
            # Checked, not assumed: torch 2.15 narrows `is_symm_mem_enabled_for_group`
            # (an accelerator and a registered backend, pytorch#193115) outside test mode;
            # if a later torch stops honouring test mode too, the fusion is skipped with a
            # warning instead of silently.
            if not symm_mem.is_symm_mem_enabled_for_group(group_name):
                warnings.warn(
                    f"dt-symm-mem: torch {torch.__version__} does not enable symmetric memory "
                    f"for group {group_name!r} in its test mode; matmul fusion skipped",
                    RuntimeWarning,
                    stacklevel=3,
                )
            yield
    finally:
        dist.is_nccl_available = saved


def fuse_all_gather_match(match: Any) -> None:
    """Rewrite one all-gather match into symm_mem::fused_all_gather_matmul (if it feeds mms)."""
    with _fusion_enabled_for(match.group_name):
        _micro_pipeline_tp().fuse_all_gather_matmul(match)


def fuse_reduce_scatter_match(match: Any) -> None:
    """Rewrite one reduce-scatter match into symm_mem::fused_matmul_reduce_scatter."""
    with _fusion_enabled_for(match.group_name):
        _micro_pipeline_tp().fuse_matmul_reduce_scatter(match)


def all_gather_match_parts(match: Any) -> tuple[Any, str]:
    """(shard node, group name) of an all-gather match."""
    return match.shard_node, match.group_name


def reduce_scatter_match_parts(match: Any) -> tuple[Any, str]:
    """(input node, group name) of a reduce-scatter match."""
    return match.input_node, match.group_name


def reduce_scatter_match_reduction(match: Any) -> tuple[str, int]:
    """(reduce op, scatter dim of the reduce-scatter's input) of a reduce-scatter match."""
    return match.reduce_op, match.scatter_dim


def reduce_scatter_match_start(match: Any) -> Any:
    """The reduce-scatter node of a match: a replacement goes right before it."""
    return match.reduce_scatter_node


def replace_reduce_scatter_match(match: Any, new_node: Any) -> None:
    """Use `new_node` wherever the match's result was used (a saved-for-backward output
    included, as torch's own fusion does) and erase the match's nodes."""
    match.replace_with(new_node)
    match.erase()


def scalar_types_to_dtypes(values: list[Any]) -> list[Any]:
    """ScalarType[] arguments may arrive as enum ints through the dispatcher: dtypes."""
    return torch_symm_mem_module()._maybe_convert_scalar_types_to_dtypes(list(values))


@functools.cache
def cpu_scaled_mm_takes_row_scales() -> bool:
    """Whether this torch's CPU `_scaled_mm` takes row-wise scales (2.12 on), asked once
    with a 16 x 16 float8 product; torch 2.11 takes tensor-wise scales only and fails an
    internal assert on row-wise ones."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch

    a = torch.ones(16, 16).to(torch.float8_e4m3fn)
    b = torch.ones(16, 16).to(torch.float8_e4m3fn).t().contiguous().t()
    try:
        torch._scaled_mm(a, b, torch.ones(16, 1), torch.ones(1, 16), out_dtype=torch.bfloat16)
    except RuntimeError:
        return False
    return True
