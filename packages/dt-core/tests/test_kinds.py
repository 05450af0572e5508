"""The kinds table is the one declaration of each contribution kind: it and the hook
specifications must name the same hooks, each returning its kind's record type."""

from __future__ import annotations

import inspect

import pluggy
from dt_core import contributions, hookspecs
from dt_core.kinds import KINDS, PARTS


def test_every_hookspec_has_exactly_one_kind_and_back() -> None:
    specs = {name for name, _ in inspect.getmembers(hookspecs, inspect.isfunction)}
    specs = {name for name in specs if name.startswith("dt_")}
    assert sorted(kind.hook for kind in KINDS) == sorted(specs)
    assert len({kind.name for kind in KINDS}) == len(KINDS)


def test_each_kind_returns_its_own_record_type_and_belongs_to_a_known_part() -> None:
    records = {cls for _, cls in inspect.getmembers(contributions, inspect.isclass)}
    for kind in KINDS:
        assert kind.record_type in records, kind.name
        assert kind.record_type.__name__ in str(inspect.signature(getattr(hookspecs, kind.hook)))
        assert kind.part in PARTS, kind.name


def test_hook_specifications_are_documented_pluggy_specs() -> None:
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    hooks = {name for name in dir(manager.hook) if name.startswith("dt_")}
    assert hooks == {kind.hook for kind in KINDS}
    for kind in KINDS:
        spec = getattr(hookspecs, kind.hook)
        assert spec.__name__ == kind.hook and spec.__doc__ and spec.__doc__.strip()
        assert getattr(manager.hook, kind.hook).spec.argnames == ()
