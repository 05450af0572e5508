"""Demo stage: one training step of a small UNet on spatially sharded images, compiled.

Called on every rank inside an initialised process group (gloo on CPU, nccl on CUDA).
Checks the sharded step, eager and compiled whole with Inductor (`fullgraph=True`: the
halo exchange traces), against the unsharded one (loss and every parameter gradient),
and times the compiled sharded step against what a user does without the plugin: gather
the image, then run the compiled unsharded model on every rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

PaddingMode = Literal["zeros", "reflect", "replicate", "circular"]


class Block(nn.Sequential):
    def __init__(self, cin: int, cout: int, mode: PaddingMode = "zeros") -> None:
        super().__init__(
            nn.Conv2d(cin, cout, 3, padding=1, padding_mode=mode),
            nn.ReLU(),
            nn.Conv2d(cout, cout, 3, padding=1),
            nn.ReLU(),
        )


class TinyUNet(nn.Module):
    """Two levels: down by max pooling, up by bilinear interpolation, skip by concat."""

    def __init__(self, mode: PaddingMode = "zeros", width: int = 4) -> None:
        super().__init__()
        self.enc1, self.enc2 = Block(2, width, mode), Block(width, 2 * width, mode)
        self.dec1 = Block(3 * width, width, mode)
        self.head = nn.Conv2d(width, 1, 1)

    def forward(self, x: torch.Tensor, trace: list | None = None) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        up = F.interpolate(e2, size=e1.shape[-2:], mode="bilinear", align_corners=False)
        d1 = self.dec1(torch.cat([e1, up], dim=1))
        if trace is not None:
            trace.extend([e1, e2, up, d1])
        return self.head(d1)


def _step(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> tuple[Any, dict]:
    model.zero_grad()
    loss = ((model(x) - target) ** 2).mean()
    loss.backward()
    # a compiled module names its parameters under `_orig_mod.`
    return loss, {k.removeprefix("_orig_mod."): p.grad for k, p in model.named_parameters()}


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _silent(text: str, note: str = "") -> None:
    """The phases of a stage run without the demo's console."""


def _compile_note(backend: str) -> str:
    if backend == "inductor":
        return "slow on a first run on this machine; Inductor caches its code for the next run"
    return ""


def run_stage(
    small: bool = True, backend: str = "inductor", progress: Callable[..., None] = _silent
) -> dict:
    """The demo's UNet stage: one training step, sharded and compiled by `backend`
    (Inductor in the demo; tests of the stage alone may pass a cheaper one), against the
    unsharded step. `progress(text, note=...)` is told each phase as it starts: the
    compiles take minutes and the demo's console says what is running."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_module, distribute_tensor

    from dt_conv.engine.halo import exchange as halo

    device, ranks = _device(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (ranks,))
    side, width = (64, 8) if small else (512, 16)
    dtype = torch.float64 if device.type == "cpu" else torch.float32
    torch.manual_seed(0)
    ref = TinyUNet(width=width).to(device, dtype)
    sharded = TinyUNet(width=width).to(device, dtype)
    sharded.load_state_dict(ref.state_dict())
    distribute_module(sharded, mesh)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 2, side, side, generator=gen, dtype=dtype).to(device)
    target = torch.randn(2, 1, side, side, generator=gen, dtype=dtype).to(device)
    xd = distribute_tensor(x, mesh, [Shard(2)])
    td = distribute_tensor(target, mesh, [Shard(2)])

    progress(f"one training step of the UNet on a {side}x{side} image, unsharded and sharded")
    loss_ref, grads_ref = _step(ref, x, target)
    sent = halo.counters.get("bytes_sent")  # counted in Python: eager steps only
    eager_loss, eager_grads = _step(sharded, xd, td)
    sent = halo.counters.get("bytes_sent") - sent
    eager_elapsed = _timed(lambda: _step(sharded, xd, td))
    compiled = _compiled(sharded, backend)
    progress(f"compiling the sharded UNet with {backend}", note=_compile_note(backend))
    _step(compiled, xd, td)  # compiles
    elapsed = _timed(lambda: _step(compiled, xd, td))
    loss, grads = _step(compiled, xd, td)

    compiled_ref = _compiled(ref, backend)
    progress(f"compiling the unsharded UNet with {backend} (the baseline without dt-conv)")
    _step(compiled_ref, x, target)  # compiles
    # without the plugin: gather the image, then the compiled unsharded step on every rank
    baseline = _timed(lambda: _step(compiled_ref, xd.full_tensor(), td.full_tensor()))

    errors = [
        (got_loss.full_tensor() - loss_ref).abs().max().item() for got_loss in (loss, eager_loss)
    ]
    errors += [
        (got[k].full_tensor() - g).abs().max().item()
        for got in (grads, eager_grads)
        for k, g in grads_ref.items()
    ]
    tolerance = 1e-9 if dtype == torch.float64 else 1e-4
    worst = torch.tensor(max(errors), dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    timing = torch.tensor([elapsed, baseline, float(sent), eager_elapsed], dtype=torch.float64)
    dist.all_reduce(timing, op=dist.ReduceOp.MAX)
    return {
        "feature": "dt-conv: compiled UNet training step, spatially sharded (halo exchange)",
        "ranks": ranks,
        "max_error": worst.item(),
        "tolerance": tolerance,
        "ok": bool(worst.item() <= tolerance),
        "time_s": timing[0].item(),
        "baseline_time_s": timing[1].item(),
        "bytes_communicated": int(timing[2].item()),
        "size": f"UNet width {width}, image 2x2x{side}x{side}",
        "details": f"image 2x2x{side}x{side} Shard(2), {dtype}, {backend} fullgraph; "
        f"eager sharded step {timing[3].item():.4f} s; baseline: gather the image and run "
        "the compiled unsharded step on every rank",
    }


def _compiled(model: nn.Module, backend: str) -> nn.Module:
    """`model` compiled whole; still a module (torch.compile wraps it in one)."""
    return cast(nn.Module, torch.compile(model, backend=backend, fullgraph=True))


def _timed(step: Any) -> float:
    """Seconds of one `step()` on the slowest rank's clock (barriers around it)."""
    dist.barrier()
    start = time.perf_counter()
    step()
    dist.barrier()
    return time.perf_counter() - start
