"""Batch norm in train mode on channel-sharded inputs: the running statistics are updated
as on one process (torch alone leaves them unchanged), and nothing else changes.

Each case trains two steps and evaluates one against the same module on one process:
output, input gradient, weight and bias gradients, running mean and variance. The eager
sweep runs on simulated ranks; the compiled case on 2 gloo ranks.
"""

from __future__ import annotations

import copy

import pytest
import torch
from dt_core.testing import cpu_mesh

TWO_STEPS_AND_EVAL = ("train", "train", "eval")


def _module(kind: str, channels: int) -> torch.nn.Module:
    if kind == "bn1d":
        return torch.nn.BatchNorm1d(channels)
    if kind == "bn3d":
        return torch.nn.BatchNorm3d(channels)
    if kind == "cumulative":  # momentum None: the running average of every batch so far
        return torch.nn.BatchNorm2d(channels, momentum=None)
    return torch.nn.BatchNorm2d(channels)


def _input(kind: str, channels: int, step: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(step)
    shape = {"bn1d": (4, channels, 3), "bn3d": (4, channels, 3, 2, 3)}.get(
        kind, (4, channels, 5, 3)
    )
    return torch.randn(shape, generator=gen, dtype=torch.float64) * 3 + 1.5


def _one_process(reference: torch.nn.Module, kind: str, channels: int) -> list[dict]:
    """What one process computes in each step: the values the sharded run must match."""
    steps = []
    for step, phase in enumerate(TWO_STEPS_AND_EVAL):
        reference.train(phase == "train")
        reference.zero_grad()
        x = _input(kind, channels, step).requires_grad_()
        y = reference(x)
        (y * y).sum().backward()
        values = [y, x.grad, reference.weight.grad, reference.bias.grad]
        values += [reference.running_mean, reference.running_var, reference.num_batches_tracked]
        steps.append(dict(zip(WHAT, [v.detach().clone() for v in values])))
    return steps


WHAT = ("output", "input grad", "weight grad", "bias grad", "running mean", "running var")
WHAT += ("batches tracked",)


def _train_and_compare(
    module, expected, mesh, placements, kind, channels, run=None, mode=None
) -> None:
    """The steps of `_one_process` on `module` (distributed), compared with `expected`;
    with `mode` (simulated ranks) every simulated rank's values are compared."""
    import contextlib

    from dt_core.testing import rank_values
    from torch.distributed.tensor import distribute_tensor

    run = module if run is None else run
    world = mesh.size()
    for step, phase in enumerate(TWO_STEPS_AND_EVAL):
        module.train(phase == "train")
        module.zero_grad()
        xd = distribute_tensor(_input(kind, channels, step), mesh, placements).requires_grad_()
        y = run(xd)
        (y * y).sum().backward()
        values = [y, xd.grad, module.weight.grad, module.bias.grad]
        values += [module.running_mean, module.running_var, module.num_batches_tracked]
        full = [v.full_tensor() for v in values]
        with mode.disable() if mode is not None else contextlib.nullcontext():
            for what, got in zip(WHAT, full):
                want = expected[step][what]
                for value in rank_values(got, world):
                    torch.testing.assert_close(
                        value, want, atol=1e-10, rtol=1e-10, msg=lambda m, w=what: f"{w}: {m}"
                    )


def _placements(names):
    from torch.distributed.tensor import Replicate, Shard

    return [Replicate() if n == "R" else Shard(int(n[1])) for n in names]


def _check_cases(cases, channel_counts=(5, 6)) -> None:
    """Each (kind, mesh shape, placements) with each channel count (uneven on the mesh,
    and even)."""
    from torch.distributed.tensor import distribute_module

    for kind, shape, names in cases:
        mesh = cpu_mesh(shape if len(shape) > 1 else shape[0])
        for channels in channel_counts:
            torch.manual_seed(channels)
            reference = _module(kind, channels).double()
            with torch.no_grad():
                reference.weight.uniform_(0.5, 1.5)
                reference.bias.uniform_(-0.5, 0.5)
            module = copy.deepcopy(reference)
            expected = _one_process(reference, kind, channels)
            distribute_module(module, mesh)
            _train_and_compare(module, expected, mesh, _placements(names), kind, channels)


# Real ranks, one shared world per size: simulated ranks (LocalTensorMode) cost a minute
# a case on torch 2.11. Every release runs two kinds at 5 channels; the 4-rank test (on
# the newest torch in CI's scope) runs every kind. The backward is torch-gaps' too (torch
# 2.11 and 2.12 have no strategy for it; DTensor's decomposition took about 10 s a step).
@pytest.mark.ranks(2, timeout=600)
def test_channel_sharded_batch_norm_trains_as_one_process_on_2_ranks() -> None:
    _check_cases([(kind, (2,), ("S1",)) for kind in ("bn2d", "cumulative")], channel_counts=(5,))


@pytest.mark.ranks(4, timeout=600)
def test_channel_sharded_batch_norm_trains_as_one_process_on_4_ranks() -> None:
    """A 1-D mesh of 4 (7 channels: 2, 2, 2, 1) and a 2x2 mesh: batch and channels,
    channels and replicated, channels over both mesh dims."""
    cases = [("bn2d", (4,), ("S1",))]
    cases += [("bn2d", (2, 2), names) for names in (("S0", "S1"), ("S1", "R"), ("S1", "S1"))]
    cases += [(kind, (2, 2), ("S0", "S1")) for kind in ("bn1d", "bn3d", "cumulative")]
    _check_cases(cases, channel_counts=(7, 8))


def test_a_rank_without_channels_is_left_to_torch() -> None:
    """5 channels over 4 ranks leave the last none (2, 2, 1, 0): torch's kernels refuse an
    empty input (and crash on one in backward), so torch-gaps takes no such call and the
    outcome stays torch's own; 7 channels (2, 2, 2, 1) it takes."""
    from dt_core.channel_batch_norm import takes_for
    from dt_core.testing import simulated_ranks
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    takes = takes_for(torch.ops.aten.native_batch_norm.default)
    with simulated_ranks(4):
        mesh = init_device_mesh("cpu", (4,))
        decided = {}
        for channels in (5, 7):
            x = distribute_tensor(torch.ones(2, channels, 3, 3), mesh, [Shard(1)])
            stats = distribute_tensor(torch.zeros(channels), mesh, [Replicate()])
            decided[channels] = takes((x, None, None, stats, stats, True, 0.1, 1e-5), {})
    assert decided == {5: False, 7: True}


def test_empty_shards_are_found_as_shard_splits_channels() -> None:
    from dt_core.channel_batch_norm import _some_shard_empty

    assert _some_shard_empty(5, [4]) and _some_shard_empty(6, [4])  # 2,2,1,0 and 2,2,2,0
    assert not _some_shard_empty(7, [4]) and not _some_shard_empty(8, [4])
    assert not _some_shard_empty(5, [2, 2])  # (3, 2) -> (2, 1), (1, 1)
    assert _some_shard_empty(3, [2, 2])  # (2, 1) -> (1, 1), (1, 0)


def test_functional_batch_norm_with_replicated_statistics() -> None:
    """`F.batch_norm` called with replicated running statistics (no module) updates them
    in place, as on one process."""
    import torch.nn.functional as F
    from dt_core.testing import rank_values, simulated_ranks
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    x = _input("bn2d", 6, 0)
    mean, var = torch.zeros(6, dtype=torch.float64), torch.ones(6, dtype=torch.float64)
    expected = F.batch_norm(x, mean, var, training=True, momentum=0.3)
    with simulated_ranks(2) as mode:
        mesh = init_device_mesh("cpu", (2,))
        xd = distribute_tensor(x, mesh, [Shard(1)])
        md = distribute_tensor(torch.zeros(6, dtype=torch.float64), mesh, [Replicate()])
        vd = distribute_tensor(torch.ones(6, dtype=torch.float64), mesh, [Replicate()])
        got = F.batch_norm(xd, md, vd, training=True, momentum=0.3)
        pairs = [(got.full_tensor(), expected), (md.full_tensor(), mean), (vd.full_tensor(), var)]
        with mode.disable():
            for full, want in pairs:
                for value in rank_values(full, 2):
                    torch.testing.assert_close(value, want)
    assert not torch.equal(mean, torch.zeros(6, dtype=torch.float64))  # it did move


@pytest.mark.compile_heavy
@pytest.mark.ranks(2, timeout=600)
def test_channel_sharded_batch_norm_compiled_fullgraph() -> None:
    """The same under torch.compile(fullgraph=True) (aot_eager: functionalized, so the
    update arrives as the functional op's returned statistics)."""
    from torch.distributed.tensor import Shard, distribute_module

    torch.manual_seed(0)
    reference = torch.nn.BatchNorm2d(5).double()
    module = copy.deepcopy(reference)
    expected = _one_process(reference, "bn2d", 5)
    mesh = cpu_mesh(2)
    distribute_module(module, mesh)
    compiled = torch.compile(module, backend="aot_eager", fullgraph=True)
    _train_and_compare(module, expected, mesh, [Shard(1)], "bn2d", 5, run=compiled)
