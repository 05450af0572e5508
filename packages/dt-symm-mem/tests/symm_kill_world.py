"""A 2-rank world of our own (not the shared test world), for the tests that kill a rank.

    python symm_kill_world.py MODE OUTDIR     MODE: "normal" or "kill"

Each rank sets up the shared-memory workspace, writes the segment's name to OUTDIR, and
then either exits normally ("normal") or rank 1 SIGKILLs itself and rank 0 runs another
all-gather, which must fail with a clear error naming the dead peer ("kill").
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def rank_main(rank: int, mode: str, outdir: str) -> None:
    import dt_symm_mem
    import torch
    import torch.distributed as dist
    from dt_symm_mem.workspace import get_workspace

    dist.init_process_group(
        "gloo", init_method=f"file://{outdir}/rendezvous", rank=rank, world_size=2
    )
    group = dist.group.WORLD
    x = torch.full((256,), float(rank))
    out = dt_symm_mem.low_contention_all_gather(x, group)
    handle = get_workspace(group, 0)
    report = {"name": handle.name, "ok": out.tolist() == [0.0] * 256 + [1.0] * 256}
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
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    if mode == "normal":
        # both ranks done before teardown: gloo can abort at exit when one rank tears its
        # pairs down while the other still uses them ("terminate called ...", seen once)
        dist.barrier()
        dist.destroy_process_group()
    else:
        os._exit(0)  # gloo's teardown would wait for the dead peer


def main() -> int:
    import multiprocessing as mp

    mode, outdir = sys.argv[1], sys.argv[2]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, mode, outdir)) for r in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    codes = [proc.exitcode for proc in procs]
    with open(os.path.join(outdir, "exitcodes.json"), "w") as f:
        json.dump(codes, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
