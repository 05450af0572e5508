"""The handler kit: the chores every plugin's DTensor op handlers share, written once.

- `bind_arguments` / `bind_positional`: op arguments by the op's schema; `op_name`: an
  op's "name.overload" key.
- `replicated_fallback`, `warn_fallback`, `reshard_like`, `replicated`: the exact path
  for cases a handler cannot shard, warned once per op and reason (`FallbackWarning`).
- `Unsupported`: a planning step's refusal (the reason), caught once per handler, which
  then falls back (`replicated_fallback`) or raises the user-facing error.
- `hand_to_torch`: torch's own dispatch for the cases torch gets right.
- `SettingsStore`: a plugin's settings dataclass, from `DT_<PLUGIN>_<NAME>` variables,
  `configure()` and `scoped()` blocks; listed by `dt-plugins list --settings`.
- `Counters`, `stats()`: per-plugin counters; `dt-plugins stats -- <command>` shows them.
"""

from __future__ import annotations

from ..errors import Unsupported
from .arguments import bind_arguments, bind_positional, op_name
from .counters import Counters, reset_stats, stats
from .fallback import (
    FallbackWarning,
    forget_fallback_warnings,
    replicated,
    replicated_fallback,
    reshard_like,
    warn_fallback,
)
from .handover import hand_to_torch
from .settings import SettingsStore, registered_settings

__all__ = [
    "Counters",
    "FallbackWarning",
    "SettingsStore",
    "Unsupported",
    "bind_arguments",
    "bind_positional",
    "forget_fallback_warnings",
    "hand_to_torch",
    "op_name",
    "registered_settings",
    "replicated",
    "replicated_fallback",
    "reset_stats",
    "reshard_like",
    "stats",
    "warn_fallback",
]
