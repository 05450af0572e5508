"""One counters API for every plugin: named numbers a user can read after a run.

Handlers count what helps a user judge a run (bytes sent, fallbacks taken, fused ops).
Counts are per process; `dt_core.kit.stats()` gathers every plugin's, and setting
`DT_PLUGINS_STATS=<file>` makes each process append its counts to that file at exit,
which `dt-plugins stats -- <command>` sets up and sums for you. Under torch.compile a
handler runs while the graph is traced, so its counts are taken then, once per compile.
"""

from __future__ import annotations

import atexit
import json
import os
import threading

STATS_ENV = "DT_PLUGINS_STATS"

_registry: dict[str, Counters] = {}
_lock = threading.Lock()
_exit_hook_armed = False


class Counters:
    """The counters of one plugin; created once per plugin, at import of its module."""

    def __init__(self, plugin: str) -> None:
        self.plugin = plugin
        self._values: dict[str, float] = {}
        with _lock:
            _registry[plugin] = self
        _arm_exit_report()

    def add(self, name: str, amount: float = 1) -> None:
        self._values[name] = self._values.get(name, 0) + amount

    def get(self, name: str) -> float:
        return self._values.get(name, 0)

    def snapshot(self) -> dict[str, float]:
        return dict(self._values)

    def changes(self, before: dict[str, float]) -> dict[str, float]:
        """What changed since `before` (an earlier snapshot), non-zero changes only."""
        now = self.snapshot()
        return {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}

    def reset(self) -> None:
        self._values.clear()


def stats() -> dict[str, dict[str, float]]:
    """Every plugin's counters in this process, by plugin name (non-empty ones)."""
    with _lock:
        return {name: c.snapshot() for name, c in _registry.items() if c.snapshot()}


def reset_stats() -> None:
    with _lock:
        for counters in _registry.values():
            counters.reset()


def _write_report() -> None:
    path = os.environ.get(STATS_ENV)
    if not path:
        return
    line = json.dumps({"pid": os.getpid(), "rank": os.environ.get("RANK"), "stats": stats()})
    with open(path, "a") as f:  # one short line per process: appends do not interleave
        f.write(line + "\n")


def _arm_exit_report() -> None:
    global _exit_hook_armed
    if not _exit_hook_armed and os.environ.get(STATS_ENV):
        _exit_hook_armed = True
        atexit.register(_write_report)
