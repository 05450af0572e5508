"""dt-cp benchmark: ring vs all-gather memory, time against one process, causal balance.

    python packages/dt-cp/benchmarks/run.py [--quick] --json OUT.json

Spawns 2 CPU ranks (gloo on 127.0.0.1, one thread each) and times causal SDPA forward +
backward on sequence-sharded DTensors; the single-process reference runs the same
attention with 2 threads (same total cores), in a fresh process before and after the
ranks (the faster run counts). Peak memory per rank is the rise of the
resident set (VmHWM, reset before each step; glibc told to return large blocks at once)
over the inputs already allocated, after one unmeasured warm-up step, lowest over the
measured steps (RSS also moves with buffers freed late, so one step can read high or
low). Per-rank work is the count of (query, key) score pairs each rank's kernels computed.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from typing import Any

RANKS = 2
HEADS, DIM = 2, 128


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _case(mesh: Any, seq: int, algorithm: str, balancer: str, repeats: int) -> dict:
    import dt_cp
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from dt_cp.blocks import COUNTERS

    gen = torch.Generator().manual_seed(0)
    full = [torch.randn(1, HEADS, seq, DIM, generator=gen) for _ in range(3)]
    with dt_cp.settings(algorithm=algorithm, load_balancer=balancer):
        qkv = [dt_cp.shard_sequence(t, mesh, 2).requires_grad_() for t in full]
        del full
        # One unmeasured step first: one-time set-up (gloo pair buffers, lazy imports,
        # thread pools) is not per-step memory. Peak = lowest over the measured steps.
        F.scaled_dot_product_attention(*qkv, is_causal=True).sum().backward()
        best = float("inf")
        peak_mb = float("inf")
        work = 0
        for _ in range(repeats):
            for t in qkv:
                t.grad = None
            dist.barrier()
            base = _rss_kb("VmRSS:")
            _reset_peak()
            COUNTERS.reset()
            start = time.perf_counter()
            out = F.scaled_dot_product_attention(*qkv, is_causal=True)
            out.sum().backward()
            best = min(best, time.perf_counter() - start)
            peak_mb = min(peak_mb, (_rss_kb("VmHWM:") - base) / 1024)
            work = COUNTERS.get("score_elements")
            del out
    return _over_ranks(best, work, peak_mb=peak_mb)


def document_lengths(seq: int) -> tuple[int, ...]:
    """Uneven packed documents: half, an eighth, a quarter and the rest of the sequence."""
    lengths = [seq // 2, seq // 8, seq // 4]
    return (*lengths, seq - sum(lengths))


def _document_case(mesh: Any, seq: int, balancer: str) -> dict:
    """Forward flex attention with a document + causal BlockMask; per-rank work counted."""
    import dt_cp
    import torch
    import torch.distributed as dist
    from dt_cp.blocks import COUNTERS

    lengths = document_lengths(seq)
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))

    def mask_mod(b, h, q, kv):
        return (doc[q] == doc[kv]) & (kv <= q)

    block_mask = dt_cp.create_block_mask(mask_mod, None, None, seq, seq)
    gen = torch.Generator().manual_seed(0)
    full = [torch.randn(1, HEADS, seq, DIM, generator=gen) for _ in range(3)]
    with dt_cp.settings(algorithm="ring", load_balancer=balancer, documents=lengths):
        qkv = [dt_cp.shard_sequence(t, mesh, 2) for t in full]
        dist.barrier()
        COUNTERS.reset()
        start = time.perf_counter()
        with torch.no_grad():
            dt_cp.flex_attention(*qkv, block_mask=block_mask)
        elapsed = time.perf_counter() - start
        work = COUNTERS.get("score_elements")
    return _over_ranks(elapsed, work)


def _over_ranks(time_s: float, work: int, **highest: float) -> dict[str, float]:
    """Every rank's numbers, all-gathered: the slowest time, the highest of each of
    `highest` (e.g. peak memory), and the most and least work."""
    import torch
    import torch.distributed as dist

    stats = torch.tensor([time_s, *highest.values(), work], dtype=torch.float64)
    gathered = [torch.zeros_like(stats) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, stats)
    rows = torch.stack(gathered)
    result = {name: float(rows[:, i].max()) for i, name in enumerate(["time_s", *highest])}
    return {**result, "work_max": float(rows[:, -1].max()), "work_min": float(rows[:, -1].min())}


def _rank_main(
    rank: int, port: int, cases: list, doc_cases: list, repeats: int, queue: Any
) -> None:
    import torch

    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=RANKS
    )
    mesh = init_device_mesh("cpu", (RANKS,))
    results = []
    for seq, algorithm, balancer in cases:
        result = _case(mesh, seq, algorithm, balancer, repeats)
        results.append(((seq, algorithm, balancer), result))
    for seq, balancer in doc_cases:
        results.append(((seq, "document", balancer), _document_case(mesh, seq, balancer)))
    if rank == 0:
        queue.put(results)
    dist.destroy_process_group()


def _single_process(seq: int, repeats: int) -> tuple[float, float]:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(RANKS)
    gen = torch.Generator().manual_seed(0)
    qkv = [torch.randn(1, HEADS, seq, DIM, generator=gen).requires_grad_() for _ in range(3)]
    best, peak = float("inf"), 0.0
    for _ in range(repeats):
        for t in qkv:
            t.grad = None
        base = _rss_kb("VmRSS:")
        _reset_peak()
        start = time.perf_counter()
        F.scaled_dot_product_attention(*qkv, is_causal=True).sum().backward()
        best = min(best, time.perf_counter() - start)
        peak = max(peak, (_rss_kb("VmHWM:") - base) / 1024)
    return best, peak


def _single_process_child(seq: int, repeats: int, queue: Any) -> None:
    queue.put(_single_process(seq, repeats))


def _single_process_spawned(ctx: Any, seq: int, repeats: int) -> tuple[float, float]:
    """The reference in a fresh process, like the ranks: it then sees the same malloc
    setting (glibc reads it at start-up, so setting it in this process changes only
    children) and none of this process's heap."""
    queue = ctx.Queue()
    proc = ctx.Process(target=_single_process_child, args=(seq, repeats, queue))
    proc.start()
    result = queue.get(timeout=3600)
    proc.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", required=True)
    parser.add_argument("--seqs", type=int, nargs="*", help="memory rows at these lengths")
    parser.add_argument("--only-memory", action="store_true", help="just the memory rows")
    args = parser.parse_args()
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # freed tensors leave the RSS at once
    os.environ.setdefault("DT_PLUGINS_DISABLE", "")
    seqs = args.seqs or ([2048, 4096] if args.quick else [8192, 16384, 32768])
    time_seq = seqs[-1] if args.quick else 16384
    repeats = 1 if args.quick else 2
    cases = [(s, a, "none") for s in seqs for a in ("ring", "allgather")]
    cases += [(time_seq, "ring", "head_tail"), (time_seq, "allgather", "head_tail")]
    doc_seq = 4096 if args.quick else 8192
    doc_cases = [(doc_seq, b) for b in ("document", "head_tail", "none")]
    if args.only_memory:
        cases, doc_cases = [c for c in cases if c[2] == "none"], []

    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    # The reference runs before and after the ranks and its faster run counts, so a burst
    # of other load on the host during one of them does not decide the time ratios.
    no_run = (float("inf"), 0.0)
    before = no_run if args.only_memory else _single_process_spawned(ctx, time_seq, repeats)
    procs = [
        ctx.Process(target=_rank_main, args=(r, port, cases, doc_cases, repeats, queue))
        for r in range(RANKS)
    ]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=3600))
    for p in procs:
        p.join()
    if args.only_memory:
        for s in seqs:
            ring, gather = results[(s, "ring", "none")], results[(s, "allgather", "none")]
            print(
                f"S={s}: ring {ring['peak_mb']:.1f} MB, all-gather {gather['peak_mb']:.1f} MB, "
                f"ratio {ring['peak_mb'] / gather['peak_mb']:.3f}"
            )
        return
    after = _single_process_spawned(ctx, time_seq, repeats)
    single_time, single_peak = min(before[0], after[0]), max(before[1], after[1])

    rows = []
    for s in seqs:
        ring, gather = results[(s, "ring", "none")], results[(s, "allgather", "none")]
        rows.append(
            {
                "name": f"peak memory per rank, ring vs all-gather, S={s}, P=2",
                "metric": "peak_rss_rise_mb",
                "value": ring["peak_mb"],
                "baseline": "all-gather",
                "baseline_value": gather["peak_mb"],
                "ratio": ring["peak_mb"] / gather["peak_mb"],
                "target": "<= 0.6",
                "unit": "MB",
                "notes": f"causal SDPA fwd+bwd, B=1 H={HEADS} D={DIM} fp32",
            }
        )
    for balancer in ("head_tail", "none"):
        for algorithm in ("ring", "allgather"):
            r = results[(time_seq, algorithm, balancer)]
            rows.append(
                {
                    "name": f"time, {algorithm}, balancer={balancer}, S={time_seq}, P=2",
                    "metric": "fwd_bwd_seconds",
                    "value": r["time_s"],
                    "baseline": "single-process SDPA, 2 threads",
                    "baseline_value": single_time,
                    "ratio": r["time_s"] / single_time,
                    "target": "close to 1 (same total cores)",
                    "unit": "s",
                    "notes": "2 ranks x 1 thread vs 1 process x 2 threads; shared noisy host",
                }
            )
    lb, plain = results[(time_seq, "ring", "head_tail")], results[(time_seq, "ring", "none")]
    rows.append(
        {
            "name": f"causal per-rank work max/min, S={time_seq}, P=2",
            "metric": "work_ratio",
            "value": lb["work_max"] / lb["work_min"],
            "baseline": "no load balancing",
            "baseline_value": plain["work_max"] / plain["work_min"],
            "ratio": (lb["work_max"] / lb["work_min"]) / (plain["work_max"] / plain["work_min"]),
            "target": "value close to 1",
            "unit": "x",
            "notes": "score pairs computed per rank (causal blocks skipped)",
        }
    )
    ratios = {}
    for balancer in ("document", "head_tail", "none"):
        r = results[(doc_seq, "document", balancer)]
        ratios[balancer] = r["work_max"] / r["work_min"]
    for baseline in ("head_tail", "none"):
        rows.append(
            {
                "name": f"document+causal per-rank work max/min vs balancer={baseline}, "
                f"S={doc_seq}, P=2",
                "metric": "work_ratio",
                "value": ratios["document"],
                "baseline": f"balancer={baseline}",
                "baseline_value": ratios[baseline],
                "ratio": ratios["document"] / ratios[baseline],
                "target": "value close to 1",
                "unit": "x",
                "notes": (
                    f"flex forward, documents {document_lengths(doc_seq)}, BlockMask 128-blocks; "
                    "score pairs computed per rank (blocks the mask leaves out skipped)"
                ),
            }
        )

    def by_length(title: str, y_label: str, key: str) -> dict:
        """One plot: `key` of ring and all-gather (no balancing) against the length."""
        lines = {
            label: [results[(s, algorithm, "none")][key] for s in seqs]
            for label, algorithm in (("ring", "ring"), ("all-gather", "allgather"))
        }
        return {
            "title": title,
            "x_label": "sequence length",
            "y_label": y_label,
            "x": seqs,
            "lines": lines,
            "log_x": True,
            "log_y": True,
        }

    series = [
        by_length(
            "dt-cp: peak memory per rank vs sequence length (P=2, causal fwd+bwd)",
            "peak RSS rise per rank (MB)",
            "peak_mb",
        ),
        by_length("dt-cp: fwd+bwd time vs sequence length (P=2, causal)", "seconds", "time_s"),
    ]
    for row in rows:
        if row["metric"] == "fwd_bwd_seconds":
            row["notes"] += f"; single-process peak RSS rise {single_peak:.1f} MB"
    from dt_core.testing.benchmarks import write_report

    write_report(args.json, "dt-cp", rows, series)


if __name__ == "__main__":
    main()
