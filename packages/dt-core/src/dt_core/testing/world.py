"""Worlds of rank processes joined in one gloo process group, shared across test cases.

Spawning a process and importing torch is the main cost of a multi-rank test, so a World
keeps its ranks alive and runs many test bodies on them in turn. A rank that raises is
reported with its traceback; a rank that dies or hangs fails the run within a deadline (a
hung rank's report says where its Python code was), and the world is torn down, so the
next user gets a fresh one. Ranks that finish a task with different operation counts on a
group (a collective issued on some ranks only would pair with the next task's) get a
fresh world too, with a `WorldReplacedWarning`. The rank side is world_rank.py.

torch is imported lazily: this module is imported by the pytest plugin in every test run.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

import cloudpickle

from dt_core.testing import pickling
from dt_core.testing.rank_failure import (
    RankError,
    RankFailure,
    StepCounts,
    WorldReplacedWarning,
    out_of_step_report,
)
from dt_core.testing.world_rank import HOST, counts_request, rank_main

if TYPE_CHECKING:
    from multiprocessing.context import SpawnProcess

    from typing_extensions import Self

TIMEOUT_ENV = "DT_TEST_RANK_TIMEOUT"
DEFAULT_TIMEOUT_S = 120.0
# After one rank fails, its peers are usually blocked in a collective waiting for it: give
# them this long to answer (or fail too) before calling them stuck.
ERROR_GRACE_S = 5.0
# A stuck rank is asked for its Python stacks (SIGUSR1) and its operation counts, and given
# this long to write them (the counts up to twice this).
STACK_DUMP_WAIT_S = 1.0


def default_timeout() -> float:
    """Per-run deadline in seconds: $DT_TEST_RANK_TIMEOUT, else 120."""
    return float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))


class World:
    """`world_size` spawned CPU processes in one gloo process group, running functions on request.

    Rendezvous is a TCPStore served by this process on a free port (port 0), so many worlds,
    e.g. one per pytest-xdist worker, coexist on one machine. Not thread-safe.
    """

    def __init__(self, world_size: int, *, startup_timeout: float | None = None) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        import torch.distributed as dist

        self.world_size = world_size
        self._closed = False
        # Where each rank writes its stacks when asked: a stuck rank's report says where it hung.
        self._stack_dir = tempfile.TemporaryDirectory(prefix="dt-world-")
        store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False)
        self._store: dist.TCPStore | None = store
        timeout = default_timeout() if startup_timeout is None else startup_timeout
        ctx = mp.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs: list[SpawnProcess] = []
        try:
            for rank in range(world_size):
                ours, theirs = ctx.Pipe()
                self._conns.append(ours)
                stack_file = self._stack_file(rank)
                args = (rank, world_size, store.port, list(sys.path), theirs, timeout, stack_file)
                proc = ctx.Process(target=rank_main, args=args, name=f"dt-rank-{rank}", daemon=True)
                proc.start()
                self._procs.append(proc)
                theirs.close()
            self._collect(timeout, "joining the process group")
        except BaseException:
            self.close(grace=0)
            raise

    def _stack_file(self, rank: int) -> str:
        return os.path.join(self._stack_dir.name, f"rank-{rank}.txt")

    def _ask_stuck(self, ranks: list[int]) -> tuple[dict[int, str], dict[int, StepCounts]]:
        """Ask each of `ranks` (alive but not answering) where it is: its Python stacks,
        and the operations it issued per group since its task began (`world_rank`)."""
        asked = []
        for rank in ranks:
            pid = self._procs[rank].pid
            if pid is not None and self._procs[rank].is_alive():
                ask, _ = counts_request(self._stack_file(rank))
                with contextlib.suppress(OSError):
                    open(ask, "w").close()  # noqa: SIM115 - an empty file is the request
                    os.kill(pid, signal.SIGUSR1)
                    asked.append(rank)
        if not asked:
            return {}, {}
        time.sleep(STACK_DUMP_WAIT_S)
        stacks, counts = {}, {}
        deadline = time.monotonic() + STACK_DUMP_WAIT_S
        for rank in asked:
            with contextlib.suppress(OSError):
                text = open(self._stack_file(rank), encoding="utf-8", errors="replace").read()
                stacks[rank] = text.strip()
            _, answer = counts_request(self._stack_file(rank))
            while not os.path.exists(answer) and time.monotonic() < deadline:
                time.sleep(0.05)
            with contextlib.suppress(OSError, ValueError):
                with open(answer, encoding="utf-8") as f:
                    data = json.load(f)
                counts[rank] = StepCounts(data["start"], data["now"], data.get("recent", []))
        return stacks, counts

    @property
    def pids(self) -> list[int]:
        """Process ids by rank; unchanged while the world is reused."""
        return [proc.pid for proc in self._procs if proc.pid is not None]  # all started

    @property
    def alive(self) -> bool:
        """Whether the world is open and every rank process is running."""
        return not self._closed and all(proc.is_alive() for proc in self._procs)

    def run(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Run `fn(*args, **kwargs)` on every rank; return the results indexed by rank.

        Raises RankFailure if any rank raised, died or missed the deadline (`timeout` seconds,
        default $DT_TEST_RANK_TIMEOUT or 120). If a rank did not answer the world is closed.
        """
        if self._closed:
            raise RuntimeError("this World is closed; use get_world() for a fresh one")
        payload = pickling.dumps((list(sys.path), fn, args, kwargs))
        try:
            for conn in self._conns:
                with contextlib.suppress(OSError):  # a dead rank is reported by _collect
                    conn.send_bytes(payload)
            return self._collect(default_timeout() if timeout is None else timeout, "running")
        except RankFailure:
            raise
        except BaseException:
            # Interrupted (Ctrl-C, pytest-timeout) with ranks busy: they can't be reused.
            self.close(grace=0)
            raise

    def _collect(self, timeout: float, doing: str) -> list[Any]:
        """Wait for one reply per rank, or its death, or the deadline; raise if any failed."""
        results: list[Any] = [None] * self.world_size
        counts: dict[int, dict[str, int]] = {}
        errors: dict[int, RankError] = {}
        dead: dict[int, str] = {}
        pending = set(range(self.world_size))
        group_intact = True
        deadline = time.monotonic() + timeout
        stuck_reason = f"no answer within {timeout:g} s while {doing}"
        while pending and (remaining := deadline - time.monotonic()) > 0:
            waitables: dict[Any, int] = {self._conns[rank]: rank for rank in pending}
            waitables.update({self._procs[rank].sentinel: rank for rank in pending})
            for ready in wait(list(waitables), remaining):
                rank = waitables[ready]
                if rank not in pending:  # its pipe and its sentinel both fired
                    continue
                pending.discard(rank)
                reply = self._receive(rank)
                if reply is None:
                    dead[rank] = self._death(rank)
                    continue
                status, value, intact, counts[rank] = reply
                group_intact = group_intact and intact
                if status == "ok":
                    results[rank] = value
                else:
                    errors[rank] = value
            if (errors or dead) and deadline > time.monotonic() + ERROR_GRACE_S:
                deadline = time.monotonic() + ERROR_GRACE_S
                stuck_reason = f"no answer within {ERROR_GRACE_S:g} s after another rank failed"
        stuck = sorted(pending)
        stacks, stuck_counts = self._ask_stuck(stuck) if stuck else ({}, {})
        out_of_step = "" if stuck or dead else out_of_step_report(counts)
        broken = stuck or dead or out_of_step or not group_intact
        if broken or not all(p.is_alive() for p in self._procs):
            self.close(grace=0)
        if errors or dead or stuck:
            raise RankFailure(
                self.world_size, errors, dead, stuck, stuck_reason, stacks, stuck_counts
            )
        if out_of_step:
            warnings.warn(out_of_step, WorldReplacedWarning, stacklevel=3)
        return results

    def _receive(self, rank: int) -> tuple[str, Any, bool, dict[str, int]] | None:
        """Read a rank's reply; None if it died without one."""
        conn = self._conns[rank]
        try:
            if not conn.poll():  # woken by its sentinel: exited, nothing left to read
                return None
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return None
        try:
            return cloudpickle.loads(data)
        except Exception as exc:  # noqa: BLE001 - any unpickling error is the rank's failure
            error = RankError(
                type(exc).__name__,
                f"reply could not be unpickled: {exc}",
                traceback.format_exc(),
            )
            return "error", error, True, {}

    def _death(self, rank: int) -> str:
        proc = self._procs[rank]
        proc.join(1.0)
        code = proc.exitcode
        if code is None:
            return "closed its pipe but is still running"
        if code < 0:
            return f"died, killed by signal {signal.Signals(-code).name}"
        return f"died with exit code {code}"

    def close(self, grace: float = 2.0) -> None:
        """Stop the ranks: they exit on EOF; stragglers after `grace` s are terminated."""
        if self._closed:
            return
        self._closed = True
        for conn in self._conns:
            conn.close()
        deadline = time.monotonic() + grace
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self._procs:
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self._store = None
        with contextlib.suppress(OSError):
            self._stack_dir.cleanup()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "alive" if self.alive else "closed" if self._closed else "broken"
        return f"World(world_size={self.world_size}, pids={self.pids}, {state})"


# --- shared worlds: one per size per process, so test cases don't pay for spawning ---------

_worlds: dict[int, World] = {}


def get_world(world_size: int) -> World:
    """The shared World of `world_size` ranks for this process, respawned if it was torn down."""
    world = _worlds.get(world_size)
    if world is None or not world.alive:
        if world is not None:
            world.close(grace=0)
        world = _worlds[world_size] = World(world_size)
    return world


def shutdown_worlds() -> None:
    """Close every shared world (also run at exit)."""
    while _worlds:
        _, world = _worlds.popitem()
        world.close()


atexit.register(shutdown_worlds)


def run_on_ranks(
    fn: Callable[..., Any],
    /,
    *args: Any,
    world_size: int = 2,
    timeout: float | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run `fn(*args, **kwargs)` on every rank of the shared world of `world_size`."""
    return get_world(world_size).run(fn, *args, timeout=timeout, **kwargs)
