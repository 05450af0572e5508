"""The rank side of a World: join the gloo group, then run the parent's tasks until its
pipe closes, replying with each result or error, and the operations issued per group.

A rank the parent finds stuck is asked where it is twice: its Python stacks (SIGUSR1,
written by faulthandler) and, through a request file its watch thread looks for, the
operations it has issued per group since its task began and the last few of them (torch's
flight recorder, which ranks keep on: each names its group, sequence number and sizes).
Both are read while its main thread is blocked, in a collective say, which no Python
signal handler would interrupt.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from dt_core.testing import pickling
from dt_core.testing.rank_failure import RankError

HOST = "127.0.0.1"
# How often the watch thread checks on the parent and for a request for operation counts.
WATCH_INTERVAL_S = 0.25

# How many operations torch's flight recorder keeps, and how many a stuck report shows.
FLIGHT_RECORDER_ENTRIES = "32"
RECENT_SHOWN = 6

# Operations issued per group when the current task began (`counts_request`).
_task_start_counts: dict[str, int] = {}


def counts_request(stack_file: str) -> tuple[str, str]:
    """(file whose existence asks a rank for its operation counts, file it answers in)."""
    return stack_file + ".ask", stack_file + ".counts"


def rank_main(
    rank: int,
    world_size: int,
    port: int,
    sys_path: list[str],
    conn: Connection,
    startup_timeout: float,
    stack_file: str,
) -> None:
    """Entry point of a rank process: join the group, then run tasks until the pipe closes."""
    sys.path[:] = sys_path  # so test modules and helpers import as in the parent
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # The parent asks a stuck rank where it is (SIGUSR1); the file stays open for the process.
    faulthandler.register(signal.SIGUSR1, file=open(stack_file, "w"), all_threads=True)  # noqa: SIM115
    _watch(stack_file)
    try:
        from dt_core.compat.process_groups import FLIGHT_RECORDER_ENV

        os.environ.setdefault(FLIGHT_RECORDER_ENV, FLIGHT_RECORDER_ENTRIES)  # before any group
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # N ranks share few cores
        store = dist.TCPStore(
            HOST, port, is_master=False, timeout=timedelta(seconds=startup_timeout)
        )
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    except BaseException as exc:  # noqa: BLE001 - report why this rank could not start
        _reply(conn, "error", _rank_error(exc), False)
        _exit(1)
    _reply(conn, "ok", None, True)
    from dt_core.compat.process_groups import collective_counts
    from dt_core.remembered import forget

    _task_start_counts.update(collective_counts())
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
        forget()  # what plugins recorded in this task is not the next task's
        # A task that destroyed the default group leaves a rank later tasks can't use.
        counts = collective_counts()
        _reply(conn, status, value, dist.is_initialized(), counts)
        _task_start_counts.clear()  # where the next task starts: nothing is issued between
        _task_start_counts.update(counts)


def _rank_error(exc: BaseException, *, in_task: bool = False) -> RankError:
    if in_task and isinstance(exc, Exception):  # name the inactive plugins for its op
        from dt_core.inactive_notes import explain

        explain(exc)
    tb = exc.__traceback__
    if in_task and tb is not None:
        tb = tb.tb_next  # drop the harness's own frame: the report starts at the test body
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return RankError(type(exc).__name__, str(exc), text)


def _reply(
    conn: Connection,
    status: str,
    value: Any,
    group_intact: bool,
    counts: dict[str, int] | None = None,
) -> None:
    """Send a task's outcome, whether the default group survived it, and the number of
    operations issued on each group (checked across ranks by the parent)."""
    counts = counts or {}
    try:
        data = pickling.dumps((status, value, group_intact, counts))
    except Exception as exc:  # noqa: BLE001 - an unpicklable result fails the run, not the rank
        error = RankError(
            type(exc).__name__,
            f"result could not be pickled: {exc}",
            traceback.format_exc(),
        )
        data = pickling.dumps(("error", error, group_intact, counts))
    try:
        conn.send_bytes(data)
    except OSError:
        _exit(1)


def _watch(stack_file: str) -> None:
    """Exit when the parent dies (a rank blocked in a collective never sees EOF on its
    pipe), and answer its requests for operation counts."""
    parent = os.getppid()
    ask, answer = counts_request(stack_file)

    def watch() -> None:
        while os.getppid() == parent:
            if os.path.exists(ask):
                _write_counts(answer)
                with contextlib.suppress(OSError):
                    os.remove(ask)
            time.sleep(WATCH_INTERVAL_S)
        _exit(1)

    threading.Thread(target=watch, name="dt-orphan-watch", daemon=True).start()


def _write_counts(path: str) -> None:
    """The operations issued per group when the task began and now, and the last few, as
    JSON (written whole, then renamed, so the parent never reads half of it)."""
    with contextlib.suppress(Exception):  # a diagnostic: never the reason a rank fails
        from dt_core.compat.process_groups import collective_counts, recent_operations

        data = {
            "start": dict(_task_start_counts),
            "now": collective_counts(),
            "recent": recent_operations(RECENT_SHOWN),
        }
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(path + ".tmp", path)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _exit(code: int) -> None:
    """Exit now: interpreter teardown can block on the process group's peers."""
    _flush()
    os._exit(code)
