"""The main job: every installed plugin's demo stage, checked against its unsharded run.

Launched by torchrun (`hatch run demo` starts 4 CPU ranks on this machine; torchrun's
`--nproc-per-node` / `--nnodes` scale it out, and with GPUs the same code runs on NCCL):

    torchrun --standalone --nproc-per-node 4 tools/demo.py [--size small|full] [--out DIR]
        [--compile-backend inductor|aot_eager] [--heartbeat SECONDS]

Each stage is a plugin's `dt_<name>.demo.run_stage(small)`; a plugin that is not
installed is shown as such and the others still run. The exit code is 0 only when every
stage that ran matched its reference.

A stage that compiles to show its ops trace whole (dt-conv's UNet) takes
`--compile-backend`: `aot_eager` traces the same graph but skips Inductor's C++ code
generation, which on 2 CPU cores is most of the demo's time (the test suite's run; dt-conv's
own tests compile its ops with Inductor). Stages whose feature is an Inductor pass
(dt-fsdp-passes) always use Inductor.

The console gets progress lines and the closing table, nothing else: each stage's start
and end, the phases a stage announces (a stage taking a `progress` argument is given a
callable: `progress("compiling the sharded UNet with Inductor", note="...")`), and,
whenever rank 0 has printed nothing for `--heartbeat` seconds, the current phase with
its elapsed time (tools/heartbeat.py), so a long compile never looks like a hang. Every
rank's own output (torch's warnings, a failing stage's traceback) goes to
`DIR/rank-N.log`, named at the end. The table is also written to `DIR/results.md` and
`DIR/results.json`, next to the plots (`DIR/speedup.png`, and `DIR/loss-<stage>.png` for
stages that report a loss curve) when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import importlib
import importlib.util
import inspect
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import demo_plots
from heartbeat import DEFAULT_INTERVAL_S, Heartbeat

# (row label, demo module, stage function, ranks it needs a multiple of, other plugins)
STAGES = [
    ("dt-conv", "dt_conv.demo", "run_stage", 1, ()),
    ("dt-cp", "dt_cp.demo", "run_stage", 1, ()),
    ("dt-symm-mem", "dt_symm_mem.demo", "run_stage", 1, ()),
    ("dt-fsdp-passes", "dt_fsdp_passes.demo", "run_stage", 1, ()),
    # FSDP x TP x CP on a (dp, cp, tp) = (world/4, 2, 2) mesh, compiled; a loss curve
    ("dt-fsdp-passes stack", "dt_fsdp_passes.demo", "run_stack_stage", 4, ("dt_cp",)),
]


_console = sys.stdout  # replaced by a handle on the real terminal once logs are redirected
_heartbeat: Heartbeat | None = None  # rank 0's, once the console is known


def _say(message: str) -> None:
    if int(os.environ.get("RANK", "0")) != 0:
        return
    if _heartbeat is not None:
        _heartbeat.say(message)
    else:
        print(message, file=_console, flush=True)


def _progress(text: str, note: str = "") -> None:
    """What a stage calls to announce a phase; rank 0 prints it (the others run the same
    phases in step, so one voice suffices)."""
    if _heartbeat is not None and int(os.environ.get("RANK", "0")) == 0:
        _heartbeat.phase(text, note)


def _redirect_rank_output(out: Path) -> Path:
    """Send this rank's stdout and stderr (Python's and C++'s alike) to its log file.

    Rank 0 keeps a handle on the terminal for the progress lines and the table.
    """
    global _console
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"rank-{os.environ.get('RANK', '0')}.log"
    sys.stdout.flush()
    sys.stderr.flush()
    _console = os.fdopen(os.dup(1), "w", buffering=1)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # A rank that dies in C++ (SIGABRT, SIGSEGV) leaves its Python stack in its log.
    faulthandler.enable(file=sys.stderr, all_threads=True)
    return log


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


def _run_stage(
    module_name: str,
    small: bool,
    function: str = "run_stage",
    multiple: int = 1,
    requires: tuple[str, ...] = (),
    compile_backend: str = "inductor",
    progress: Callable[..., None] = _progress,
) -> dict:
    """The stage's result; a stage that raises reports the error instead of stopping us."""
    import torch.distributed as dist

    top = module_name.split(".")[0]
    if importlib.util.find_spec(top) is None:
        return {"missing": True}
    absent = [name for name in requires if importlib.util.find_spec(name) is None]
    if absent:
        return {"missing": True, "why": f"needs {', '.join(absent)} installed too"}
    if dist.get_world_size() % multiple:
        return {"missing": True, "why": f"needs a multiple of {multiple} ranks"}
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        return {"ok": False, "error": f"no demo stage: {error}"}
    stage = getattr(module, function)
    options: dict[str, Any] = {"small": small}
    parameters = inspect.signature(stage).parameters
    if "backend" in parameters:
        options["backend"] = compile_backend
    if "progress" in parameters:
        options["progress"] = progress
    start = time.perf_counter()
    try:
        result = dict(stage(**options))
    except Exception as error:  # noqa: BLE001 - reported in the table, exit code 1
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(error).__name__}: {error}"}
    result["wall_s"] = time.perf_counter() - start
    if "losses" in result:  # a training stage: its loss curve against one process
        result["loss_curve"] = {
            "sharded": result.pop("losses"),
            "reference": result.pop("reference_losses"),
            "label": f"sharded over {dist.get_world_size()} ranks",
        }
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
            lines.append(f"| {package} | | | | | | {r.get('why', 'not installed')} |")
            continue
        if "error" in r:
            lines.append(f"| {package} | | | | | | FAILED: {r['error'][:80]} |")
            continue
        if r.get("baseline_time_s"):
            ratio = r["baseline_time_s"] / r["time_s"]
            timing = (
                f"{r['time_s'] * 1e3:.1f} ms vs {r['baseline_time_s'] * 1e3:.1f} ms ({ratio:.2f}x)"
            )
        else:  # nothing to compare with (e.g. a training curve against one process)
            timing = f"{r['time_s'] * 1e3:.1f} ms"
        sent = r.get("bytes_communicated")
        lines.append(
            f"| {package} | {r['feature']} | {r['ranks']} "
            f"| {r['max_error']:.2e} ({r['tolerance']:.0e}) | {timing} "
            f"| {_fmt_bytes(sent) if sent is not None else '-'} "
            f"| {'ok' if r['ok'] else 'MISMATCH'} |"
        )
    return "\n".join(lines)


def _write_results(
    rows: list[tuple[str, dict]], table: str, out: Path, run: demo_plots.RunInfo
) -> list[Path]:
    (out / "results.md").write_text(table + "\n")
    plain = {
        p: {k: v for k, v in r.items() if isinstance(v, str | int | float | bool | dict)}
        for p, r in rows
    }
    (out / "results.json").write_text(json.dumps(plain, indent=1, default=str) + "\n")
    return [out / "results.md", *demo_plots.plot(rows, out, run)]


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["small", "full"], default="full")
    parser.add_argument(
        "--stages", nargs="*", help="demo modules to run instead of the four plugins' ones"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("build/demo"), help="logs, table and plots go here"
    )
    parser.add_argument(
        "--compile-backend",
        choices=["inductor", "aot_eager"],
        default="inductor",
        help="torch.compile backend of the stages that take one (dt-conv's UNet)",
    )
    parser.add_argument(
        "--heartbeat",
        type=float,
        default=DEFAULT_INTERVAL_S,
        metavar="SECONDS",
        help="longest quiet stretch: then the current phase is printed with its elapsed time",
    )
    return parser.parse_args()


def main() -> int:
    global _heartbeat
    args = _parse()
    out = args.out.resolve()
    log = _redirect_rank_output(out)
    if int(os.environ.get("RANK", "0")) != 0:
        return _main(args, out, log)
    _heartbeat = Heartbeat(_console, args.heartbeat)
    _heartbeat.quiet_phase("starting the process group", prefix="dt-plugins demo: ")
    with _heartbeat:
        return _main(args, out, log)


def _main(args: argparse.Namespace, out: Path, log: Path) -> int:
    _init()
    import torch
    import torch.distributed as dist

    stages = [(m, m, "run_stage", 1, ()) for m in args.stages] if args.stages else STAGES
    world = dist.get_world_size()
    backend = dist.get_backend()
    _say(
        f"dt-plugins demo: {world} ranks, {backend}, size {args.size}, "
        f"compile backend {args.compile_backend}, torch {torch.__version__}"
    )
    rows = []
    for i, (package, module, function, multiple, requires) in enumerate(stages, 1):
        prefix = f"[{i}/{len(stages)}] {package}"
        _say(f"{prefix} ...")
        if _heartbeat is not None:
            _heartbeat.quiet_phase("running", prefix=f"{prefix}: ")
        result = _run_stage(
            module, args.size == "small", function, multiple, requires, args.compile_backend
        )
        if result.get("missing"):
            status = result.get("why", "not installed")
        elif "error" in result:
            status = f"FAILED ({result['error']})"
        else:
            status = "ok" if result["ok"] else "MISMATCH vs reference"
        _say(f"{prefix}: {status} ({result.get('wall_s', 0):.1f} s)")
        rows.append((package, result))
    if _heartbeat is not None:
        _heartbeat.quiet_phase("writing the table and plots", prefix="dt-plugins demo: ")
    table = _table(rows)
    _say("")
    _say(table)
    ran = [r for _, r in rows if not r.get("missing")]
    passed = bool(ran) and all(r["ok"] for r in ran)
    _say(f"\n{'all stages matched their references' if passed else 'SOME STAGES FAILED'}")
    if dist.get_rank() == 0:
        run = demo_plots.RunInfo(world, backend, args.size, torch.__version__)
        written = _write_results(rows, table, out, run)
        _say("written: " + ", ".join(os.path.relpath(p) for p in written))
    _say(f"rank logs (torch's warnings, tracebacks): {log.parent}/rank-*.log")
    # Rank 0 writes files and plots while the others are done: without a barrier they
    # tear their gloo pairs down under rank 0's feet.
    dist.barrier()
    dist.destroy_process_group()
    return 0 if passed else 1


if __name__ == "__main__":
    code = main()
    # Every result is written and the process group destroyed: exit without the
    # interpreter's teardown. On torch 2.15 a rank whose stages all passed once aborted
    # there ("terminate called without an active exception", no Python frame: a C++
    # thread of torch's destroyed at exit), turning a passing run's exit code into -6.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
