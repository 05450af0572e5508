"""Patch contributions: installed, listed, conflict-checked, version-checked and put back
exactly (the same object, or no attribute at all when there was none)."""

from __future__ import annotations

import sys
import types

import dt_core
import pytest
from test_activation import core, plugin  # noqa: F401 - `core` is a fixture


def _original(x: int) -> int:
    return x + 1


def _replacement(x: int) -> int:
    return x * 100


@pytest.fixture
def target() -> types.ModuleType:
    """A stand-in for a torch module, importable by name."""
    module = types.ModuleType("dt_core_test_patch_target")
    module.check = _original  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module
    sys.modules.pop(module.__name__, None)


def test_patch_installs_lists_and_restores_the_same_object(core, target) -> None:  # noqa: F811
    dt_core.register_plugin(
        plugin(dt_patches=lambda: [dt_core.Patch(target, "check", _replacement)]), "patcher"
    )
    core.append("patcher")
    infos = {p.name: p for p in dt_core.activate()}
    claim = "patch dt_core_test_patch_target.check"
    assert infos["patcher"].patches == (claim,)
    assert infos["patcher"].details[claim] == {"torch": "any"}
    assert target.check is _replacement and target.check(2) == 200
    dt_core.deactivate()
    assert target.check is _original


def test_wrapping_patch_by_module_name_sees_the_original(core, target) -> None:  # noqa: F811
    def wrap(original):
        return lambda x: -original(x)

    dt_core.register_plugin(
        plugin(
            dt_patches=lambda: [
                dt_core.Patch("dt_core_test_patch_target", "check", wrap, wrap_original=True)
            ]
        ),
        "wrapper",
    )
    core.append("wrapper")
    dt_core.activate()
    assert target.check(2) == -3  # the replacement called torch's original
    dt_core.deactivate()
    assert target.check is _original


def test_patching_an_attribute_torch_lacks_fails_the_plugin(core, target, recwarn) -> None:  # noqa: F811
    dt_core.register_plugin(
        plugin(dt_patches=lambda: [dt_core.Patch(target, "extra", _replacement)]), "adder"
    )
    core.append("adder")
    infos = {p.name: p for p in dt_core.activate()}
    assert infos["adder"].state == "failed"
    assert "dt_core_test_patch_target.extra" in infos["adder"].reason
    assert "no such attribute" in infos["adder"].reason
    assert not hasattr(target, "extra")  # nothing added


def test_two_plugins_patching_the_same_attribute_conflict(core, target) -> None:  # noqa: F811
    for name in ("first", "second"):
        dt_core.register_plugin(
            plugin(dt_patches=lambda: [dt_core.Patch(target, "check", _replacement)]), name
        )
        core.append(name)
    with pytest.raises(dt_core.PluginConflictError) as info:
        dt_core.activate()
    message = str(info.value)
    assert "'first'" in message and "'second'" in message
    assert "patch dt_core_test_patch_target.check" in message
    assert target.check is _original and not dt_core.is_active()


@pytest.mark.parametrize("override", ["0", "1"])
def test_patch_for_other_torch_versions_fails_only_its_plugin(
    core,  # noqa: F811
    target,
    recwarn,
    monkeypatch,
    override: str,
) -> None:
    """Outside its declared range a patch is never installed, also when the user sets
    the override that lets the plugins try an untested torch."""
    import torch
    from dt_core.compat import ALLOW_UNTESTED_ENV

    monkeypatch.setenv(ALLOW_UNTESTED_ENV, override)

    dt_core.register_plugin(
        plugin(
            dt_patches=lambda: [
                dt_core.Patch(target, "check", _replacement, torch_versions=">=1.0,<2.0")
            ]
        ),
        "old",
    )
    core.append("old")
    infos = {p.name: p for p in dt_core.activate()}
    assert infos["old"].state == "failed"
    assert ">=1.0,<2.0" in infos["old"].reason and torch.__version__ in infos["old"].reason
    assert target.check is _original
    assert infos["sample"].state == "active"  # the others still work
    messages = [str(w.message) for w in recwarn if "dt-core" in str(w.message)]
    assert len(messages) == 1 and "'old'" in messages[0]


def test_patch_replaced_again_by_someone_else_is_left_with_a_warning(core, target) -> None:  # noqa: F811
    dt_core.register_plugin(
        plugin(dt_patches=lambda: [dt_core.Patch(target, "check", _replacement)]), "patcher"
    )
    core.append("patcher")
    dt_core.activate()

    def later(x: int) -> int:
        return 0

    target.check = later
    with pytest.warns(RuntimeWarning, match="replaced again by someone else"):
        dt_core.deactivate()
    assert target.check is later  # never silently overwrite a later change
