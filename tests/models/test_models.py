"""Real networks from the libraries users train with, sharded end to end.

Each model's input is sharded on a spatial dim (`Shard(2)`; two spatial dims on a 2x2 mesh
for one of them), its parameters replicated with `distribute_module`, every plugin
installed. Three train steps with SGD, each checked against the same model on one
process: the output, the input's gradient, every parameter's gradient, every buffer
(BatchNorm's running statistics) and the parameters after the step. The forward's
collectives are counted: only halos (all-to-all) and normalization statistics
(all-gather) may run, no plugin may fall back to replicated inputs, and a dense model's
output keeps the input's spatial shard. Every model also trains compiled
(`torch.compile(fullgraph=True)`): through `aot_eager`, and with Inductor's generated code
(`compile_heavy`: the forge workflow's). One test composes the spatial shards with torch's
FSDP2 (`fully_shard` over a second mesh dim) and saves and loads the trained model with
torch.distributed.checkpoint.

These need MONAI, torchvision, timm and diffusers, so they run in environments of their
own: `hatch run models:run` (torch 2.11 to 2.15, the model libraries pinned to
releases that keep it; conftest.py says which models an axis cannot build or run).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

STEPS = 3
LR = 0.01
# What a sharded forward may move: halos (all-to-all) and normalization statistics (an
# all-gather of 3 numbers per channel or group from each rank); a classifier's head adds
# one all-reduce of its pooled features (batch x channels).
FORWARD_COLLECTIVES = {"all_to_all_single", "all_gather_into_tensor"}
HEAD = "all_reduce"
# Attention over a sharded image's tokens (dt-cp's ring): each rank sends its keys and
# values to the next.
RING = {"send", "recv_"}
# float64 end to end: the sharded and the one-process step differ only in summation order
TOL = {"atol": 1e-9, "rtol": 1e-9}


def build(kind: str) -> tuple[torch.nn.Module, tuple[int, ...]]:
    """A small model of `kind` (seeded) and its input shape."""
    torch.manual_seed(0)
    if kind in ("monai-batch", "monai-instance"):
        from monai.networks.nets import UNet

        norm = kind.split("-")[1]
        model = UNet(3, 1, 2, channels=(4, 8, 16), strides=(2, 2), num_res_units=1, norm=norm)
        return model, (2, 1, 16, 16, 16)
    if kind == "resnet18":
        import torchvision

        return torchvision.models.resnet18(num_classes=10), (2, 3, 64, 64)
    if kind == "convnext":
        import timm

        return timm.create_model("convnext_atto", num_classes=10), (2, 3, 64, 64)
    if kind == "diffusers":
        from diffusers import UNet2DModel

        model = UNet2DModel(
            sample_size=32,
            in_channels=3,
            out_channels=3,
            block_out_channels=(32, 64),
            layers_per_block=1,
            down_block_types=("DownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "UpBlock2D"),
            norm_num_groups=8,
        )
        return model, (2, 3, 32, 32)
    raise ValueError(kind)


TIMESTEPS = (10.0, 500.0)  # one per sample of the diffusion UNet's batch


def forward(kind: str, model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's output for `x` (the diffusion UNet's for `x` at TIMESTEPS)."""
    if kind == "diffusers":
        return model(x, torch.tensor(TIMESTEPS, dtype=x.dtype)).sample
    return model(x)


def sharded_context(kind: str) -> Any:
    """Around the sharded forward and backward: the diffusion UNet builds its timestep
    embedding from plain tensors (`torch.arange`, the timesteps), which DTensor takes as
    replicated only under `implicit_replication`, in backward too (autograd multiplies
    the saved plain embedding with DTensor gradients)."""
    import contextlib

    if kind == "diffusers":
        from torch.distributed.tensor.experimental import implicit_replication

        return implicit_replication()
    return contextlib.nullcontext()


# Models that compute in float32 inside a float64 model: the diffusion UNet's timestep
# embedding (sin, cos, exp of float32 timesteps). Inductor's float32 code for those differs
# from eager's by a few ulps (on one process without any plugin, torch 2.14: 4.3e-8 on the
# output), far above float64's summation-order differences.
FLOAT32_INSIDE = {"diffusers"}


def reference_backend(kind: str, backend: str | None) -> str | None:
    """The backend the one-process reference runs under: eager (None), unless the sharded
    model runs Inductor's code and `kind` computes in float32 inside (FLOAT32_INSIDE), whose
    eager and generated float32 results differ: then the reference compiles with Inductor
    too, and the comparison is sharded against unsharded generated code."""
    if backend == "inductor" and kind in FLOAT32_INSIDE:
        return backend
    return None


def _plain(t: Any) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def train_and_compare(
    kind: str, mesh_shape: tuple[int, ...], placements: list, backend: str | None = None
) -> dict:
    """STEPS train steps sharded and on one process; returns what the test asserts on
    (the comparisons themselves raise on the first mismatch). With `backend` the sharded
    model runs under torch.compile(fullgraph=True); its collectives are not counted (they
    run inside the compiled code).

    The one-process model trains on rank 0 only, which compares: every rank gathers the
    same whole tensors, so one comparison is every rank's, and on 2 cores the other ranks'
    copies of the reference were most of a 4-rank test's time. Rank 0 tells the others
    what it found, so a mismatch fails every rank at once."""
    import warnings

    import torch.distributed as dist
    from dt_core.kit import FallbackWarning
    from dt_core.testing import cpu_mesh
    from dt_core.testing.collectives import counting_collectives
    from torch.distributed.tensor import distribute_module, distribute_tensor

    mesh = cpu_mesh(mesh_shape if len(mesh_shape) > 1 else mesh_shape[0])
    reference, shape = build(kind)
    reference = reference.double().train()
    sharded = copy.deepcopy(reference)
    distribute_module(sharded, mesh)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=LR)
    opt = torch.optim.SGD(sharded.parameters(), lr=LR)
    run = sharded if backend is None else torch.compile(sharded, backend=backend, fullgraph=True)
    ref_backend = reference_backend(kind, backend)
    run_ref = (
        reference
        if ref_backend is None
        else torch.compile(reference, backend=ref_backend, fullgraph=True)
    )
    checker = dist.get_rank() == 0
    found: dict[str, Any] = {"collectives": {}, "largest": {}, "placements": set()}
    gen = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        x = torch.randn(shape, generator=gen, dtype=torch.float64)
        xr = x.clone().requires_grad_()
        xd = distribute_tensor(x, mesh, placements).requires_grad_()
        with warnings.catch_warnings(), sharded_context(kind):
            warnings.simplefilter("error", FallbackWarning)
            if backend is None:
                with counting_collectives() as counts:
                    y = forward(kind, run, xd)
                found["collectives"] = dict(counts)  # the same every step
                found["largest"] = dict(counts.largest)
            else:
                y = forward(kind, run, xd)
            found["placements"].add(tuple(y.placements))
            y.pow(2).mean().backward()
        if checker:
            yr = forward(kind, run_ref, xr)
            yr.pow(2).mean().backward()
        ref_params = dict(reference.named_parameters())
        ref_buffers = dict(reference.named_buffers())

        def expect(value: Callable[[], torch.Tensor]) -> torch.Tensor | None:
            return value().detach().clone() if checker else None

        # each sharded tensor gathered whole on every rank, beside what rank 0 expects
        whole = [
            ("output", _plain(y).detach(), expect(lambda: yr)),
            ("input grad", _plain(xd.grad), expect(lambda: xr.grad)),
        ]
        for name, p in sharded.named_parameters():
            whole.append((f"grad {name}", _plain(p.grad), expect(lambda: ref_params[name].grad)))
        opt.step()
        opt.zero_grad()
        if checker:
            opt_ref.step()
            opt_ref.zero_grad()
        for name, p in sharded.named_parameters():
            whole.append((f"param {name}", _plain(p).detach(), expect(lambda: ref_params[name])))
        for name, b in sharded.named_buffers():
            whole.append((f"buffer {name}", _plain(b), expect(lambda: ref_buffers[name])))
        mismatch = None
        if checker:
            try:
                for what, got, expected in whole:
                    torch.testing.assert_close(
                        got,
                        expected,
                        **TOL,
                        msg=lambda m, w=what, s=step: f"{kind} step {s}, {w}: {m}",
                    )
            except AssertionError as error:
                mismatch = str(error)
        told = [mismatch]
        dist.broadcast_object_list(told, src=0)
        if told[0] is not None:
            raise AssertionError(told[0] if checker else f"rank 0 found: {told[0]}")
    found["placements"] = list(found["placements"])
    return found


DENSE = {"monai-batch", "monai-instance", "diffusers"}
WIDEST = {"monai-batch": 16, "monai-instance": 16, "resnet18": 512, "convnext": 320}
WIDEST["diffusers"] = 64


def check_forward_moves_only_halos_and_statistics(kind: str, found: dict, world: int) -> None:
    names = set(found["collectives"])
    allowed = FORWARD_COLLECTIVES | (set() if kind in DENSE else {HEAD})
    if kind == "diffusers":
        allowed |= RING
    assert names <= allowed, found
    # statistics, never an activation: 3 numbers per channel from each rank
    statistics = found["largest"].get("all_gather_into_tensor", 0)
    assert statistics <= 3 * WIDEST[kind] * world, found
    if kind not in DENSE:  # the head's pooled features, once
        assert found["collectives"].get(HEAD, 0) <= 1, found


@pytest.mark.ranks(2, 4, timeout=900)
@pytest.mark.parametrize(
    "kind", ["monai-batch", "monai-instance", "resnet18", "convnext", "diffusers"]
)
def test_model_trains_exactly_sharded_on_rows(kind: str, world_size: int) -> None:
    from torch.distributed.tensor import Shard

    found = train_and_compare(kind, (world_size,), [Shard(2)])
    check_forward_moves_only_halos_and_statistics(kind, found, world_size)
    if kind in DENSE:  # the output stays sharded like the input
        assert found["placements"] == [(Shard(2),)], found


@pytest.mark.ranks(4, timeout=900)
def test_monai_unet_on_a_2x2_mesh_with_two_spatial_dims_sharded() -> None:
    from torch.distributed.tensor import Shard

    found = train_and_compare("monai-batch", (2, 2), [Shard(2), Shard(3)])
    check_forward_moves_only_halos_and_statistics("monai-batch", found, 4)
    assert found["placements"] == [(Shard(2), Shard(3))], found


@pytest.mark.ranks(2, timeout=900)
@pytest.mark.parametrize("kind", ["monai-batch", "resnet18", "convnext", "diffusers"])
def test_model_trains_exactly_compiled(kind: str) -> None:
    """The same steps under torch.compile(fullgraph=True) (aot_eager: the traced graph
    whole, without Inductor's C++ code generation, against the eager reference)."""
    from torch.distributed.tensor import Shard

    found = train_and_compare(kind, (2,), [Shard(2)], backend="aot_eager")
    if kind in DENSE:
        assert found["placements"] == [(Shard(2),)], found


# Inductor's C++ code for a whole model takes minutes on 2 cores (cold cache, torch 2.14:
# the MONAI UNet 140 s, resnet18 230 s, ConvNeXt 190 s, the diffusion UNet 360 s): the
# forge workflow runs these, CI the aot_eager twins above.
@pytest.mark.compile_heavy
@pytest.mark.ranks(2, timeout=1800)
@pytest.mark.parametrize("kind", ["monai-batch", "resnet18", "convnext", "diffusers"])
def test_model_trains_exactly_compiled_by_inductor(kind: str) -> None:
    """The same steps with Inductor's generated code (see `reference_backend` for the
    diffusion UNet's reference)."""
    from torch.distributed.tensor import Shard

    found = train_and_compare(kind, (2,), [Shard(2)], backend="inductor")
    if kind in DENSE:
        assert found["placements"] == [(Shard(2),)], found


def _fsdp_x_spatial_unet(mesh: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
    """MONAI's 3-D UNet (instance norm: per-sample statistics, so a batch split over "dp"
    normalizes as one process does) with its parameters replicated on "sp" and then
    sharded by FSDP2 over "dp"; and the same model on one process."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_module

    reference, _ = build("monai-instance")
    reference = reference.double().train()
    sharded = copy.deepcopy(reference)
    distribute_module(sharded, mesh["sp"])
    fully_shard(sharded, mesh=mesh["dp"])
    return reference, sharded


@pytest.mark.ranks(4, timeout=900)
def test_monai_unet_under_fully_shard_trains_and_round_trips_through_dcp(tmp_path: Any) -> None:
    """The batch split over "dp" with FSDP2's `fully_shard`, each half's volume sharded on
    a spatial dim over "sp" (2 x 2 ranks): STEPS train steps equal one process's (outputs,
    input gradients, every parameter's gradient and value); then the sharded model's state
    is saved with torch.distributed.checkpoint and loaded into a newly built sharded model,
    whose parameters and output equal the one-process model's."""
    import torch.distributed.checkpoint as dcp
    from dt_core.testing import cpu_mesh
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        set_model_state_dict,
    )
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = cpu_mesh((2, 2), ("dp", "sp"))
    dp = mesh["dp"].get_local_rank()
    reference, sharded = _fsdp_x_spatial_unet(mesh)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=LR)
    opt = torch.optim.SGD(sharded.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(1)

    def compare_parameters(model: torch.nn.Module, what: str) -> None:
        ref_params = dict(reference.named_parameters())
        for name, p in model.named_parameters():
            torch.testing.assert_close(
                _plain(p).detach(), ref_params[name].detach(), **TOL, msg=f"{what} {name}"
            )

    for step in range(STEPS):
        x = torch.randn((4, 1, 16, 16, 16), generator=gen, dtype=torch.float64)
        xr = x.clone().requires_grad_()
        # this dp rank's half of the batch, its rows sharded over "sp"
        xd = distribute_tensor(x.chunk(2)[dp], mesh["sp"], [Shard(2)]).requires_grad_()
        y = sharded(xd)
        assert tuple(y.placements) == (Shard(2),), y.placements
        # each half's mean: FSDP averages the two halves' gradients, which is the
        # gradient of the whole batch's mean
        y.pow(2).mean().backward()
        yr = reference(xr)
        yr.pow(2).mean().backward()
        torch.testing.assert_close(_plain(y).detach(), yr.chunk(2)[dp].detach(), **TOL)
        # a half's mean weighs its inputs twice as much as the whole batch's mean does
        torch.testing.assert_close(_plain(xd.grad), 2 * xr.grad.chunk(2)[dp], **TOL)
        ref_params = dict(reference.named_parameters())
        for name, p in sharded.named_parameters():
            assert p.placements == (Shard(0), Replicate()), (name, p.placements)
            torch.testing.assert_close(
                _plain(p.grad), ref_params[name].grad, **TOL, msg=f"step {step} grad {name}"
            )
        opt.step()
        opt_ref.step()
        opt.zero_grad()
        opt_ref.zero_grad()
        compare_parameters(sharded, f"step {step} param")

    checkpoint = str(tmp_path / "unet-checkpoint")
    dcp.save(get_model_state_dict(sharded), checkpoint_id=checkpoint)
    _, loaded = _fsdp_x_spatial_unet(mesh)  # the initial weights, not the trained ones
    with pytest.raises(AssertionError):
        compare_parameters(loaded, "before loading")
    state = get_model_state_dict(loaded)
    dcp.load(state, checkpoint_id=checkpoint)
    set_model_state_dict(loaded, state)
    compare_parameters(loaded, "loaded")
    x = torch.randn((4, 1, 16, 16, 16), generator=gen, dtype=torch.float64)
    with torch.no_grad():
        y = loaded(distribute_tensor(x.chunk(2)[dp], mesh["sp"], [Shard(2)]))
        torch.testing.assert_close(_plain(y), reference(x).chunk(2)[dp], **TOL)
