"""One installer per contribution kind: put one contribution into torch, return its undo.

Each undo puts back the very object that was there before. Installers run under the
activation lock; the kinds table (`dt_core.kinds`) says which installer serves which kind.
Only library ops are installed during `import torch`: each other installer imports the
compat module it needs when it runs, so that import stays light.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from . import contributions, import_hooks
from .compat import MISSING, library
from .compat.torch_version import torch_version
from .errors import DtPluginError
from .versions import in_range

Undo = Callable[[], None]


def install_library_ops(owner: str, library_ops: contributions.LibraryOps) -> Undo:
    if library_ops.defined_in:
        return _install_when_defined(library_ops, library_ops.defined_in)
    return _register_library(library_ops)


def _register_library(library_ops: contributions.LibraryOps) -> Undo:
    lib = library.new_library(library_ops.namespace, library_ops.kind)
    try:
        library_ops.define(lib)
    except BaseException:
        library.destroy_library(lib)
        raise
    return lambda: library.destroy_library(lib)


def _install_when_defined(library_ops: contributions.LibraryOps, module_name: str) -> Undo:
    """Registers on the ops once torch's module that defines them has been imported, and
    never imports it itself: before that import the ops do not exist in torch either,
    and importing it eagerly would put its cost on every `import torch`."""
    library.check_defining_module(module_name)
    return _once_imported(module_name, lambda: _register_library(library_ops))


def _once_imported(module_name: str, install: Callable[[], Undo]) -> Undo:
    """`install()` as soon as `module_name` has been imported (at once if it already is);
    the undo forgets a still-waiting install or undoes a done one."""
    undo: list[Undo] = []

    def on_import(module: object) -> None:
        undo.append(install())

    import_hooks.when_imported(module_name, on_import)

    def remove() -> None:
        if not import_hooks.cancel_callback(module_name, on_import):
            for step in undo:
                step()

    return remove


def install_local_tensor_rule(owner: str, rule: contributions.LocalTensorRule) -> Undo:
    from .compat import local_tensor

    lib = library.new_library(rule.namespace(), "FRAGMENT")
    try:
        local_tensor.register_mode_rule(lib, rule.op, rule.fn)
    except BaseException:
        library.destroy_library(lib)
        raise
    return lambda: library.destroy_library(lib)


def install_op_handler(owner: str, handler: contributions.OpHandler) -> Undo:
    from . import shared_handlers

    return shared_handlers.install(handler)


def install_sharding_strategy(owner: str, strategy: contributions.ShardingStrategy) -> Undo:
    from .compat import sharding_rules

    if strategy.kind == "placements":
        func, schema_info = sharding_rules.placement_strategy(strategy.op, strategy.func)
        strategy = contributions.ShardingStrategy(
            strategy.op, func, strategy.schema_info or schema_info
        )
    previous = sharding_rules.swap_sharding_strategy(strategy)
    return lambda: sharding_rules.restore_sharding_strategy(strategy.op, strategy.kind, previous)


def install_hop_rule(owner: str, rule: contributions.HopRule) -> Undo:
    from .compat import hop_rules

    previous = hop_rules.swap_hop_rule(rule.hop, rule.subclass, rule.fn)
    return lambda: hop_rules.swap_hop_rule(rule.hop, rule.subclass, previous)


def install_graph_pass(owner: str, graph_pass: contributions.GraphPass) -> Undo:
    from . import graph_passes
    from .compat import inductor_passes

    identity = contributions.pass_identity(owner, graph_pass)
    wrapped = inductor_passes.make_graph_pass(
        identity, graph_pass.fn, graph_passes.uuid_function(identity, graph_pass)
    )
    # Lower `order` first within a stage; ties break on the pass identity.
    inductor_passes.add_graph_pass(graph_pass.stage, (graph_pass.order, identity), wrapped)
    return lambda: inductor_passes.remove_graph_pass(graph_pass.stage, wrapped)


def patch_target(patch: contributions.Patch) -> Any:
    """The object a patch changes: its target, or the object its "module[:path]" names."""
    if not isinstance(patch.target, str):
        return patch.target
    module_name, _, path = patch.target.partition(":")
    target = importlib.import_module(module_name)
    for name in filter(None, path.split(".")):
        target = getattr(target, name)
    return target


def install_patch(owner: str, patch: contributions.Patch) -> Undo:
    # A patch's range is its author's statement about torch's code: honoured even when
    # the user lets the plugins try an untested torch (that override widens the run-time
    # gate, never what a patch claims to fit).
    if patch.torch_versions and not in_range(torch_version(), patch.torch_versions):
        raise DtPluginError(
            f"{patch.claim()} was checked with torch {patch.torch_versions}, "
            f"not {torch_version()}: upgrade the plugin"
        )
    if isinstance(patch.target, str):  # the light form: patch once torch imports it
        module_name = patch.target.split(":")[0]
        return _once_imported(module_name, lambda: _apply_patch(patch))
    return _apply_patch(patch)


def _apply_patch(patch: contributions.Patch) -> Undo:
    target = patch_target(patch)
    if not hasattr(target, patch.attribute):
        raise DtPluginError(
            f"{patch.claim()}: there is no such attribute in torch {torch_version()}, so the "
            "patch does not fit this torch: upgrade the plugin"
        )
    own = vars(target) if hasattr(target, "__dict__") else {}
    previous = own.get(patch.attribute, MISSING)
    original = getattr(target, patch.attribute)
    installed = patch.replacement(original) if patch.wrap_original else patch.replacement
    setattr(target, patch.attribute, installed)

    def undo() -> None:
        current = getattr(target, patch.attribute, MISSING)
        if current is not installed:
            raise DtPluginError(
                f"{patch.claim()} was replaced again by someone else; left as it is now"
            )
        if previous is MISSING:
            delattr(target, patch.attribute)
        else:
            setattr(target, patch.attribute, previous)

    return undo
