"""Console heartbeat for long-running tools: a phase line now, then a reminder with the
elapsed time whenever the console has been quiet for `interval` seconds.

Why: an Inductor compile or a benchmark can run for minutes without printing; a user
watching the console cannot tell that from a hang. The main job (tools/demo.py) and the
benchmark report (tools/bench_report.py) print through one `Heartbeat`, which names what
is running and for how long, so no stretch of their output is silent for longer than
`interval` (give or take the time a Python thread waits for the interpreter lock).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

DEFAULT_INTERVAL_S = 10.0


class Heartbeat:
    """Prints lines for a tool and, from a daemon thread, what it is doing while it is
    otherwise quiet: `"<prefix><phase>: 45 s so far"`.

    Use as a context manager (the thread runs inside it). `phase()` names the current
    work and prints it at once; `say()` prints any other line. Both reset the quiet timer.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        interval: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"heartbeat interval must be positive, got {interval}")
        self.stream = stream if stream is not None else sys.stdout
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._prefix = ""
        self._phase = ""
        self._phase_start = self._last_output = clock()

    def __enter__(self) -> Heartbeat:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def say(self, line: str) -> None:
        """Print `line` now (and count it as output: the next reminder waits)."""
        with self._lock:
            print(line, file=self.stream, flush=True)
            self._last_output = self._clock()

    def phase(self, text: str, note: str = "", prefix: str | None = None) -> None:
        """Start a phase: print `prefix + text` (and `note`, said once: "first run on this
        machine, cached after"), then remind of `text` while nothing else is printed.
        `prefix` stays until changed (a stage's "[1/5] dt-conv: ")."""
        if prefix is not None:
            self._prefix = prefix
        with self._lock:
            self._phase, self._phase_start = text, self._clock()
        self.say(f"{self._prefix}{text}" + (f" ({note})" if note else ""))

    def quiet_phase(self, text: str, prefix: str | None = None) -> None:
        """Like `phase`, without printing now: the caller already said what starts."""
        if prefix is not None:
            self._prefix = prefix
        with self._lock:
            self._phase, self._phase_start = text, self._clock()

    def reminder(self) -> str:
        """The line a quiet console gets: the phase and its elapsed seconds."""
        elapsed = self._clock() - self._phase_start
        return f"{self._prefix}{self._phase or 'working'}: {elapsed:.0f} s so far"

    def _run(self) -> None:
        while True:
            with self._lock:
                wait = self._last_output + self.interval - self._clock()
            if self._stop.wait(max(wait, 0.0)):
                return
            with self._lock:
                due = self._clock() - self._last_output >= self.interval
            if due:
                self.say(self.reminder())
