"""Where the ring's time goes: ring variants vs all-gather vs one process, same run.

`python packages/dt-cp/benchmarks/ring_profile.py [S] [rounds] [variant,...]` (default
16384, 3, every variant): causal SDPA fwd+bwd, head-tail balanced, 2 ranks x 1 thread,
rounds alternating
  ring          (balanced chunk order, 2 chunks in flight, kernel calls of up to 2048 rows
                 on the own block and 1024 query rows against a received chunk, the own
                 block's backward with nothing in flight: the default)
  ring-chunk2048 (2048 query rows against a received chunk too, as before)
  ring-before   (that, the own block overlapping, and sent slices copied: the ring before
                 its memory work, except that each call's dq/dk/dv are freed sooner)
  ring-1024     (1024-row calls on the own block too)
  ring-own-overlap (half the own block's backward while the first chunks arrive, half
                 while the last dK/dV share goes home, as before)
  ring-depth1   (balanced order, 1 chunk in flight)
  ring-natural1 (natural chunk order, 1 chunk in flight: the previous ring)
  allgather     (whole blocks point to point, half the own block computed while they
                 arrive and half while the dK/dV shares go home point to point, kernel
                 calls of up to 4096 rows: the default)
  allgather-own-first (the whole own block first: the last share's trip not overlapped)
  allgather-1024 (kernel calls of up to 1024 rows, as before)
and one process with 2 threads (the other rank idle in a barrier). Per rank it reports the
forward time, the time spent waiting on exchanges (fwd+bwd) and in log-sum-exp merges, and
both ranks' CPU time (gloo's threads included) over the one process's: extra work, which
a loaded host inflates less than wall time (OpenMP's spinning threads count for the one
process). Ratios are within a round; the host is shared, so report `uptime` with them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import sys
import time
from typing import Any

HEADS, DIM = 2, 128


def _rank_main(rank: int, port: int, seq: int, rounds: int, only: list, queue: Any) -> None:
    import torch

    torch.set_num_threads(1)
    import dt_cp
    import torch.distributed as dist
    import torch.nn.functional as F
    from dt_cp import algorithms, blocks, comm, exchange
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    balanced = exchange.chunk_order

    def natural(shards, receiver, source, causal, chunks):
        return tuple(range(chunks))

    timers = {"wait": 0.0, "merge": 0.0}
    wait, merge = comm.RingStep.wait, blocks.Accumulator.merge

    def timed_wait(self):
        start = time.perf_counter()
        result = wait(self)
        timers["wait"] += time.perf_counter() - start
        return result

    def timed_merge(self, *args):
        start = time.perf_counter()
        merge(self, *args)
        timers["merge"] += time.perf_counter() - start

    comm.RingStep.wait, blocks.Accumulator.merge = timed_wait, timed_merge
    gen = torch.Generator().manual_seed(0)
    full = [torch.randn(1, HEADS, seq, DIM, generator=gen) for _ in range(3)]
    with dt_cp.settings(load_balancer="head_tail"):
        qkv = [dt_cp.shard_sequence(t, mesh, 2).requires_grad_() for t in full]
    defaults = {
        (exchange, "chunk_order"): balanced,
        (algorithms, "RING_PREFETCH_CHUNKS"): algorithms.RING_PREFETCH_CHUNKS,
        (algorithms, "OWN_BLOCK_LAST"): algorithms.OWN_BLOCK_LAST,
        (algorithms, "RING_OWN_BLOCK_OVERLAP"): algorithms.RING_OWN_BLOCK_OVERLAP,
        (blocks, "GATHERED_RANGE_ROWS"): blocks.GATHERED_RANGE_ROWS,
        (blocks, "RING_RANGE_ROWS"): blocks.RING_RANGE_ROWS,
        (blocks, "RING_CHUNK_RANGE_ROWS"): blocks.RING_CHUNK_RANGE_ROWS,
        (comm, "reduce_scatter_seq"): comm.reduce_scatter_seq,
        (comm, "MAX_MESSAGES_PER_TENSOR"): comm.MAX_MESSAGES_PER_TENSOR,
    }
    variants: tuple[tuple[str, str, dict], ...] = (
        ("ring", "ring", {}),
        ("ring-chunk2048", "ring", {"RING_CHUNK_RANGE_ROWS": 2048}),
        (
            "ring-before",
            "ring",
            {
                "RING_CHUNK_RANGE_ROWS": 2048,
                "RING_OWN_BLOCK_OVERLAP": True,
                "MAX_MESSAGES_PER_TENSOR": 0,
            },
        ),
        ("ring-1024", "ring", {"RING_RANGE_ROWS": 1024}),
        ("ring-own-overlap", "ring", {"RING_OWN_BLOCK_OVERLAP": True}),
        ("ring-depth1", "ring", {"RING_PREFETCH_CHUNKS": 1}),
        ("ring-natural1", "ring", {"RING_PREFETCH_CHUNKS": 1, "chunk_order": natural}),
        ("allgather", "allgather", {}),
        ("allgather-own-first", "allgather", {"OWN_BLOCK_LAST": 0.0}),
        ("allgather-1024", "allgather", {"GATHERED_RANGE_ROWS": 1024}),
        # (the traced all-gather is the "traced" path, which plan.choose_path picks
        # under torch.compile only: profile it with a compiled step)
    )
    variants = tuple(v for v in variants if not only or v[0] in only)
    results: dict[str, list] = {}

    def step(name: str, algorithm: str, changes: dict) -> None:
        for (module, attr), value in defaults.items():
            setattr(module, attr, changes.get(attr, value))
        with dt_cp.settings(algorithm=algorithm, load_balancer="head_tail"):
            for t in qkv:
                t.grad = None
            dist.barrier()
            timers["wait"] = timers["merge"] = 0.0
            start, cpu = time.perf_counter(), time.process_time()
            out = F.scaled_dot_product_attention(*qkv, is_causal=True)
            forward = time.perf_counter() - start
            out.sum().backward()
            total = time.perf_counter() - start
            cpu = time.process_time() - cpu
        results.setdefault(name, []).append((total, forward, timers["wait"], timers["merge"], cpu))

    step("warm-up", "ring", {})
    step("warm-up", "allgather", {})
    for _ in range(rounds):
        for variant in variants:
            step(*variant)
        dist.barrier()
        if rank == 0:
            torch.set_num_threads(2)
            leaves = [t.clone().requires_grad_() for t in full]
            start, cpu = time.perf_counter(), time.process_time()
            F.scaled_dot_product_attention(*leaves, is_causal=True).sum().backward()
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
            results.setdefault("single", []).append((elapsed, 0, 0, 0, cpu))
            torch.set_num_threads(1)
        dist.barrier()
    for (module, attr), value in defaults.items():
        setattr(module, attr, value)
    queue.put((rank, results))
    dist.destroy_process_group()


def main() -> None:
    seq = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    only = sys.argv[3].split(",") if len(sys.argv) > 3 else []
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_rank_main, args=(r, port, seq, rounds, only, queue)) for r in (0, 1)
    ]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=3600) for _ in procs)
    for p in procs:
        p.join()
    print(f"load average before/after: {os.getloadavg()}")
    single = results[0]["single"]
    for name in [v for v in results[0] if v not in ("warm-up", "single")]:
        for i, one in enumerate(single):
            rows = [results[r][name][i] for r in (0, 1)]
            total = max(row[0] for row in rows)
            cpu = sum(row[4] for row in rows) / one[4]  # both ranks' CPU time / one process's
            gather = max(results[r]["allgather"][i][0] for r in (0, 1))
            parts = "  ".join(
                f"r{r}: fwd {row[1]:.2f} wait {row[2]:.2f} merge {row[3]:.2f}"
                for r, row in enumerate(rows)
            )
            print(
                f"round {i} {name:19s} {total:6.2f} s  /one process {total / one[0]:.2f}  "
                f"/all-gather {total / gather:.2f}  cpu/one process {cpu:.2f}  {parts}"
            )
    print("one process, 2 threads:", [round(x[0], 2) for x in single])
    best_single = min(x[0] for x in single)
    for name in [v for v in results[0] if v not in ("warm-up", "single")]:
        best = min(max(results[r][name][i][0] for r in (0, 1)) for i in range(len(single)))
        print(
            f"best of rounds {name:19s} {best:6.2f} s  /best one process {best / best_single:.2f}"
        )


if __name__ == "__main__":
    main()
