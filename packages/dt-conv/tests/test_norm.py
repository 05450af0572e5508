"""Batch, instance, group and layer norm on spatially sharded inputs, against one process.

Each case trains a norm layer for two steps and evaluates it once, its input sharded
along spatial dims (parameters and running statistics replicated), and compares in
float64 with the same layer on one process: every output, the input gradients, the
accumulated parameter gradients and the running statistics. The output must keep the
input's placements (nothing gathered) and no fallback may be taken. The property sweep
runs 2-8 simulated ranks (uneven and empty shards, 1-, 2- and 3-D, 1-D and 2-D meshes);
real ranks check what simulation cannot (gloo collectives, compiled graphs, 16-bit
inputs, the fallback's running statistics).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from dt_core.testing import cpu_mesh, rank_values
from dt_core.testing.sweeps import mesh_params
from test_local_tensor import SimulatedWorld, sweep_simulated
from torch import nn

KINDS = ("batch", "instance", "group", "layer", "layer_last")
# every release sweeps the first three (even, uneven, 2-D), CI the others on one release only
MESHES = [(2,), (3,), (2, 2), (4,), (8,), (2, 3)]


def make_norm(kind: str, channels: int, spatial: Sequence[int]) -> nn.Module:
    """The norm layer of `kind` for (N, channels, *spatial) inputs, with random affine
    parameters so that their gradients are not trivially equal."""
    n = len(spatial)
    if kind == "batch":
        layer: nn.Module = getattr(nn, f"BatchNorm{n}d")(channels, momentum=0.3)
    elif kind == "instance":
        layer = getattr(nn, f"InstanceNorm{n}d")(channels, affine=True, track_running_stats=True)
    elif kind == "group":
        layer = nn.GroupNorm(2, channels)
    elif kind == "layer":
        layer = nn.LayerNorm([channels, *spatial])
    else:  # over the last spatial dim only
        layer = nn.LayerNorm(spatial[-1])
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
    return layer.double()


def run_steps(layer: nn.Module, inputs: Sequence[Any], probes: Sequence[Any]) -> list[Any]:
    """Two train steps and one eval step; each step's output and input gradient."""
    results = []
    for step, (x, probe) in enumerate(zip(inputs, probes, strict=True)):
        layer.train(step < 2)
        y = layer(x)
        (y * probe).sum().backward()
        results += [y.detach(), x.grad]
    return results


def _reference(kind: str, shape: tuple, seed: int) -> tuple[nn.Module, list, list, list]:
    gen = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(shape, generator=gen, dtype=torch.float64) * 3 + 1 for _ in range(3)]
    probes = [torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(3)]
    layer = make_norm(kind, shape[1], shape[2:])
    ref = copy.deepcopy(layer)
    want = run_steps(ref, [x.clone().requires_grad_() for x in inputs], probes)
    want += [p.grad for p in ref.parameters()]
    want += [b for b in ref.buffers() if b.dtype.is_floating_point]
    return layer, inputs, probes, want


def _fallbacks(caught: list[warnings.WarningMessage]) -> list[str]:
    from dt_core.kit import FallbackWarning

    return sorted({str(w.message) for w in caught if issubclass(w.category, FallbackWarning)})


def _replicate(sim: SimulatedWorld, layer: nn.Module) -> None:
    """Every parameter and buffer of `layer` replicated on the simulated ranks, each rank
    holding its own tensor (as real ranks do)."""
    from torch.distributed.tensor import Replicate

    rep = [Replicate()] * sim.mesh.ndim
    for module in layer.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = nn.Parameter(sim.distribute(p.detach(), rep))
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = sim.distribute(b, rep)


def check_simulated(sim: SimulatedWorld, kind: str, shape: tuple, placements: list) -> str | None:
    """A case on the simulated ranks; a description of the first mismatch, or None."""
    with sim.mode.disable():
        layer, inputs, probes, want = _reference(kind, shape, seed=sum(shape))
    case = f"{kind} x{shape} mesh={sim.mesh_shape} {placements}"
    _replicate(sim, layer)
    xs = [sim.distribute(x, placements).requires_grad_() for x in inputs]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = run_steps(layer, xs, [sim.distribute(p, placements) for p in probes])
    if _fallbacks(caught):
        return f"fell back {_fallbacks(caught)}: {case}"
    if any(tuple(y.placements) != tuple(placements) for y in got[0::2]):
        return f"output placements {[tuple(y.placements) for y in got[0::2]]}: {case}"
    got += [p.grad for p in layer.parameters()]
    got += [b for b in layer.buffers() if b.dtype.is_floating_point]
    for i, (value, expected) in enumerate(zip(got, want, strict=True)):
        shards = sim.shards(expected, value.placements)
        for rank, (a, e) in enumerate(zip(rank_values(value.to_local(), sim.world), shards)):
            if a.shape != e.shape or not torch.allclose(a, e, atol=1e-10, rtol=1e-9):
                return f"result {i} differs on rank {rank}: {case}"
    return None


def _draw(data: Any, mesh_shape: tuple) -> tuple[str, tuple, list]:
    from hypothesis import strategies as st
    from torch.distributed.tensor import Replicate, Shard

    kind = data.draw(st.sampled_from(KINDS))
    n = data.draw(st.integers(1, 3))
    spatial = tuple(data.draw(st.integers(1, 9)) for _ in range(n))
    shape = (data.draw(st.integers(1, 3)), data.draw(st.sampled_from([2, 4])), *spatial)
    dims = list(range(2, 2 + n))
    placements = []
    for _ in mesh_shape:
        free = [d for d in dims if Shard(d) not in placements]
        options = [Shard(d) for d in free] + [Shard(0), Replicate()]
        placements.append(data.draw(st.sampled_from(options)))
    if not any(p.is_shard() and p.dim >= 2 for p in placements):
        placements[0] = Shard(dims[-1])
    return kind, shape, placements


@pytest.mark.parametrize("mesh_shape", mesh_params(MESHES))
def test_norms_on_simulated_ranks_property(mesh_shape: tuple) -> None:
    """Hypothesis over norm kinds, 1-3 spatial dims of 1-9 (shards thinner than a row,
    empty ones), batch and channel counts and placements (spatial, batch, replicated) on
    2-8 simulated ranks: exact, sharded like the input, never falling back."""
    from dt_conv.fallback import reset_warnings
    from hypothesis import assume

    def case(sim: SimulatedWorld, data: Any) -> str | None:
        kind, shape, placements = _draw(data, mesh_shape)
        with sim.mode.disable():
            try:  # torch refuses one value per channel in train mode: nothing to compare
                _reference(kind, shape, seed=0)
            except (ValueError, RuntimeError):
                assume(False)
        reset_warnings()
        return check_simulated(sim, kind, shape, placements)

    sweep_simulated(mesh_shape, 12, case)


# ---- real ranks ---------------------------------------------------------------------


def _train_on_ranks(
    kind: str, shape: tuple, placements: list, mesh: Any, compiled: bool = False
) -> tuple[list, list, list[str]]:
    """(sharded results as full tensors, reference results, fallback warnings)."""
    from torch.distributed.tensor import DTensor, distribute_module, distribute_tensor

    layer, inputs, probes, want = _reference(kind, shape, seed=3)
    distribute_module(layer, mesh)
    if compiled:  # each case is a new module: forget the last one's graphs
        torch.compiler.reset()
    run = torch.compile(layer, backend="aot_eager", fullgraph=True) if compiled else layer
    xs = [distribute_tensor(x, mesh, placements).requires_grad_() for x in inputs]
    ps = [distribute_tensor(p, mesh, placements) for p in probes]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = []
        for step, (x, probe) in enumerate(zip(xs, ps, strict=True)):
            layer.train(step < 2)
            y = run(x)
            assert tuple(y.placements) == tuple(placements), (kind, y.placements)
            (y * probe).sum().backward()
            results += [y.detach(), x.grad]
    results += [p.grad for p in layer.parameters()]
    results += [b for b in layer.buffers() if b.dtype.is_floating_point]
    full = [r.full_tensor() if isinstance(r, DTensor) else r for r in results]
    return full, want, _fallbacks(caught)


def _assert_all_close(got: list, want: list, what: str) -> None:
    assert len(got) == len(want)
    for i, (a, e) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(a, e, atol=1e-10, rtol=1e-9, msg=f"{what}: result {i}")


@pytest.mark.ranks(2)
def test_norms_train_and_evaluate_on_2_ranks_eager_and_compiled() -> None:
    """Every kind on gloo, eager and compiled (aot_eager, fullgraph): exact, sharded,
    running statistics as one process's, no fallback."""
    from torch.distributed.tensor import Shard

    mesh = cpu_mesh(2)
    for compiled in (False, True):
        for kind in KINDS:
            for shape, placements in (((2, 4, 7, 6), [Shard(2)]), ((1, 4, 3, 5, 4), [Shard(4)])):
                got, want, fell = _train_on_ranks(kind, shape, placements, mesh, compiled)
                assert not fell, fell
                _assert_all_close(got, want, f"{kind} {shape} {placements} compiled={compiled}")


@pytest.mark.ranks(4)
def test_norms_on_a_2x2_mesh() -> None:
    """Two spatial dims sharded, and batch with a spatial dim, on a 2x2 mesh."""
    from torch.distributed.tensor import Shard

    mesh = cpu_mesh((2, 2))
    for kind in KINDS:
        for placements in ([Shard(2), Shard(3)], [Shard(0), Shard(3)]):
            got, want, fell = _train_on_ranks(kind, (2, 4, 5, 6), placements, mesh)
            assert not fell, fell
            _assert_all_close(got, want, f"{kind} {placements}")


@pytest.mark.ranks(4)
def test_channels_and_rows_sharded() -> None:
    """Channels sharded on one mesh dim and rows on the other: batch norm keeps both
    (per-channel statistics stay with their channels); group norm takes the replicated
    path with one warning naming the reason, exact all the same."""
    from dt_conv.fallback import reset_warnings
    from torch.distributed.tensor import Shard

    mesh = cpu_mesh((2, 2))
    reset_warnings()
    got, want, fell = _train_on_ranks("batch", (2, 4, 6, 6), [Shard(1), Shard(2)], mesh)
    assert not fell, fell
    _assert_all_close(got, want, "batch")
    reset_warnings()
    got, want, fell = _train_on_ranks("group", (2, 4, 6, 6), [Shard(1), Shard(2)], mesh)
    assert fell and all("channels sharded as well as a spatial dim" in w for w in fell)
    _assert_all_close(got, want, "group")


@pytest.mark.ranks(2)
def test_16_bit_inputs_accumulate_in_float32() -> None:
    """bfloat16 and float16 inputs with float32 parameters: statistics accumulate in
    float32 as torch's kernels do, so the sharded result is torch's within 16-bit
    rounding, and the saved statistics are float32."""
    from torch.distributed.tensor import Shard, distribute_module, distribute_tensor

    mesh = cpu_mesh(2)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 4, 16, 8, generator=gen) * 4 + 100  # large mean against the spread
    for dtype in (torch.bfloat16, torch.float16):
        for layer in (nn.BatchNorm2d(4), nn.GroupNorm(2, 4)):
            ref, sharded, in_float32 = (copy.deepcopy(layer) for _ in range(3))
            distribute_module(sharded, mesh)
            xd = distribute_tensor(x.to(dtype), mesh, [Shard(2)])
            y = sharded(xd).full_tensor()
            expected = ref(x.to(dtype))
            assert y.dtype == dtype
            exact = in_float32(x.to(dtype).float()).to(dtype)  # float32 math, rounded once
            worst_torch = (expected.float() - exact.float()).abs().max()
            assert (y.float() - exact.float()).abs().max() <= worst_torch + 1e-2
            if isinstance(layer, nn.BatchNorm2d):
                torch.testing.assert_close(
                    sharded.running_mean.full_tensor(), ref.running_mean, rtol=1e-3, atol=1e-3
                )
