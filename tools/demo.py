"""The main job: every installed plugin's demo stage, checked against its unsharded run.

Launched by torchrun (`hatch run demo` starts 2 CPU ranks on this machine; torchrun's
`--nproc-per-node` / `--nnodes` scale it out, and with GPUs the same code runs on NCCL):

    torchrun --standalone --nproc-per-node 2 tools/demo.py [--size small|full]

Each stage is a plugin's `dt_<name>.demo.run_stage(small)`; a plugin that is not
installed is shown as such and the others still run. The exit code is 0 only when every
stage that ran matched its reference.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import os
import sys
import time
import traceback

# (plugin package, demo module)
STAGES = [
    ("dt-conv", "dt_conv.demo"),
    ("dt-cp", "dt_cp.demo"),
    ("dt-symm-mem", "dt_symm_mem.demo"),
    ("dt-fsdp-passes", "dt_fsdp_passes.demo"),
]


def _say(message: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(message, flush=True)


def _init() -> None:
    import torch
    import torch.distributed as dist

    if "RANK" not in os.environ:  # plain `python tools/demo.py`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
        os.environ.setdefault("LOCAL_RANK", "0")
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=datetime.timedelta(minutes=5))


def _run_stage(module_name: str, small: bool) -> dict:
    """The stage's result; a stage that raises reports the error instead of stopping us."""
    import torch.distributed as dist

    top = module_name.split(".")[0]
    if importlib.util.find_spec(top) is None:
        return {"missing": True}
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        return {"ok": False, "error": f"no demo stage: {error}"}
    start = time.perf_counter()
    try:
        result = dict(module.run_stage(small=small))
    except Exception as error:  # noqa: BLE001 - reported in the table, exit code 1
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(error).__name__}: {error}"}
    result["wall_s"] = time.perf_counter() - start
    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, bool(result.get("ok")))
    result["ok"] = all(flags)  # a stage passes only if it passed on every rank
    return result


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _table(rows: list[tuple[str, dict]]) -> str:
    lines = [
        "| plugin | feature | ranks | max error (tolerance) "
        "| time with vs without plugin (speed-up) | bytes / rank | status |",
        "|---|---|---|---|---|---|---|",
    ]
    for package, r in rows:
        if r.get("missing"):
            lines.append(f"| {package} | | | | | | not installed |")
            continue
        if "error" in r:
            lines.append(f"| {package} | | | | | | FAILED: {r['error'][:80]} |")
            continue
        ratio = r["baseline_time_s"] / r["time_s"] if r.get("time_s") else float("nan")
        lines.append(
            f"| {package} | {r['feature']} | {r['ranks']} "
            f"| {r['max_error']:.2e} ({r['tolerance']:.0e}) "
            f"| {r['time_s'] * 1e3:.1f} ms vs {r['baseline_time_s'] * 1e3:.1f} ms "
            f"({ratio:.2f}x) | {_fmt_bytes(r['bytes_communicated'])} "
            f"| {'ok' if r['ok'] else 'MISMATCH'} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["small", "full"], default="full")
    parser.add_argument(
        "--stages", nargs="*", help="demo modules to run instead of the four plugins' ones"
    )
    args = parser.parse_args()
    _init()
    import torch.distributed as dist

    stages = [(m, m) for m in args.stages] if args.stages else STAGES
    world = dist.get_world_size()
    backend = dist.get_backend()
    _say(f"dt-plugins demo: {world} ranks, {backend}, size {args.size}")
    rows = []
    for i, (package, module) in enumerate(stages, 1):
        _say(f"[{i}/{len(stages)}] {package} ...")
        result = _run_stage(module, args.size == "small")
        if result.get("missing"):
            status = "not installed"
        elif "error" in result:
            status = f"FAILED ({result['error']})"
        else:
            status = "ok" if result["ok"] else "MISMATCH vs reference"
        _say(f"[{i}/{len(stages)}] {package}: {status} ({result.get('wall_s', 0):.1f} s)")
        rows.append((package, result))
    _say("")
    _say(_table(rows))
    ran = [r for _, r in rows if not r.get("missing")]
    passed = bool(ran) and all(r["ok"] for r in ran)
    _say(f"\n{'all stages matched their references' if passed else 'SOME STAGES FAILED'}")
    dist.destroy_process_group()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
