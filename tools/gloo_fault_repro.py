"""Loop, with torch alone, the collectives one of dt-conv's exactness cases issues on two
gloo ranks, until a rank crashes or hangs.

    python tools/gloo_fault_repro.py [--iterations N] [--port P]

Each iteration does what a sharded conv check does on the default gloo group, from one
thread: blocking scatters and broadcasts (`distribute_tensor`), functional all-to-alls
with compute between start and wait (the halo exchange, some with no rows one way), a
functional all-reduce (the weight gradient) and functional all-gathers (`full_tensor`).
Every rank issues the same operations in the same order, so a matched run never stops.

On 2026-11-29, on 2 cores, a rank died with SIGSEGV after 5,000 to 67,000 iterations in
4 of 7 runs of this loop (torch 2.13.0 and 2.14.1), in a functional all-gather or a
blocking scatter, each while another loop or a test run shared the cores; this script
with one loop of blocking operations beside it ran 80,000 iterations without one.
Functional all-gathers alone ran 200,000 iterations without a fault; keeping every input
alive until its wait did not prevent one. Run two at once (other ports) to load the
cores. A fault like it inside the gloo backend is the likeliest reading of the rare CI
hang whose two ranks were stopped where no matched sequence of operations can put them
(docs/ci.md). Each rank arms faulthandler (fatal signals, and a 60 s watchdog), writing
to build/gloo-fault-<port>-rank<r>.txt.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "build"


def _rank(rank: int, port: int, iterations: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    report = open(OUT / f"gloo-fault-{port}-rank{rank}.txt", "w")  # noqa: SIM115 - kept for faulthandler
    faulthandler.enable(file=report, all_threads=True)
    fc = torch.ops._c10d_functional
    name = dist.group.WORLD.group_name
    f64 = torch.float64
    started = time.monotonic()
    for it in range(iterations):
        faulthandler.dump_traceback_later(60, exit=True, file=report)
        x = torch.empty(2, 3, 6, 11, dtype=f64)
        dist.scatter(x, [torch.randn(2, 3, 6, 11, dtype=f64)] * 2 if rank == 0 else None, src=0)
        dist.broadcast(torch.randn(3, 2, 3, 3, dtype=f64), 0)
        dist.broadcast(torch.randn(2, dtype=f64), 0)
        rows = it % 3  # halo rows: none, or one way, or both ways
        back = rows if it % 2 else 0
        send, recv = ([0, rows], [0, back]) if rank == 0 else ([back, 0], [rows, 0])
        halo = fc.all_to_all_single(torch.randn(sum(send), 3, 11, dtype=f64), recv, send, name)
        torch.nn.functional.conv2d(torch.randn(2, 3, 8, 11), torch.randn(3, 3, 3, 3))
        fc.wait_tensor(halo)
        g = torch.empty(2, 2, 13, 23, dtype=f64)
        dist.scatter(g, [torch.randn(2, 2, 13, 23, dtype=f64)] * 2 if rank == 0 else None, src=0)
        back_halo = fc.all_to_all_single(torch.randn(sum(recv), 2, 23, dtype=f64), send, recv, name)
        fc.wait_tensor(back_halo)
        fc.wait_tensor(fc.all_reduce(torch.randn(3, 2, 3, 3, dtype=f64), "sum", name))
        for shape in ((1, 3, 13, 23), (1, 3, 6, 11)):
            fc.wait_tensor(fc.all_gather_into_tensor(torch.randn(*shape, dtype=f64), 2, name))
        if rank == 0 and it % 1000 == 0:
            print(f"{it} iterations, {time.monotonic() - started:.0f} s", flush=True)
    faulthandler.cancel_dump_traceback_later()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=100_000)
    parser.add_argument("--port", type=int, default=29_731)
    args = parser.parse_args()
    import torch.multiprocessing as mp

    OUT.mkdir(exist_ok=True)
    try:
        mp.spawn(_rank, args=(args.port, args.iterations), nprocs=2)
    except Exception as exc:  # noqa: BLE001 - a rank's crash is the finding
        print(f"a rank failed: {exc}", file=sys.stderr)
        for rank in range(2):
            path = OUT / f"gloo-fault-{args.port}-rank{rank}.txt"
            if path.exists() and path.stat().st_size:
                print(f"--- rank {rank} ({path}):\n{path.read_text()}", file=sys.stderr)
        return 1
    print(f"{args.iterations} iterations, no fault (pid {os.getpid()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
