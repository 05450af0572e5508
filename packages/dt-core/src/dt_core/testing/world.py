"""Worlds of rank processes joined in one gloo process group, shared across test cases.

Spawning a process and importing torch is the main cost of a multi-rank test, so a World
keeps its ranks alive and runs many test bodies on them in turn. A rank that raises is
reported with its traceback; a rank that dies or hangs fails the run within a deadline and
the world is torn down, so the next user gets a fresh one.

torch is imported lazily: this module is imported by the pytest plugin in every test run.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

import cloudpickle

from dt_core.testing import pickling

if TYPE_CHECKING:
    from multiprocessing.context import SpawnProcess

    from typing_extensions import Self

TIMEOUT_ENV = "DT_TEST_RANK_TIMEOUT"
DEFAULT_TIMEOUT_S = 120.0
# After one rank fails, its peers are usually blocked in a collective waiting for it: give
# them this long to answer (or fail too) before calling them stuck.
ERROR_GRACE_S = 5.0
_HOST = "127.0.0.1"


def default_timeout() -> float:
    """Per-run deadline in seconds: $DT_TEST_RANK_TIMEOUT, else 120."""
    return float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))


@dataclass(frozen=True)
class RankError:
    """An exception raised on a rank, kept as text: the exception may not unpickle here."""

    type_name: str
    message: str
    traceback: str


class RankFailure(Exception):
    """Some ranks raised, died or did not answer in time.

    Deliberately not an AssertionError: the cause may be a crash or a hang, not a check.
    """

    def __init__(
        self,
        world_size: int,
        errors: dict[int, RankError],
        dead: dict[int, str],
        stuck: list[int],
        stuck_reason: str,
    ) -> None:
        self.world_size = world_size
        self.errors = errors
        self.dead = dead
        self.stuck = stuck
        self.stuck_reason = stuck_reason
        lines = []
        for rank in sorted(errors):
            err = errors[rank]
            # The first line of the message heads the block; the traceback ends with all of it.
            summary = err.message.strip().partition("\n")[0]
            lines.append(f"rank {rank}: {err.type_name}" + (f": {summary}" if summary else ""))
            lines.append(_indent(err.traceback.rstrip()))
        lines += [f"rank {rank}: {how}" for rank, how in sorted(dead.items())]
        lines += [f"rank {rank}: stuck, {stuck_reason}" for rank in stuck]
        failed = len(errors) + len(dead) + len(stuck)
        lines.append(f"({failed} of {world_size} ranks failed)")
        super().__init__("\n".join(lines))

    def __reduce__(self) -> tuple[Any, ...]:
        fields = (self.world_size, self.errors, self.dead, self.stuck, self.stuck_reason)
        return type(self), fields


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


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
        store = dist.TCPStore(_HOST, 0, is_master=True, wait_for_workers=False)
        self._store: dist.TCPStore | None = store
        timeout = default_timeout() if startup_timeout is None else startup_timeout
        ctx = mp.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs: list[SpawnProcess] = []
        try:
            for rank in range(world_size):
                ours, theirs = ctx.Pipe()
                self._conns.append(ours)
                args = (rank, world_size, store.port, list(sys.path), theirs, timeout)
                proc = ctx.Process(
                    target=_rank_main, args=args, name=f"dt-rank-{rank}", daemon=True
                )
                proc.start()
                self._procs.append(proc)
                theirs.close()
            self._collect(timeout, "joining the process group")
        except BaseException:
            self.close(grace=0)
            raise

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
                status, value, intact = reply
                group_intact = group_intact and intact
                if status == "ok":
                    results[rank] = value
                else:
                    errors[rank] = value
            if (errors or dead) and deadline > time.monotonic() + ERROR_GRACE_S:
                deadline = time.monotonic() + ERROR_GRACE_S
                stuck_reason = f"no answer within {ERROR_GRACE_S:g} s after another rank failed"
        stuck = sorted(pending)
        if stuck or dead or not group_intact or not all(p.is_alive() for p in self._procs):
            self.close(grace=0)
        if errors or dead or stuck:
            raise RankFailure(self.world_size, errors, dead, stuck, stuck_reason)
        return results

    def _receive(self, rank: int) -> tuple[str, Any, bool] | None:
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
            return "error", error, True

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


# --- the rank side ------------------------------------------------------------------------


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    sys_path: list[str],
    conn: Connection,
    startup_timeout: float,
) -> None:
    """Entry point of a rank process: join the group, then run tasks until the pipe closes."""
    sys.path[:] = sys_path  # so test modules and helpers import as in the parent
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _exit_with_parent()
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # N ranks share few cores
        store = dist.TCPStore(
            _HOST, port, is_master=False, timeout=timedelta(seconds=startup_timeout)
        )
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    except BaseException as exc:  # noqa: BLE001 - report why this rank could not start
        _reply(conn, "error", _rank_error(exc), False)
        _exit(1)
    _reply(conn, "ok", None, True)
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):  # parent closed the world or is gone
            _exit(0)
        try:
            sys_path, fn, args, kwargs = cloudpickle.loads(data)
            sys.path[:] = sys_path
            status, value = "ok", fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - pytest.fail/skip raise BaseException too
            status, value = "error", _rank_error(exc, in_task=True)
        _flush()  # the test's prints belong in this test's captured output, not a later one's
        # A task that destroyed the default group leaves a rank later tasks can't use.
        _reply(conn, status, value, dist.is_initialized())


def _rank_error(exc: BaseException, *, in_task: bool = False) -> RankError:
    if in_task and isinstance(exc, Exception):  # name the inactive plugins for its op
        from dt_core.inactive_notes import explain

        explain(exc)
    tb = exc.__traceback__
    if in_task and tb is not None:
        tb = tb.tb_next  # drop the harness's own frame: the report starts at the test body
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return RankError(type(exc).__name__, str(exc), text)


def _reply(conn: Connection, status: str, value: Any, group_intact: bool) -> None:
    try:
        data = pickling.dumps((status, value, group_intact))
    except Exception as exc:  # noqa: BLE001 - an unpicklable result fails the run, not the rank
        error = RankError(
            type(exc).__name__,
            f"result could not be pickled: {exc}",
            traceback.format_exc(),
        )
        data = pickling.dumps(("error", error, group_intact))
    try:
        conn.send_bytes(data)
    except OSError:
        _exit(1)


def _exit_with_parent() -> None:
    """Exit when the parent dies: a rank blocked in a collective never sees EOF on its pipe."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        _exit(1)

    threading.Thread(target=watch, name="dt-orphan-watch", daemon=True).start()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _exit(code: int) -> None:
    """Exit now: interpreter teardown can block on the process group's peers."""
    _flush()
    os._exit(code)
