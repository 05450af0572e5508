"""Inductor's tile-2D rule with dt-conv active: an index holding an indirect variable is
never tiled as a transposed block (torch 2.11 / 2.12 did, and the kernel did not compile:
`test_conv_dynamic_shapes.test_compiles_that_follow_compiles_inductor`); where torch has
the rule itself, its own function stays in place."""

from __future__ import annotations

from typing import Any

from dt_conv.compat import _keeping_indirect_indices_untransposed, refuses_indirect_transposes


def _index_symbols() -> tuple[Any, Any, Any]:
    from torch._inductor.utils import sympy_index_symbol

    return sympy_index_symbol("x0"), sympy_index_symbol("x1"), sympy_index_symbol("tmp3")


def test_the_active_rule_keeps_indirect_indices_untransposed() -> None:
    import torch.distributed.tensor  # noqa: F401  (activates the plugins)
    from torch._inductor.codegen.cpp import CppTile2DKernel

    assert refuses_indirect_transposes(CppTile2DKernel.need_vec_transpose)


def test_a_rule_that_transposes_indirect_indices_is_wrapped_and_others_kept() -> None:
    from types import SimpleNamespace

    outer, inner, indirect = _index_symbols()
    kernel = SimpleNamespace(itervars=[outer, inner], outer_idx=0, tiling_idx=1)

    def transposes_every_index(self: Any, index: Any) -> bool:
        return True

    assert not refuses_indirect_transposes(transposes_every_index)
    wrapped = _keeping_indirect_indices_untransposed(transposes_every_index)
    assert wrapped is not transposes_every_index
    assert refuses_indirect_transposes(wrapped)
    assert wrapped(kernel, outer + 64 * inner)  # other indices: the rule's own answer
    assert not wrapped(kernel, outer + 64 * inner + 512 * indirect)

    def refuses_indirect(self: Any, index: Any) -> bool:
        return not any(str(s).startswith("tmp") for s in index.free_symbols)

    assert _keeping_indirect_indices_untransposed(refuses_indirect) is refuses_indirect
