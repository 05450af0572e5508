"""What dt-core knows about each plugin: its origin, contributions and state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

State = Literal["active", "pending", "inactive", "disabled", "failed", "incompatible"]


@dataclass
class PluginRecord:
    """Mutable bookkeeping for one plugin, owned by the activation object."""

    name: str
    origin: Any = None  # the entry point it was found through; None: registered in-process
    module: Any = None
    state: State = "inactive"
    reason: str | None = None
    api: str | None = None  # hook API range the plugin declared (DT_API)
    settings_modules: tuple[str, ...] = ()  # modules creating its settings (DT_SETTINGS)
    # kind name -> what the plugin's hook returned; a kind is absent until collected.
    contributions: dict[str, list[Any]] = field(default_factory=dict)
    warned: bool = field(default=False, repr=False)
    _distribution: tuple[str | None, str | None] | None = field(default=None, repr=False)

    def _name_and_version(self) -> tuple[str | None, str | None]:
        """The distribution's name and version, read when first asked for: reading them
        parses its METADATA file, which `import torch` has no need to pay for."""
        if self._distribution is None:
            from .discovery import distribution_of

            found = distribution_of(self.origin) if self.origin is not None else None
            self._distribution = found or (None, None)
        return self._distribution

    @property
    def distribution(self) -> str | None:
        return self._name_and_version()[0]

    @property
    def version(self) -> str | None:
        return self._name_and_version()[1]

    @property
    def usable(self) -> bool:
        """Imported and neither failed, disabled nor built for another hook API."""
        return self.module is not None and self.state not in ("failed", "disabled", "incompatible")

    def claims(self, kinds: Any) -> list[str]:
        """Conflict keys of this plugin's collected contributions of `kinds`, in order."""
        return [
            claim
            for kind in kinds
            for item in self.contributions.get(kind.name, ())
            for claim in kind.claims(self.name, item)
        ]

    def snapshot(self) -> PluginInfo:
        from .kinds import KINDS

        columns: dict[str, list[str]] = {"ops": [], "passes": [], "patches": []}
        details: dict[str, dict[str, Any]] = {}
        for kind in KINDS:
            for item in self.contributions.get(kind.name, ()):
                for claim in kind.claims(self.name, item):
                    columns[kind.column].append(claim)
                    if kind.describe is not None:
                        details[claim] = _describe(kind.describe, item)
        return PluginInfo(
            name=self.name,
            distribution=self.distribution,
            version=self.version,
            api=self.api,
            ops=tuple(columns["ops"]),
            passes=tuple(columns["passes"]),
            patches=tuple(columns["patches"]),
            details=details,
            state=self.state,
            reason=self.reason,
        )


def _describe(describe: Any, item: Any) -> dict[str, Any]:
    try:
        return dict(describe(item))
    except Exception as error:  # noqa: BLE001 - a listing must not fail on one entry
        return {"error": f"{type(error).__name__}: {error}"}


@dataclass(frozen=True)
class PluginInfo:
    """One row of `dt_core.plugins()`: a read-only view of a plugin."""

    name: str
    distribution: str | None
    version: str | None
    api: str | None
    ops: tuple[str, ...]
    passes: tuple[str, ...]
    patches: tuple[str, ...]
    details: dict[str, dict[str, Any]]  # claim -> what `dt-plugins list` shows beside it
    state: State
    reason: str | None

    @property
    def pass_settings(self) -> dict[str, dict[str, Any]]:
        return {name: self.details.get(name, {}) for name in self.passes}

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "api": self.api,
            "ops": list(self.ops),
            "passes": list(self.passes),
            "pass_settings": self.pass_settings,
            "patches": list(self.patches),
            "patch_details": {name: self.details.get(name, {}) for name in self.patches},
            "state": self.state,
            "reason": self.reason,
        }
