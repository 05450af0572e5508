"""dt-conv benchmark: fwd+bwd of a stack of 3x3 convs on a spatially sharded image, 2 ranks.

Against, in the same run: (a) all-gather the image, then the unsharded convs on every
rank (what a user does without the plugin), and (b) the convs on the local shard alone,
with no communication (wrong at the seams; the limit). Also the bytes each rank sends
per conv against an all-gather's. Then a small UNet (convs, max pool, bilinear up, skip
concat) compiled with inductor (fullgraph), sharded, against the same UNet eager
sharded, the same compiled program with no communication (the limit), the UNet compiled
on the local shard with torch's own kernels, and all-gather then compiled.
Writes the JSON the report tool reads.

The UNet's limit is the sharded program itself, run by each rank alone in a fake world
(torch's fake backend: dt-conv reads the halos as zeros and nothing is exchanged), both
ranks at once as in the real run. The local shard through torch's own kernels is no
limit: a CPU conv backward over one large tensor is 1.4-2.3x slower than the same
backward in row blocks (1x16x256x512 and 1x48x256x512, measured 2026-11-26), and
dt-conv's backward works in blocks.

    python packages/dt-conv/benchmarks/run.py [--quick] --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

LAYERS, CHANNELS, RANKS = 4, 32, 2


def _timed(fn: Any, reps: int) -> float:
    import torch.distributed as dist

    fn()  # warm-up
    times = []
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        fn()
        dist.barrier()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(size: int, reps: int) -> dict[str, float]:
    """Runs on every rank: seconds per fwd+bwd step of each variant, and bytes per conv."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from dt_conv.engine.halo.plan import exchange_plan
    from dt_conv.ops.conv.plan import make_plan
    from dt_core.testing import cpu_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = cpu_mesh(RANKS)
    gen = torch.Generator().manual_seed(0)
    image = torch.randn(1, CHANNELS, size, size, generator=gen)
    weights = [torch.randn(CHANNELS, CHANNELS, 3, 3, generator=gen) * 0.05 for _ in range(LAYERS)]
    wd = [distribute_tensor(w, mesh, [Replicate()]).requires_grad_() for w in weights]
    wl = [w.clone().requires_grad_() for w in weights]
    xd = distribute_tensor(image, mesh, [Shard(2)]).requires_grad_()

    def stack(x: Any, ws: list) -> Any:
        for w in ws:
            x = F.conv2d(x, w, padding=1)
        return x

    def halo() -> None:
        stack(xd, wd).to_local().sum().backward()

    def gathered() -> None:
        full = xd.detach().full_tensor().requires_grad_()
        stack(full, wl).sum().backward()

    local_shard = xd.detach().to_local().clone().requires_grad_()

    def local_only() -> None:
        stack(local_shard, wl).sum().backward()

    result = {
        "halo_s": _timed(halo, reps),
        "gather_s": _timed(gathered, reps),
        "local_s": _timed(local_only, reps),
    }
    plan = make_plan(xd, weights[0].shape, [1, 1], [1, 1], [1, 1], False)
    split = plan.splits[0]
    rows = sum(len(r) for _, r in exchange_plan(split, dist.get_rank()).sends)
    result["halo_bytes"] = float(rows * CHANNELS * size * image.element_size())
    shard_bytes = local_shard.numel() * image.element_size()
    result["allgather_bytes"] = float(shard_bytes * (RANKS - 1))
    return result


UNET_CHANNELS = 16


def _unet(x: Any, p: list) -> Any:
    """Small UNet: down convs, max pool, bilinear up, skip concat, up convs."""
    import torch
    import torch.nn.functional as F

    d1 = F.relu(F.conv2d(F.relu(F.conv2d(x, p[0], padding=1)), p[1], padding=1))
    d2 = F.relu(F.conv2d(F.max_pool2d(d1, 2), p[2], padding=1))
    up = F.interpolate(d2, scale_factor=2, mode="bilinear")
    u = F.relu(F.conv2d(torch.cat([up, d1], 1), p[3], padding=1))
    return F.conv2d(u, p[4], padding=1)


def measure_unet(size: int, reps: int) -> dict[str, float]:
    """Runs on every rank: fwd+bwd of the UNet, eager and compiled (inductor)."""
    import torch
    from dt_core.testing import cpu_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.set_num_threads(1)
    mesh = cpu_mesh(RANKS)
    c = UNET_CHANNELS
    gen = torch.Generator().manual_seed(0)
    shapes = [(c, c, 3, 3), (c, c, 3, 3), (2 * c, c, 3, 3), (c, 3 * c, 3, 3), (c, c, 3, 3)]
    params = [torch.randn(s, generator=gen) * 0.05 for s in shapes]
    image = torch.randn(1, c, size, size, generator=gen)
    pd = [distribute_tensor(w, mesh, [Replicate()]).requires_grad_() for w in params]
    pl = [w.clone().requires_grad_() for w in params]
    xd = distribute_tensor(image, mesh, [Shard(2)]).requires_grad_()
    local_shard = xd.detach().to_local().clone().requires_grad_()
    compiled = torch.compile(_unet, backend="inductor", fullgraph=True)
    compiled_local = torch.compile(_unet, backend="inductor", fullgraph=True)
    compiled_gathered = torch.compile(_unet, backend="inductor", fullgraph=True)

    def gathered() -> None:
        full = xd.detach().full_tensor().requires_grad_()
        compiled_gathered(full, pl).sum().backward()

    return {
        "eager_s": _timed(lambda: _unet(xd, pd).to_local().sum().backward(), reps),
        "compiled_s": _timed(lambda: compiled(xd, pd).to_local().sum().backward(), reps),
        "local_s": _timed(lambda: compiled_local(local_shard, pl).sum().backward(), reps),
        "gather_s": _timed(gathered, reps),
    }


def _unet_alone(rank: int, size: int, reps: int) -> float:
    """In this process, alone: rank `rank` of a fake world of RANKS running the compiled
    sharded UNet on its own shard (no peers: dt-conv reads the halos as zeros)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    dist.init_process_group("fake", rank=rank, world_size=RANKS, store=FakeStore())
    mesh = init_device_mesh("cpu", (RANKS,))
    c = UNET_CHANNELS
    gen = torch.Generator().manual_seed(0)
    shapes = [(c, c, 3, 3), (c, c, 3, 3), (2 * c, c, 3, 3), (c, 3 * c, 3, 3), (c, c, 3, 3)]
    params = [torch.randn(s, generator=gen) * 0.05 for s in shapes]
    image = torch.randn(1, c, size, size, generator=gen)
    local = image.chunk(RANKS, 2)[rank].contiguous()
    pd = [
        DTensor.from_local(w, mesh, [Replicate()], run_check=False).requires_grad_() for w in params
    ]
    xd = DTensor.from_local(local, mesh, [Shard(2)], run_check=False).requires_grad_()
    compiled = torch.compile(_unet, backend="inductor", fullgraph=True)
    return _timed(lambda: compiled(xd, pd).to_local().sum().backward(), reps)


def measure_unet_alone(size: int, reps: int) -> float:
    """Every rank's `_unet_alone` in its own process, all at once (they share the cores
    as the real ranks do); the slowest rank's seconds per step."""
    here = os.path.abspath(__file__)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = [
        subprocess.Popen(
            [sys.executable, here, "--unet-alone", str(rank), str(size), str(reps)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(RANKS)
    ]
    seconds = []
    for run in runs:
        out, _ = run.communicate(timeout=1800)
        if run.returncode != 0:
            raise RuntimeError(f"dt-conv benchmark: the fake-world UNet exited {run.returncode}")
        seconds.append(float(out.strip().splitlines()[-1]))
    return max(seconds)


def unet_rows(world: Any, quick: bool) -> list[dict[str, Any]]:
    """Compiled sharded UNet vs eager sharded, compiled local-only and gather-then-compiled."""
    size = 128 if quick else 512
    ranks = world.run(measure_unet, size, 3 if quick else 5, timeout=1800)  # compiles
    m = {k: max(r[k] for r in ranks) for k in ranks[0]}
    alone = measure_unet_alone(size, 3 if quick else 5)
    shape = f"UNet 1x{UNET_CHANNELS}x{size}x{size}, fp32, {RANKS} ranks, inductor"
    row = {"metric": "fwd+bwd step time", "value": m["compiled_s"], "unit": "s", "notes": shape}
    return [
        {
            **row,
            "name": "compiled sharded UNet vs eager sharded",
            "baseline": "the same sharded UNet, eager",
            "baseline_value": m["eager_s"],
            "ratio": m["eager_s"] / m["compiled_s"],
            "target": ">= 1.2x faster",
        },
        {
            **row,
            "name": "compiled sharded UNet vs the same program without communication (the limit)",
            "baseline": "each rank alone in a fake world (halos read as zeros), ranks at once",
            "baseline_value": alone,
            "ratio": m["compiled_s"] / alone,
            "target": "<= 1.1x slower",
        },
        {
            **row,
            "name": "compiled sharded UNet vs compiled UNet on the local shard, torch's kernels",
            "baseline": "the local shard through torch's own (unblocked) conv backward",
            "baseline_value": m["local_s"],
            "ratio": m["compiled_s"] / m["local_s"],
            "target": "for reference (not a limit: see the module docstring)",
        },
        {
            **row,
            "name": "compiled sharded UNet vs all-gather then compiled UNet",
            "baseline": "all-gather the image, compiled unsharded UNet on every rank",
            "baseline_value": m["gather_s"],
            "ratio": m["gather_s"] / m["compiled_s"],
            "target": "faster",
        },
    ]


def run(quick: bool) -> dict[str, Any]:
    from dt_core.testing import get_world, shutdown_worlds

    main = 256 if quick else 1024
    sizes = [64, 128, 256] if quick else [128, 256, 512, 1024]
    reps = 2 if quick else 3
    world = get_world(RANKS)
    try:
        per_size = {}
        for size in sorted(set(sizes) | {main}):
            ranks = world.run(measure, size, reps)
            per_size[size] = {k: max(r[k] for r in ranks) for k in ranks[0]}
        compiled_rows = unet_rows(world, quick)
    finally:
        shutdown_worlds()
    m = per_size[main]
    shape = f"1x{CHANNELS}x{main}x{main}, {LAYERS} convs 3x3, fp32, {RANKS} ranks"
    rows = [
        {
            "name": "halo conv vs gather-then-conv",
            "metric": "fwd+bwd step time",
            "value": m["halo_s"],
            "baseline": "all-gather the image, unsharded convs on every rank",
            "baseline_value": m["gather_s"],
            "ratio": m["gather_s"] / m["halo_s"],
            "target": ">= 1.5x faster",
            "unit": "s",
            "notes": shape,
        },
        {
            "name": "halo conv vs local-only conv (the limit)",
            "metric": "fwd+bwd step time",
            "value": m["halo_s"],
            "baseline": "convs on the local shard, no communication",
            "baseline_value": m["local_s"],
            "ratio": m["halo_s"] / m["local_s"],
            "target": "<= 1.2x slower",
            "unit": "s",
            "notes": shape,
        },
        {
            "name": "bytes sent per conv per rank",
            "metric": "halo bytes vs all-gather bytes",
            "value": m["halo_bytes"],
            "baseline": "all-gather of the image",
            "baseline_value": m["allgather_bytes"],
            "ratio": m["halo_bytes"] / m["allgather_bytes"],
            "target": "small fraction",
            "unit": "bytes",
            "notes": shape,
        },
    ]
    rows += compiled_rows
    xs = sorted(per_size)
    series = [
        {
            "title": f"dt-conv: fwd+bwd of {LAYERS} 3x3 convs, {CHANNELS} ch, {RANKS} ranks",
            "x_label": "image side (pixels)",
            "y_label": "seconds per step",
            "x": xs,
            "lines": {
                "halo exchange (dt-conv)": [per_size[s]["halo_s"] for s in xs],
                "all-gather then conv": [per_size[s]["gather_s"] for s in xs],
                "local shard only (limit)": [per_size[s]["local_s"] for s in xs],
            },
            "log_x": True,
            "log_y": True,
        }
    ]
    return {"package": "dt-conv", "rows": rows, "series": series}


def main() -> None:
    if sys.argv[1:2] == ["--unet-alone"]:  # one rank of measure_unet_alone
        rank, size, reps = (int(a) for a in sys.argv[2:5])
        print(_unet_alone(rank, size, reps))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, < 1 minute")
    parser.add_argument("--json", required=True, help="where to write the results")
    args = parser.parse_args()
    result = run(args.quick)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    for row in result["rows"]:
        print(
            f"{row['name']}: {row['value']:.4g} vs {row['baseline_value']:.4g} "
            f"-> ratio {row['ratio']:.3f} (target {row['target']})"
        )


if __name__ == "__main__":
    main()
