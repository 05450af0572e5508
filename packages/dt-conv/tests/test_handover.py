"""dt-conv owns only the calls torch gets wrong or gathers whole (`dt_conv.ownership`).

Under simulated ranks (LocalTensorMode), each case runs with the plugins active and again
with dt-core deactivated (torch alone, same process, same torch release):
- handed over (Partial, Replicate, batch or channel shards of a pad, max pool or
  interpolation): the same placements as torch alone and the same values and input
  gradients, which equal plain torch on one process;
- kept (a windowed dim sharded): dt-conv keeps the shard where torch alone gathers the
  dim whole, and both are exact.
A zero pad of a Partial input stays Partial, as torch keeps it (torch's own DTensor test
of padding fails if dt-conv reduces it).

"Torch alone" is torch as it ships: a release older than 2.13 lacks some of these ops'
sharding strategies (interpolation backward, pooling on 2.11) and refuses them, and
torch 2.11's constant pad strategy leaves the pad out of DTensor's cache key. dt-core's
torch-gaps plugin fills or replaces those while active; for them the plugins' run is
compared with one process only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from dt_core.testing import rank_values, simulated_ranks

OPS: dict[str, Callable[[Any], Any]] = {
    "zero pad": lambda x: F.pad(x, (1, 2, 2, 0)),
    "pad 1.5": lambda x: F.pad(x, (1, 2, 2, 0), value=1.5),
    "max pool": lambda x: F.max_pool2d(x, 2),
    "nearest": lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
    "bilinear": lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
}
HANDED_OVER = ["Partial", "Replicate", "Shard(0)", "Shard(1)"]
KEPT = ["Shard(2)", "Shard(3)"]


def _input(mode: Any, mesh: Any, x: torch.Tensor, placement: str) -> Any:
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    if placement == "Partial":  # two halves summing to x
        return DTensor.from_local(
            mode.rank_map(lambda r: x / 2), mesh, [Partial()], run_check=False
        )
    full = DTensor.from_local(
        mode.rank_map(lambda r: x.clone()), mesh, [Replicate()], run_check=False
    )
    return full if placement == "Replicate" else full.redistribute(mesh, [Shard(int(placement[6]))])


class TorchRefused(tuple):
    """torch alone raised "... does not have a sharding strategy registered" (the op)."""


def _run(mode: Any, mesh: Any, fn: Callable, x: torch.Tensor, placement: str) -> tuple:
    """(output placements, full output, full input gradient) of `fn` on sharded `x`."""
    try:
        return _run_once(mode, mesh, fn, x, placement)
    except NotImplementedError as error:
        if "does not have a sharding strategy registered" not in str(error):
            raise
        return TorchRefused((str(error),))


def _run_once(mode: Any, mesh: Any, fn: Callable, x: torch.Tensor, placement: str) -> tuple:
    xd = _input(mode, mesh, x, placement).requires_grad_()
    y = fn(xd)
    full = y.full_tensor()
    weights = torch.linspace(-1, 1, full.numel(), dtype=full.dtype).reshape(full.shape)
    (full * weights).sum().backward()
    grad = xd.grad.full_tensor()
    return tuple(y.placements), rank_values(full, 2)[0], rank_values(grad, 2)[0]


def _reference(fn: Callable, x: torch.Tensor) -> tuple:
    xr = x.clone().requires_grad_()
    y = fn(xr)
    weights = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)
    (y * weights).sum().backward()
    return y.detach(), xr.grad


@pytest.fixture(scope="module")
def both_runs() -> dict[tuple[str, str], tuple]:
    """Every (op, placement) with the plugins and with torch alone."""
    import dt_core
    from torch.distributed.device_mesh import init_device_mesh

    x = torch.randn(2, 4, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    results: dict[tuple[str, str], tuple] = {}
    with simulated_ranks(2) as mode:
        mesh = init_device_mesh("cpu", (2,))
        for name, fn in OPS.items():
            for placement in HANDED_OVER + KEPT:
                results[name, placement] = (_run(mode, mesh, fn, x, placement),)
        dt_core.deactivate()
        try:
            for name, fn in OPS.items():
                for placement in HANDED_OVER + KEPT:
                    results[name, placement] += (_run(mode, mesh, fn, x, placement),)
        finally:
            dt_core.activate()
    with_ref = {}
    for (name, placement), runs in results.items():
        with_ref[name, placement] = (*runs, _reference(OPS[name], x))
    return with_ref


# the aten op (and its backward) each case calls
ATEN = {
    "zero pad": "constant_pad_nd",
    "pad 1.5": "constant_pad_nd",
    "max pool": "max_pool2d_with_indices",
    "nearest": "upsample_nearest2d",
    "bilinear": "upsample_bilinear2d",
}


@pytest.fixture(scope="module")
def filled_by_torch_gaps() -> set[str]:
    """The aten ops whose strategy dt-core's torch-gaps plugin gives this torch (none
    from 2.13 on), asked with the plugins deactivated as the plugin itself asks."""
    import dt_core
    from dt_core import torch_gaps

    dt_core.deactivate()
    try:
        return {str(s.op).split(".")[1] for s in torch_gaps.dt_sharding_strategies()}
    finally:
        dt_core.activate()


def _exact_runs(runs: tuple, name: str, filled: set[str]) -> tuple[tuple, tuple | None]:
    """The plugins' run and torch's alone, each checked against one process; torch's is
    None where torch-gaps fills or replaces the op's strategy (torch alone refuses it, or
    is wrong on 2.11's pad): the plugins' run is then checked alone."""
    ours, theirs, (y_ref, grad_ref) = runs
    assert not isinstance(ours, TorchRefused), ours
    if any(op.startswith(ATEN[name]) for op in filled):
        theirs = None
    else:
        assert not isinstance(theirs, TorchRefused), theirs
    for run in (ours, theirs):
        if run is not None:
            torch.testing.assert_close(run[1], y_ref)
            torch.testing.assert_close(run[2], grad_ref)
    return ours, theirs


@pytest.mark.parametrize("placement", HANDED_OVER)
@pytest.mark.parametrize("name", OPS)
def test_handed_over_calls_are_torchs_own(
    both_runs: dict, filled_by_torch_gaps: set[str], name: str, placement: str
) -> None:
    ours, theirs = _exact_runs(both_runs[name, placement], name, filled_by_torch_gaps)
    if theirs is not None:
        assert ours[0] == theirs[0], f"{name} on {placement}: {ours[0]} vs torch's {theirs[0]}"


@pytest.mark.parametrize("placement", KEPT)
@pytest.mark.parametrize("name", OPS)
def test_windowed_shards_stay_sharded_where_torch_gathers(
    both_runs: dict, filled_by_torch_gaps: set[str], name: str, placement: str
) -> None:
    from torch.distributed.tensor import Replicate, Shard

    its_shard = (Shard(int(placement[6])),)
    ours, theirs = _exact_runs(both_runs[name, placement], name, filled_by_torch_gaps)
    assert ours[0] == its_shard
    if theirs is not None:
        assert theirs[0] == (Replicate(),)  # why dt-conv owns these: torch gathers the dim


def test_a_zero_pad_keeps_partial_like_torch(both_runs: dict) -> None:
    from torch.distributed.tensor import Partial

    assert both_runs["zero pad", "Partial"][0][0] == (Partial(),)
    # a constant is not a sum: reduced (torch replicates; torch-gaps on 2.11 may shard)
    assert Partial() not in both_runs["pad 1.5", "Partial"][0][0]


def test_ownership_rule() -> None:
    from dt_conv.ownership import torch_owns

    assert not torch_owns("convolution", (), {})  # torch alone is wrong or raises
    assert not torch_owns("avg_pool2d", (), {})
    assert not torch_owns("reflection_pad2d", (), {})
