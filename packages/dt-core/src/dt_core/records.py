"""What dt-core knows about each plugin: its origin, contributions and state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .contributions import GraphPass, HopRule, LibraryOps, OpHandler, ShardingStrategy

State = Literal["active", "pending", "inactive", "disabled", "failed"]


@dataclass
class PluginRecord:
    """Mutable bookkeeping for one plugin, owned by the activation module."""

    name: str
    distribution: str | None
    version: str | None
    module: Any = None
    state: State = "inactive"
    reason: str | None = None
    op_handlers: list[OpHandler] | None = None
    strategies: list[ShardingStrategy] | None = None
    library_ops: list[LibraryOps] | None = None
    graph_passes: list[GraphPass] | None = None
    hop_rules: list[HopRule] | None = None
    warned: bool = field(default=False, repr=False)

    def claimed_ops(self) -> list[str]:
        """Names this plugin claims (handlers, strategies, library ops, HOP rules)."""
        names = [str(h.op) for h in self.op_handlers or ()]
        names += [str(s.op) for s in self.strategies or ()]
        names += [name for lib in self.library_ops or () for name in lib.ops]
        names += [rule.claim() for rule in self.hop_rules or ()]
        return names

    def pass_names(self) -> list[str]:
        return [f"{self.name}:{p.name}" for p in self.graph_passes or ()]

    def snapshot(self) -> PluginInfo:
        from .graph_passes import describe_settings

        return PluginInfo(
            name=self.name,
            distribution=self.distribution,
            version=self.version,
            ops=tuple(self.claimed_ops()),
            passes=tuple(self.pass_names()),
            pass_settings={
                f"{self.name}:{p.name}": describe_settings(p) for p in self.graph_passes or ()
            },
            state=self.state,
            reason=self.reason,
        )


@dataclass(frozen=True)
class PluginInfo:
    """One row of `dt_core.plugins()`: a read-only view of a plugin."""

    name: str
    distribution: str | None
    version: str | None
    ops: tuple[str, ...]
    passes: tuple[str, ...]
    pass_settings: dict[str, dict[str, Any]]
    state: State
    reason: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "ops": list(self.ops),
            "passes": list(self.passes),
            "pass_settings": self.pass_settings,
            "state": self.state,
            "reason": self.reason,
        }
