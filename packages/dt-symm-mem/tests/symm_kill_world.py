"""2-rank worlds of our own (not the shared test world), for the tests that kill a rank.

    python symm_kill_world.py OUTDIR MODE:SEGMENTS [MODE:SEGMENTS ...]

Each scenario runs in a fresh world of two processes forked from this one (torch is
imported once, here), writing to OUTDIR/MODE-SEGMENTS/.

MODE: "normal" (set up the workspace, exit normally), "kill" (after setup rank 1
SIGKILLs itself and rank 0 runs another all-gather and a barrier, which must fail with a
clear error naming the dead peer) or "kill-creator" (rank 0 SIGKILLs itself right after
creating the segment, before any peer knows of it; rank 1's setup must fail, not hang).
SEGMENTS: "memfd" (the default mechanism) or "named" (anonymous segments made
unavailable, so the /dev/shm path is used). Each rank writes rankN.json to its folder.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def _write(outdir: str, rank: int, report: dict) -> None:
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


def _kill_myself_after_create(outdir: str) -> None:
    from dt_symm_mem import workspace

    def hook(kind: str, where: str) -> None:
        target = os.readlink(where) if where.startswith("/proc/") else where
        _write(outdir, 0, {"kind": kind, "where": where, "target": target})
        os.kill(os.getpid(), signal.SIGKILL)

    workspace.after_create = hook


def rank_main(rank: int, mode: str, segments: str, outdir: str) -> None:
    from datetime import timedelta

    import dt_symm_mem
    import torch
    import torch.distributed as dist
    from dt_symm_mem import segment
    from dt_symm_mem.workspace import get_workspace

    if segments == "named":
        segment.memfd_supported = lambda: False  # as on a host without memfd_create
    dist.init_process_group(
        "gloo",
        init_method=f"file://{outdir}/rendezvous",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=60),
    )
    group = dist.group.WORLD
    x = torch.full((256,), float(rank))
    if mode == "kill-creator":
        if rank == 0:
            _kill_myself_after_create(outdir)
        start = time.monotonic()
        try:
            dt_symm_mem.low_contention_all_gather(x, group)
            report = {"error": None}
        except Exception as error:  # noqa: BLE001 - reported to the test
            report = {"error": f"{type(error).__name__}: {error}"}
        report["seconds"] = time.monotonic() - start
        _write(outdir, rank, report)
        os._exit(0)  # gloo's teardown would wait for the dead peer
    out = dt_symm_mem.low_contention_all_gather(x, group)
    handle = get_workspace(group, 0)
    report = {
        "name": handle.name,
        "mechanism": handle.mechanism,
        "ok": out.tolist() == [0.0] * 256 + [1.0] * 256,
    }
    if mode == "kill" and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "kill":
        time.sleep(0.5)  # let rank 1 die first
        start = time.monotonic()
        try:
            dt_symm_mem.low_contention_all_gather(x, group)
            report["error"] = None
        except Exception as error:  # noqa: BLE001 - reported to the test
            report["error"] = f"{type(error).__name__}: {error}"
        report["seconds"] = time.monotonic() - start
        start = time.monotonic()
        try:
            handle.barrier(1)
            report["barrier_error"] = None
        except Exception as error:  # noqa: BLE001 - reported to the test
            report["barrier_error"] = f"{type(error).__name__}: {error}"
        report["barrier_seconds"] = time.monotonic() - start
    _write(outdir, rank, report)
    if mode == "normal":
        # both ranks done before teardown: gloo can abort at exit when one rank tears its
        # pairs down while the other still uses them ("terminate called ...", seen once)
        dist.barrier()
        dist.destroy_process_group()
    else:
        os._exit(0)  # gloo's teardown would wait for the dead peer


def main() -> int:
    import multiprocessing as mp

    # imported once, here: the forked ranks inherit them (a rank importing them itself
    # takes seconds on a loaded 2-core machine)
    import dt_symm_mem.api  # noqa: F401
    import dt_symm_mem.ops  # noqa: F401
    import dt_symm_mem.workspace  # noqa: F401

    root, scenarios = sys.argv[1], sys.argv[2:]
    ctx = mp.get_context("fork")
    for scenario in scenarios:
        mode, segments = scenario.split(":")
        outdir = os.path.join(root, f"{mode}-{segments}")
        os.makedirs(outdir)
        args = [(r, mode, segments, outdir) for r in range(2)]
        procs = [ctx.Process(target=rank_main, args=a) for a in args]
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + 120
        for proc in procs:
            proc.join(timeout=max(1.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.is_alive():  # hung: the test fails on its exit code (never left running)
                proc.kill()
                proc.join()
        codes = [proc.exitcode for proc in procs]
        with open(os.path.join(outdir, "exitcodes.json"), "w") as f:
            json.dump(codes, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
