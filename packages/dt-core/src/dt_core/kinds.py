"""The table of contribution kinds: one entry says everything dt-core does with a kind.

Each `Kind` names its hook, the record type the hook returns, the torch part whose import
installs it, its installer (one contribution in, its undo out), the conflict key (two
usable plugins with the same key in the same part conflict) and the column
`dt-plugins list` shows it in. Activation (`dt_core.activation`) is driven by this table
alone; adding a kind is one hookspec, one entry here and one installer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from . import installers
from .compat import dispatch
from .contributions import GraphPass, HopRule, LibraryOps, OpHandler, Patch, ShardingStrategy
from .graph_passes import describe_settings

Column = Literal["ops", "passes", "patches"]


@dataclass(frozen=True)
class Part:
    """A group of kinds installed together: when `trigger` is first imported (None: as
    soon as activation starts, so library ops exist before anyone calls them)."""

    name: str
    trigger: str | None


LIBRARY = Part("torch", None)
DTENSOR = Part("dtensor", "torch.distributed.tensor")
INDUCTOR = Part("inductor", "torch._inductor.config")
PARTS = (LIBRARY, DTENSOR, INDUCTOR)  # install order: strategies may name library ops


@dataclass(frozen=True)
class Kind:
    """One kind of contribution (see the module docstring)."""

    name: str  # key in PluginRecord.contributions
    hook: str  # hookspec whose results are of `record_type`
    record_type: type
    part: Part
    install: Callable[[str, Any], installers.Undo]  # (plugin name, contribution) -> undo
    claims: Callable[[str, Any], list[str]]  # (plugin name, contribution) -> conflict keys
    column: Column  # where `dt-plugins list` shows the claims
    describe: Callable[[Any], dict[str, Any]] | None = None  # extra detail for the listing
    after_change: Callable[[], None] | None = None  # once after installing or removing any


KINDS: tuple[Kind, ...] = (
    Kind(
        "library_ops",
        "dt_library_ops",
        LibraryOps,
        LIBRARY,
        installers.install_library_ops,
        lambda owner, lib: list(lib.ops),
        "ops",
    ),
    Kind(
        "op_handlers",
        "dt_op_handlers",
        OpHandler,
        DTENSOR,
        installers.install_op_handler,
        lambda owner, handler: [str(handler.op)],
        "ops",
        after_change=dispatch.clear_sharding_caches,
    ),
    Kind(
        "sharding_strategies",
        "dt_sharding_strategies",
        ShardingStrategy,
        DTENSOR,
        installers.install_sharding_strategy,
        lambda owner, strategy: [str(strategy.op)],
        "ops",
        after_change=dispatch.clear_sharding_caches,
    ),
    Kind(
        "hop_rules",
        "dt_hop_rules",
        HopRule,
        DTENSOR,
        installers.install_hop_rule,
        lambda owner, rule: [rule.claim()],
        "ops",
    ),
    Kind(
        "patches",
        "dt_patches",
        Patch,
        DTENSOR,
        installers.install_patch,
        lambda owner, patch: [patch.claim()],
        "patches",
        describe=lambda patch: {"torch": patch.torch_versions or "any"},
    ),
    Kind(
        "graph_passes",
        "dt_graph_passes",
        GraphPass,
        INDUCTOR,
        installers.install_graph_pass,
        lambda owner, graph_pass: [installers.pass_identity(owner, graph_pass)],
        "passes",
        describe=describe_settings,
    ),
)


def kinds_of(part: Part) -> tuple[Kind, ...]:
    return tuple(kind for kind in KINDS if kind.part == part)
