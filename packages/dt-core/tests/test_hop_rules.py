"""Higher-order-operator rules (`dt_hop_rules`): installed, listed, conflicting, removed.

A test HOP stands in for torch's own (flex_attention etc.); a rule is checked both in
the HOP's subclass table and by a real dispatch with a tensor subclass argument.
"""

from __future__ import annotations

import dt_core
import pytest
import torch
from test_activation import core, plugin  # noqa: F401 - `core` is a fixture
from torch._C import DispatchKey
from torch._ops import HigherOrderOperator
from torch.distributed.tensor import DTensor
from torch.testing._internal.two_tensor import TwoTensor


class _TestHop(HigherOrderOperator):
    def __init__(self) -> None:
        super().__init__("dt_core_test_hop")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return super().__call__(x)


HOP = _TestHop()
for _key in (DispatchKey.AutogradCPU, DispatchKey.Autograd):
    HOP.fallthrough(_key)


@HOP.py_impl(DispatchKey.CompositeExplicitAutograd)
def _dense(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def _rule(x: TwoTensor) -> torch.Tensor:
    return torch.full_like(x.a, 42.0)


def _other_rule(x: object) -> torch.Tensor:  # pragma: no cover - never dispatched
    return torch.zeros(())


def _two(x: torch.Tensor) -> TwoTensor:
    return TwoTensor(x, x.clone())


def test_rule_installs_dispatches_lists_and_comes_out_again(core) -> None:  # noqa: F811
    x = torch.zeros(3)
    with pytest.raises(NotImplementedError, match="no rule registered"):
        HOP(_two(x))
    dt_core.register_plugin(
        plugin(dt_hop_rules=lambda: [dt_core.HopRule(HOP, _rule, TwoTensor)]), "hops"
    )
    core.append("hops")
    infos = {p.name: p for p in dt_core.activate()}
    assert infos["hops"].ops == ("hop dt_core_test_hop[TwoTensor]",)
    assert torch.equal(HOP(_two(x)), torch.full((3,), 42.0))
    assert torch.equal(HOP(x), x + 1)  # plain tensors still take the dense kernel
    dt_core.deactivate()
    assert TwoTensor not in HOP.python_key_table
    with pytest.raises(NotImplementedError, match="no rule registered"):
        HOP(_two(x))


def test_deactivate_puts_back_the_previous_rule_as_the_same_object(core) -> None:  # noqa: F811
    def previous(x: object) -> torch.Tensor:  # pragma: no cover - never dispatched
        return torch.ones(())

    HOP.python_key_table[DTensor] = previous
    try:
        dt_core.register_plugin(plugin(dt_hop_rules=lambda: [dt_core.HopRule(HOP, _rule)]), "d")
        core.append("d")
        infos = {p.name: p for p in dt_core.activate()}
        assert infos["d"].ops == ("hop dt_core_test_hop[DTensor]",)  # subclass None: DTensor
        assert HOP.python_key_table[DTensor] is _rule
        dt_core.deactivate()
        assert HOP.python_key_table[DTensor] is previous
    finally:
        HOP.python_key_table.pop(DTensor, None)


def test_two_plugins_with_a_rule_for_the_same_hop_conflict(core) -> None:  # noqa: F811
    for name, fn in (("first", _rule), ("second", _other_rule)):
        dt_core.register_plugin(
            plugin(dt_hop_rules=lambda fn=fn: [dt_core.HopRule(HOP, fn, TwoTensor)]), name
        )
        core.append(name)
    with pytest.raises(dt_core.PluginConflictError) as info:
        dt_core.activate()
    message = str(info.value)
    assert "'first'" in message and "'second'" in message and "dt_core_test_hop" in message
    assert TwoTensor not in HOP.python_key_table  # nothing left behind
    assert not dt_core.is_active()
