"""Inductor's post-grad custom pass lists: plugin passes run after the user's own.

dt-core keeps its passes (sorted by a key the caller gives) apart from the user's, and
guards the config so a later `config.post_grad_custom_post_pass = my_pass` keeps them;
taking the last one out gives back the user's very object and the unguarded config.

Checked against torch 2.11.x to 2.15.x (`CHECKED_WITH_TORCH`). Before 2.13 Inductor
calls each setting's value as one pass: dt-core then sets one chain of the passes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..contributions import PassStage
from . import ensure_supported_torch

CHECKED_WITH_TORCH = ">=2.11.0,<2.16"

STAGE_SETTINGS: dict[str, str] = {
    "post_grad_pre": "post_grad_custom_pre_pass",
    "post_grad_post": "post_grad_custom_post_pass",
}
_lock = threading.RLock()
_managed: dict[str, list[tuple[Any, Any]]] = {}  # setting -> [(sort key, pass)] of dt-core
_user_value_before: dict[str, Any] = {}  # setting -> value the user had at first install
_pass_class: type | None = None
_guard_class: type | None = None
_unguarded_class: type | None = None


def make_graph_pass(name: str, fn: Callable[[Any], None], uuid: Callable[[], str]) -> Any:
    """Wrap `fn` in Inductor's CustomGraphPass so the FX graph cache keys on `uuid()`."""
    global _pass_class
    if _pass_class is None:
        ensure_supported_torch(CHECKED_WITH_TORCH)
        from torch._inductor.custom_graph_pass import CustomGraphPass

        class DtGraphPass(CustomGraphPass):
            """A plugin's pass as Inductor sees it: callable plus a cache identity."""

            def __init__(self, name: str, fn: Callable[[Any], None], uuid: Callable[[], str]):
                self.name = name
                self.fn = fn
                self._uuid = uuid

            def __call__(self, graph: Any) -> None:
                self.fn(graph)

            def uuid(self) -> str:
                return self._uuid()

            def __repr__(self) -> str:
                return f"<dt pass {self.name}>"

        _pass_class = DtGraphPass
    return _pass_class(name, fn, uuid)


def inductor_config() -> Any:
    ensure_supported_torch(CHECKED_WITH_TORCH)
    import torch._inductor.config as config

    return config


def as_list(value: Any) -> list[Any]:
    """A pass setting's value (None, one pass, a list, or dt-core's chain of passes) as a
    list of passes."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, _Chain):
        return list(value.passes)
    return [value]


def takes_pass_lists() -> bool:
    """Whether Inductor runs a list of custom passes per setting (torch 2.13 on); older
    releases call the setting's value as one pass."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from . import torch_has

    return torch_has("torch._inductor.custom_graph_pass", "get_custom_graph_passes")


class _Chain:
    """Several passes as the one callable an older Inductor takes, run in order. Not a
    CustomGraphPass, so Inductor's FX graph cache is bypassed, as it is for any plain
    callable pass (see `_chain`)."""

    def __init__(self, passes: Sequence[Any]) -> None:
        self.passes = tuple(passes)

    def __call__(self, graph: Any) -> None:
        for graph_pass in self.passes:
            graph_pass(graph)

    def __repr__(self) -> str:
        return f"<dt pass chain {list(self.passes)}>"


_keyed_chain_class: type | None = None


def _chain(passes: Sequence[Any]) -> Any:
    """One pass running `passes` in order; a CustomGraphPass keyed on their uuids when
    every one of them is one (the FX graph cache then stays on, as with a list on newer
    torch), else a plain callable."""
    global _keyed_chain_class
    from torch._inductor.custom_graph_pass import CustomGraphPass

    if not all(isinstance(p, CustomGraphPass) for p in passes):
        return _Chain(passes)
    if _keyed_chain_class is None:

        class KeyedChain(_Chain, CustomGraphPass):
            def uuid(self) -> Any:
                return tuple(p.uuid() for p in self.passes)

        _keyed_chain_class = KeyedChain
    return _keyed_chain_class(passes)


def _ours(setting: str) -> list[Any]:
    return [graph_pass for _, graph_pass in _managed.get(setting, ())]


def _merged(user_value: Any, managed: Sequence[Any]) -> Any:
    """The user's passes first, as they set them, then dt-core's: a list, or on a torch
    that takes one pass per setting, one chain of them."""
    if not managed:
        return user_value
    passes = [p for p in as_list(user_value) if p not in managed] + list(managed)
    return passes if takes_pass_lists() else _chain(passes)


def _ensure_guard(config: Any) -> None:
    """Make later user assignments to the pass lists keep dt-core's passes appended.

    `torch._inductor.config.post_grad_custom_post_pass = my_pass` is the usual way to
    add a pass; without this guard it would silently drop every plugin's passes.
    """
    global _guard_class, _unguarded_class
    if _guard_class is not None and isinstance(config, _guard_class):
        return
    base = type(config)

    class PassListGuard(base):  # type: ignore[misc, valid-type]  # base: the config module's runtime type
        def __setattr__(self, name: str, value: object) -> None:
            super().__setattr__(name, _merged(value, _ours(name)))

    _unguarded_class, _guard_class = base, PassListGuard
    object.__setattr__(config, "__class__", PassListGuard)


def _user_passes(config: Any, setting: str) -> list[Any]:
    ours = _ours(setting)
    return [p for p in as_list(getattr(config, setting)) if p not in ours]


def add_graph_pass(stage: PassStage, sort_key: Any, graph_pass: Any) -> None:
    """Run `graph_pass` (made by make_graph_pass) after the user's passes for `stage`,
    among dt-core's passes in `sort_key` order."""
    with _lock:
        config = inductor_config()
        setting = STAGE_SETTINGS[stage]
        _ensure_guard(config)
        if setting not in _managed:
            _user_value_before[setting] = getattr(config, setting)
        user = _user_passes(config, setting)
        entries = _managed.setdefault(setting, [])
        entries.append((sort_key, graph_pass))
        entries.sort(key=lambda entry: entry[0])
        setattr(config, setting, user)


def remove_graph_pass(stage: PassStage, graph_pass: Any) -> None:
    """Take one of dt-core's passes out; the user's passes stay as they are."""
    with _lock:
        config = inductor_config()
        setting = STAGE_SETTINGS[stage]
        entries = _managed.get(setting)
        if not entries:
            return
        user = _user_passes(config, setting)
        entries[:] = [entry for entry in entries if entry[1] is not graph_pass]
        if entries:
            setattr(config, setting, user)
            return
        del _managed[setting]
        before = _user_value_before.pop(setting, None)
        # Unchanged since activation: give back the user's very object (None, a pass, a list).
        if as_list(before) != user:  # the user set passes meanwhile: keep theirs, as a
            # list, or as the one pass (or None) an older Inductor takes per setting
            one_pass = not takes_pass_lists() and len(user) <= 1
            before = (user[0] if user else None) if one_pass else user
        setattr(config, setting, before)
        if not _managed and isinstance(config, _guard_class):  # type: ignore[arg-type]  # set with the guard
            object.__setattr__(config, "__class__", _unguarded_class)
