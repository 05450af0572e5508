"""A whole network's memory: MONAI's 3-D UNet, one training step, per-rank peak as ranks grow.

    hatch run models.2.14:bench-memory [--quick] [--size 256]

MONAI `UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=(16, 32, 64, 128, 256),
strides=(2, 2, 2, 2), num_res_units=2, norm="batch")` (the layout of MONAI's segmentation
tutorials) on a 1 x 1 x S^3 fp32 volume (S = 128; `--size` for larger), sharded on depth
over P = 2, 4, 8 spawned gloo ranks (one thread each), every rank allocating its own
slab (`DTensor.from_local`), the parameters and buffers replicated
(`distribute_module`); one forward and backward in train mode, every plugin installed.
The baseline is one process running the same model with plain torch on the whole volume.

Peaks are measured as in the per-package memory benchmarks (`dt_core.testing.memory`:
the tensors held before the step plus the resident rise during it, blocks of 64 KiB or
more mapped alone). The floor at P is measured, not modelled: the same model in plain torch
on one rank's slab alone (S/P planes, no communication: 1/P of every activation, all the
weights and their gradients), plus the halo planes of one convolution in flight (a plane
from and to each neighbour, forward and adjoint, of the widest convolution input).

With glibc's default settings (what a CPU user sees who sets nothing) the same step is
measured again at P = 4 and on one process: blocks freed on gloo's worker threads stay in
those threads' arenas, so the resident set stays higher than the tensors alive. The rows
say by how much, and what `MALLOC_MMAP_THRESHOLD_=65536` gives back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHANNELS = (16, 32, 64, 128, 256)
STRIDES = (2, 2, 2, 2)


def _model() -> Any:
    import torch
    from monai.networks.nets import UNet

    torch.manual_seed(0)
    return UNet(3, 1, 2, channels=CHANNELS, strides=STRIDES, num_res_units=2, norm="batch")


def _step(model: Any, x: Any, local: bool) -> Any:
    def step() -> None:
        out = model(x)
        (out if local else out.to_local()).sum().backward()
        for p in model.parameters():
            p.grad = None

    return step


def _volume(planes: int, size: int, seed: int) -> Any:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, 1, planes, size, size, generator=gen)


def plain(planes: int, size: int) -> dict[str, int]:
    """One process, plain torch: the UNet on a 1 x 1 x planes x size x size volume."""
    import torch
    from dt_core.testing.memory import measure_step, resident_bytes

    torch.set_num_threads(1)
    _model()  # MONAI's modules imported (their code is not the step's memory)
    start = resident_bytes()
    model = _model().train()
    result = measure_step(_step(model, _volume(planes, size, 1), local=True))
    return {**result, "resident_rise": result["resident_high"] - start}


def sharded(size: int) -> dict[str, int]:
    """On every rank: the UNet on the volume sharded on depth, through the plugins."""
    import torch
    import torch.distributed as dist
    from dt_core.testing import cpu_mesh
    from dt_core.testing.memory import measure_step, resident_bytes
    from torch.distributed.tensor import DTensor, Shard, distribute_module

    torch.set_num_threads(1)
    ranks = dist.get_world_size()
    mesh = cpu_mesh(ranks)
    _model()
    dist.barrier()
    start = resident_bytes()
    model = _model().train()
    distribute_module(model, mesh)
    local = _volume(size // ranks, size, 1 + dist.get_rank())
    x = DTensor.from_local(local, mesh, [Shard(2)], run_check=False)
    dist.barrier()
    result = measure_step(_step(model, x, local=False))
    return {**result, "resident_rise": result["resident_high"] - start}


def widest_conv_plane(size: int) -> int:
    """Bytes of the widest convolution input plane (channels x H x W x 4) in the model at
    an S^3 volume, from a forward on the meta device."""
    import torch

    model = _model().to("meta")
    planes: list[int] = []

    def record(module: Any, args: tuple[Any, ...]) -> None:
        n, c, _, h, w = args[0].shape
        planes.append(n * c * h * w * args[0].element_size())

    convs = (torch.nn.Conv3d, torch.nn.ConvTranspose3d)
    for module in model.modules():
        if isinstance(module, convs):
            module.register_forward_pre_hook(record)
    model(torch.empty(1, 1, size, size, size, device="meta"))
    return max(planes)


def halo_bytes(size: int, ranks: int) -> int:
    """The halo planes one convolution keeps in flight on the rank with the most
    neighbours, forward and adjoint: a plane from and to each neighbour, each way."""
    return 4 * min(2, ranks - 1) * widest_conv_plane(size)


def allocator_rows(
    size: int, mapped_one: dict[str, int], mapped_four: dict[str, int]
) -> list[dict[str, Any]]:
    """What a CPU user sees: the resident set's rise over a run (building the model, two
    steps) at P = 4 and on one process, with glibc's default settings and with large
    blocks mapped alone (`mapped_*`: those runs' measurements)."""
    from dt_core.testing.memory import MiB, measure_one_process, measure_ranks

    one = measure_one_process(plain, size, size, mapped_alone=False)["resident_rise"]
    four = measure_ranks(sharded, [4], size, mapped_alone=False)[4]["resident_rise"]
    mapped = mapped_four["resident_rise"] / mapped_one["resident_rise"]
    note = (
        "resident set's rise from before the model is built to the end of a second step, "
        f"largest rank; P=4 / one process: {four / one:.2f} with glibc's defaults, "
        f"{mapped:.2f} with MALLOC_MMAP_THRESHOLD_=65536"
    )
    common = {"metric": "resident rise over a run", "unit": "MiB", "notes": note}
    return [
        {
            **common,
            "name": "resident rise with glibc's default settings, P=4",
            "value": four / MiB,
            "baseline": "one process, glibc's default settings",
            "baseline_value": one / MiB,
            "ratio": four / one,
            "target": "for reference",
        },
        {
            **common,
            "name": "resident rise, glibc's default settings vs MALLOC_MMAP_THRESHOLD_=65536, P=4",
            "value": four / MiB,
            "baseline": "blocks of 64 KiB or more mapped alone",
            "baseline_value": mapped_four["resident_rise"] / MiB,
            "ratio": four / mapped_four["resident_rise"],
            "target": "for reference",
        },
    ]


def run(quick: bool, size: int | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from dt_core.testing.memory import (
        measure_one_process,
        measure_ranks,
        measured_report,
    )

    size = size or (64 if quick else 128)
    ranks = [2, 4] if quick else [2, 4, 8]
    if any(size % (p * 2 ** len(STRIDES)) for p in ranks):
        raise SystemExit(f"--size must be a multiple of {max(ranks) * 2 ** len(STRIDES)}")
    reference = measure_one_process(plain, size, size)
    local = {p: measure_one_process(plain, size // p, size) for p in ranks}
    ours = measure_ranks(sharded, ranks, size)
    floors = {p: local[p]["peak"] + halo_bytes(size, p) for p in ranks}
    problem = f"MONAI UNet 3-D, 1x1x{size}^3 fp32, batch norm, sharded on depth"
    rows, series = measured_report(
        "MONAI UNet",
        problem,
        reference,
        ours,
        floors,
        floor_note=(
            "floor: the same model in plain torch on one rank's S/P planes (measured) + the "
            "halo planes of its widest convolution in flight (4 per neighbour)"
        ),
        # The target is the floor's (within ~15% of it at P = 4); as a share of
        # one process, the floor is what P = 4 can reach with replicated weights.
        targets={4: f"~{floors[4] / reference['peak']:.2f} (the floor's)"},
        fits={
            "size": size,
            "what": "volume edge (cube)",
            "unit": "voxels",
            "exponent": 3,
            "multiple": 16,
        },
    )
    if 4 in ours:
        rows += allocator_rows(size, reference, ours[4])
    return rows, series


HEADING = "## A whole network: MONAI's 3-D UNet"
INTRO = (
    "Written by `hatch run models.2.14:bench-memory` (tools/bench_unet_memory.py, in the models "
    "environment: torch 2.14.1, MONAI 1.6.1). A MONAI 3-D UNet's training step on a volume "
    "sharded on depth, per-rank peak as ranks grow, counted as in the per-package memory "
    "benchmarks above; the floor is the same model run alone on one rank's slab (plus its "
    "halo planes), so it holds 1/P of every activation and all of the weights and their "
    'gradients. "What fits" scales the whole peak like edge^3, weights included, so it '
    "is a lower bound. The last rows are what a CPU user sees in `top`: the resident set's "
    "rise over a run, with glibc's default settings and with `MALLOC_MMAP_THRESHOLD_=65536` "
    "(docs/guide/unet-3d.md says when to set it). The module docstring says what is run."
)
SHARD_TENSOR = (
    "PhysicsNeMo's ShardTensor is not beside it: checked on 2026-11-28 with "
    "nvidia-physicsnemo 2.2.2 (torch 2.14.1, 2 gloo ranks), it does not run this model. "
    "Its sharded transposed convolution takes only kernel = stride and no padding "
    "(`MissingShardPatch` for MONAI's 3x3x3, stride 2, padding 1 up-sampling, on CPU and "
    "GPU alike); batch norm has no spatial rule (the activation is resharded to channels "
    "and the next halo convolution fails), nor does PReLU's backward. On CPU its setup "
    "also needs the process group made by hand (it passes a CPU `device_id`), its "
    "convolution rules registered by hand (registered only when CUDA is present), and "
    "shard shapes given (inferring them pins memory on CUDA). With all of that patched "
    "around and the up-sampling replaced by kernel 2, stride 2, a 32^3 step matched one "
    "process."
)


def render(result: dict[str, Any], quick: bool, out: Path) -> None:
    """Replace (or add) this benchmark's section of `out` (BENCHMARKS.md): machine lines,
    the table, the plot."""
    import torch
    from bench_report import _plots, _table, machine_info, replace_section

    run = {
        "torch": torch.__version__,
        "machine": result.get("machine") or machine_info(),
        "mode": "quick (small sizes)" if quick else "full",
        "results": [{**result, "suite": "memory"}],
    }
    section = [HEADING, "", INTRO, "", SHARD_TENSOR, "", *_table([run]), *_plots([run], out)]
    out.write_text(replace_section(out.read_text(), HEADING, section))
    print(f"wrote {out}")


def main() -> None:
    import argparse
    import json

    from dt_core.testing.benchmarks import write_report

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 64^3 volume, P = 2, 4")
    parser.add_argument("--size", type=int, help="edge of the cubic volume (a multiple of 128)")
    parser.add_argument("--json", default=str(ROOT / "build" / "bench" / "models-memory.json"))
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument("--render-only", action="store_true", help="the section from --json")
    args = parser.parse_args()
    if not args.render_only:
        from bench_report import machine_info

        machine = machine_info()  # the load average before the run, not after
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        rows, series = run(args.quick, args.size)
        write_report(args.json, "models", rows, series)
        saved = json.loads(Path(args.json).read_text())
        Path(args.json).write_text(json.dumps({**saved, "machine": machine}, indent=2))
    result = json.loads(Path(args.json).read_text())
    render(result, args.quick, Path(args.out))


if __name__ == "__main__":
    main()
