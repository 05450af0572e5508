"""Hookimpls of the `symm-mem` plugin.

Light at import: the CPU kernels registered on torch's `symm_mem` namespace are thin
wrappers that import `dt_symm_mem.ops` on first call. torch defines the `symm_mem::fused_*`
ops in Python (torch.distributed._symmetric_memory); the library contribution names that
module (`defined_in`), so dt-core registers the kernels as soon as that module is imported
(by torch's micro-pipeline pass, by `dt_symm_mem`'s functions, or by the user, as torch
itself requires before `torch.ops.symm_mem.*` exist) and `import torch` stays light.
"""

from __future__ import annotations

from typing import Any

from dt_core import GraphPass, LibraryOps, LocalTensorRule, hookimpl

# dt-core hook API this plugin is written for (1.1: LibraryOps.defined_in; 1.2: LocalTensorRule;
# 1.3: DT_SETTINGS)
DT_API = ">=1.3,<2"
DT_SETTINGS = "dt_symm_mem.settings"  # creates the settings store

NAMESPACE = "symm_mem"
DEFINED_IN = "torch.distributed._symmetric_memory"  # its import defines symm_mem::*
# torch op name -> function name in dt_symm_mem.ops
KERNELS = {
    "fused_all_gather_matmul": "fused_all_gather_matmul",
    "fused_all_gather_scaled_matmul": "fused_all_gather_scaled_matmul",
    "fused_matmul_reduce_scatter": "fused_matmul_reduce_scatter",
    "fused_scaled_matmul_reduce_scatter": "fused_scaled_matmul_reduce_scatter",
    "_low_contention_all_gather": "low_contention_all_gather",
    "_low_contention_reduce_scatter": "low_contention_reduce_scatter",
}


def _kernel(function_name: str) -> Any:
    def cpu_kernel(*args: Any, **kwargs: Any) -> Any:
        from dt_symm_mem import ops

        return getattr(ops, function_name)(*args, **kwargs)

    cpu_kernel.__name__ = f"dt_symm_mem_{function_name}_cpu"
    return cpu_kernel


def _define(lib: Any) -> None:
    for op_name, function_name in KERNELS.items():
        lib.impl(op_name, _kernel(function_name), "CPU")


def _define_own(lib: Any) -> None:
    from dt_symm_mem import library

    library.define(lib)


# dt_symm_mem::fused_matmuls_reduce_scatter (dt_symm_mem.library; kept here so that
# listing the plugin imports nothing more)
OWN_NAMESPACE = "dt_symm_mem"
OWN_OPS = ["fused_matmuls_reduce_scatter"]


@hookimpl
def dt_library_ops() -> list[LibraryOps]:
    ops = [f"{NAMESPACE}::{name}@CPU" for name in KERNELS]
    own = [f"{OWN_NAMESPACE}::{name}" for name in OWN_OPS]
    return [
        LibraryOps(NAMESPACE, _define, ops=ops, kind="IMPL", defined_in=DEFINED_IN),
        LibraryOps(OWN_NAMESPACE, _define_own, ops=own),
    ]


def _simulated(mode: Any, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
    from dt_symm_mem.simulated import dispatch_rule

    return dispatch_rule(mode, func, types, args, kwargs)


@hookimpl
def dt_local_tensor_rules() -> list[LocalTensorRule]:
    """Under torch's LocalTensorMode the ops compute every simulated rank's result."""
    rules = [LocalTensorRule(f"{NAMESPACE}::{name}", _simulated) for name in KERNELS]
    return rules + [LocalTensorRule(f"{OWN_NAMESPACE}::{name}", _simulated) for name in OWN_OPS]


def _fuse(graph: Any) -> None:
    from dt_symm_mem.compile_pass import fuse_cpu_collective_matmuls

    fuse_cpu_collective_matmuls(graph)


def _merge_sums(graph: Any) -> None:
    from dt_symm_mem.summed_matmuls import merge_summed_matmuls_before_reduce_scatter

    merge_summed_matmuls_before_reduce_scatter(graph)


def _settings() -> dict[str, Any]:
    from dt_symm_mem.settings import settings

    return {"disabled": not settings.current().compile_pass}


def _merge_settings() -> dict[str, Any]:
    from dt_symm_mem.settings import settings

    current = settings.current()
    return {"disabled": not current.compile_pass, "merge": current.merge_summed_matmuls}


@hookimpl
def dt_graph_passes() -> list[GraphPass]:
    import sys
    from pathlib import Path

    from dt_symm_mem import compat

    # Asked when Inductor is first imported (or by a listing, which must import nothing
    # more). A graph Inductor loads from its cache calls the fused ops without this pass
    # running; where torch defines them in Python only (2.11), they must exist by then.
    if "torch._inductor.config" in sys.modules:
        compat.ensure_fused_ops_resolvable()
    here = Path(__file__).parent
    sources = [str(here / "compile_pass.py")]
    merge_sources = [str(here / "summed_matmuls.py")]
    return [
        # in the stage before the fusion (CPU groups only; accelerator graphs untouched)
        GraphPass(
            "merge-summed-matmuls",
            _merge_sums,
            stage="post_grad_pre",
            settings=_merge_settings,
            source_files=merge_sources,
        ),
        GraphPass("fuse-cpu-collective-matmul", _fuse, settings=_settings, source_files=sources),
    ]
