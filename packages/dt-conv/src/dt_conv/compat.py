"""dt-conv's private torch area: Inductor's C++ code generation for CPU kernels.

Checked against torch 2.11.x to 2.15.x (`CHECKED_WITH_TORCH`).

torch 2.11 and 2.12 write a kernel that does not compile ("tmpN was not declared in this
scope", CppCompileError) when a load or store whose index holds an indirect variable (a
value the kernel computes, `tmpN`) is tiled as a transposed 2-D block: the block is moved
before the loop that declares the variable. Spatially sharded graphs compiled with
dynamic sizes make such kernels (the halo assembly indexes with computed positions), so
a user meets it as soon as a shape changes after a first compile. torch 2.13 leaves those
accesses out of the transposed tiling. dt-conv installs the same rule where Inductor
lacks it, found by asking Inductor's own decision about such an index, not by version.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from dt_core import Patch
from dt_core.compat import ensure_supported_torch

CHECKED_WITH_TORCH = ">=2.11.0,<2.16"
TILE_2D_KERNEL = "torch._inductor.codegen.cpp:CppTile2DKernel"


def refuses_indirect_transposes(need_vec_transpose: Callable[..., bool]) -> bool:
    """Whether Inductor's tile-2D rule (`need_vec_transpose`) already keeps an index with
    an indirect variable out of the transposed tiling: asked with an index that would be
    transposed but for that variable."""
    from torch._inductor.utils import sympy_index_symbol

    outer, inner = sympy_index_symbol("x0"), sympy_index_symbol("x1")
    indirect = sympy_index_symbol("tmp0")  # "tmp" names an indirect variable (SymT.TMP)
    kernel = SimpleNamespace(
        itervars=[outer, inner], outer_idx=0, tiling_idx=1, tiling_factor=8, _load_mask=None
    )
    # contiguous along the outer loop, strided along the inner one: a transposed block
    return not need_vec_transpose(kernel, outer + 64 * inner + 512 * indirect)


def _keeping_indirect_indices_untransposed(
    need_vec_transpose: Callable[..., bool],
) -> Callable[..., bool]:
    """torch's `CppTile2DKernel.need_vec_transpose`, or, where it transposes indices with
    indirect variables, the same rule refusing them (the access is then loaded the way
    the kernel loads any other non-contiguous one)."""
    if refuses_indirect_transposes(need_vec_transpose):
        return need_vec_transpose
    # imported once here: the rule runs for every load and store Inductor generates
    from torch.utils._sympy.symbol import SymT, free_symbol_is_type

    def keeping_indirect_untransposed(self: Any, index: Any) -> bool:
        if free_symbol_is_type(index, SymT.TMP):
            return False
        return need_vec_transpose(self, index)

    return keeping_indirect_untransposed


def indirect_transpose_patch() -> Patch:
    """A dt-core Patch of Inductor's tile-2D rule: an index with an indirect variable is
    never tiled as a transposed block (see the module). Installed when torch imports
    Inductor's C++ code generation, never importing it itself."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    return Patch(
        TILE_2D_KERNEL,
        "need_vec_transpose",
        _keeping_indirect_indices_untransposed,
        torch_versions=CHECKED_WITH_TORCH,
        wrap_original=True,
    )
