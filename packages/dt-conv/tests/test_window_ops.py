"""Sharded pooling, interpolation and padding equal the same ops on one process.

Values and input gradients in float64 against plain torch on the full tensor; the output
must keep the input's sharding (nothing gathered) and no case may fall back.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from dt_core.testing import cpu_mesh
from dt_core.testing.cases import expect_exact

Op = Callable[[torch.Tensor], Any]


def check(
    mesh: Any, placements: list, shape: tuple, fn: Op, name: str, keep: bool = True
) -> str | None:
    """One case sharded and unsharded; a description of any mismatch, else None."""
    from torch.distributed.tensor import distribute_tensor

    gen = torch.Generator().manual_seed(len(name) + sum(shape))
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    ref_in = x.clone().requires_grad_()
    ref = fn(ref_in)
    extra = ref[1:] if isinstance(ref, tuple) else ()
    ref = ref[0] if isinstance(ref, tuple) else ref
    g = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    (ref * g).sum().backward()

    xd = distribute_tensor(x, mesh, placements).requires_grad_()
    out = fn(xd)
    got_extra = out[1:] if isinstance(out, tuple) else ()
    y = out[0] if isinstance(out, tuple) else out
    case = f"{name} {placements} {shape}"
    if keep and _keeps_placements(name, placements, len(shape)):
        if tuple(y.placements) != tuple(placements):
            return f"output placements {y.placements}: {case}"
    if y.shape != ref.shape or not torch.allclose(y.full_tensor(), ref):
        return f"forward differs: {case}"
    for want, got in zip(extra, got_extra, strict=True):
        if not torch.equal(got.full_tensor(), want):
            return f"indices differ: {case}"
    (y * distribute_tensor(g, mesh, list(y.placements))).sum().backward()
    if xd.grad is None or not torch.allclose(xd.grad.full_tensor(), ref_in.grad):
        return f"grad differs: {case}"
    return None


# Ops torch computes exactly on every placement: dt-conv hands their calls without a
# sharded spatial dim to torch (dt_conv.ownership), whose placements may differ (torch
# gathers a batch of one sharded over two ranks); test_handover.py checks they are torch's.
SHARED_WITH_TORCH = ("pad constant", "pad crop", "max ", "interp ")


def _keeps_placements(name: str, placements: list, ndim: int) -> bool:
    """Whether dt-conv owns the call, and so keeps the input's placements."""
    spatial = any(p.is_shard() and p.dim % ndim >= 2 for p in placements)
    return spatial or not name.startswith(SHARED_WITH_TORCH)


def run_cases(mesh: Any, cases: list[tuple]) -> None:
    """Check every case; all of them must take the sharded (non-fallback) path."""
    expect_exact("conv", (functools.partial(check, mesh, *c) for c in cases))


def pad_cases(shape: tuple, placements: list) -> list[tuple]:
    n = len(shape) - 2
    cases = []
    for pl in placements:
        for mode, pads in itertools.product(
            ("constant", "reflect", "replicate", "circular"), ((1, 2), (0, 3), (2, 0), (3, 1))
        ):
            pad = list(pads) * n
            fn = (lambda p, m: lambda t: F.pad(t, p, mode=m))(pad, mode)
            cases.append((pl, shape, fn, f"pad {mode} {pad}"))
        crop = [-1, 2] * n
        cases.append((pl, shape, lambda t, c=crop: F.pad(t, c, value=1.5), f"pad crop {crop}"))
    return cases


def pool_cases(shape: tuple, placements: list) -> list[tuple]:
    n = len(shape) - 2
    maxp = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[n]
    avgp = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[n]
    cases = []
    for pl, k, s, p, ceil in itertools.product(
        placements, (2, 3), (1, 2, 3), (0, 1), (False, True)
    ):
        if p > k // 2:
            continue
        for d in (1, 2):
            kw = {"kernel_size": k, "stride": s, "padding": p, "dilation": d, "ceil_mode": ceil}
            cases.append(
                (pl, shape, lambda t, kw=kw: maxp(t, return_indices=True, **kw), f"max {kw}")
            )
        for inc in (True, False):
            kw = {
                "kernel_size": k,
                "stride": s,
                "padding": p,
                "ceil_mode": ceil,
                "count_include_pad": inc,
            }
            cases.append((pl, shape, lambda t, kw=kw: avgp(t, **kw), f"avg {kw}"))
        if n > 1:
            kw = {"kernel_size": k, "stride": s, "padding": p, "divisor_override": 3}
            cases.append((pl, shape, lambda t, kw=kw: avgp(t, **kw), f"avg {kw}"))
    return cases


def interp_cases(shape: tuple, placements: list) -> list[tuple]:
    n = len(shape) - 2
    linear = {1: "linear", 2: "bilinear", 3: "trilinear"}[n]
    cases = []
    for pl, mode in itertools.product(placements, ("nearest", "nearest-exact", linear)):
        aligns = (False, True) if mode == linear else (None,)
        for align, how in itertools.product(aligns, ("x2", "x1.5", "size_up", "size_down")):
            kw: dict[str, Any] = {"mode": mode, "align_corners": align}
            if how == "x2":
                kw["scale_factor"] = 2
            elif how == "x1.5":
                kw["scale_factor"] = 1.5
            else:
                grow = 3 if how == "size_up" else -2
                kw["size"] = tuple(max(1, s + grow) for s in shape[2:])
            cases.append((pl, shape, lambda t, kw=kw: F.interpolate(t, **kw), f"interp {kw}"))
    return cases


FAMILIES = {"pad": pad_cases, "pooling": pool_cases, "interpolate": interp_cases}

# per family: (input shape, the shard dim of each 1-D layout tried) on 2 ranks
ON_2_RANKS: dict[str, list[tuple[tuple, list[int]]]] = {
    "pad": [
        ((2, 3, 9), [2]),
        ((1, 2, 5), [2]),
        ((2, 2, 7, 6), [2, 3, 0]),
        ((1, 2, 4, 5), [2, 3, 0]),
        ((1, 2, 5, 4, 6), [2, 4]),
    ],
    "pooling": [((2, 2, 11), [2]), ((1, 2, 9, 8), [2, 3, 1]), ((1, 1, 7, 5, 6), [3])],
    "interpolate": [((2, 2, 9), [2]), ((1, 2, 7, 6), [2, 3, 0]), ((1, 1, 5, 4, 6), [4])],
}
# per family: (mesh, input shape, layouts as the shard dim per mesh dim) on 4 ranks: thin
# shards (one or two rows each) and the 2x2 mesh
ON_4_RANKS: dict[str, list[tuple[Any, tuple, list[tuple[int, ...]]]]] = {
    "pad": [
        (4, (1, 2, 5, 6), [(2,), (3,)]),
        (4, (2, 1, 7, 4), [(2,), (3,)]),
        ((2, 2), (2, 2, 7, 6), [(2, 3), (3, 0)]),
    ],
    "pooling": [(4, (1, 2, 7, 6), [(2,)]), ((2, 2), (2, 1, 9, 7), [(2, 3)])],
    "interpolate": [(4, (1, 2, 6, 5), [(2,), (3,)]), ((2, 2), (2, 1, 7, 6), [(3, 2)])],
}


def family_cases(family: str, shape: tuple, layouts: list[tuple[int, ...]]) -> list[tuple]:
    """The family's cases on `shape` for each layout (a shard dim per mesh dim)."""
    from torch.distributed.tensor import Shard

    return FAMILIES[family](shape, [[Shard(d) for d in layout] for layout in layouts])


@pytest.mark.ranks(2)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_window_ops_on_2_ranks(family: str) -> None:
    cases = []
    for shape, dims in ON_2_RANKS[family]:
        cases += family_cases(family, shape, [(d,) for d in dims])
    run_cases(cpu_mesh(2), cases)


@pytest.mark.ranks(4)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_window_ops_thin_shards_and_2x2_mesh(family: str) -> None:
    for mesh_shape, shape, layouts in ON_4_RANKS[family]:
        run_cases(cpu_mesh(mesh_shape), family_cases(family, shape, layouts))


@pytest.mark.ranks(2)
def test_conv_padding_modes_through_nn_conv() -> None:
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.func import functional_call

    mesh = cpu_mesh(2)

    def as_fn(conv: torch.nn.Module) -> Op:
        def fn(t: torch.Tensor) -> torch.Tensor:
            if not isinstance(t, DTensor):
                return conv(t)
            params = {
                k: distribute_tensor(v.detach(), mesh, [Replicate()])
                for k, v in conv.named_parameters()
            }
            return functional_call(conv, params, (t,))

        return fn

    cases = []
    for mode, n in itertools.product(("zeros", "reflect", "replicate", "circular"), (1, 2, 3)):
        conv_cls = {1: torch.nn.Conv1d, 2: torch.nn.Conv2d, 3: torch.nn.Conv3d}[n]
        torch.manual_seed(n)
        conv = conv_cls(2, 3, 3, padding=1, padding_mode=mode).double()
        shape = (2, 2, *([7, 6, 5][:n]))
        for dim in range(2, n + 2):
            cases.append(([Shard(dim)], shape, as_fn(conv), f"{mode}"))
    run_cases(mesh, cases)


@pytest.mark.ranks(2)
def test_bad_arguments_raise_torchs_own_errors() -> None:
    """Sharded inputs fail like unsharded ones (same type, same message), on every rank."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = cpu_mesh(2)
    x = torch.randn(2, 3, 6, 5, dtype=torch.float64)
    weights = {
        "channels": torch.randn(4, 2, 3, 3, dtype=torch.float64),  # x has 3 channels
        "kernel": torch.randn(4, 3, 9, 3, dtype=torch.float64),  # taller than the input
        "stride": torch.randn(4, 3, 3, 3, dtype=torch.float64),
    }
    calls: dict[str, Callable[[Any, Any], Any]] = {
        "channels": lambda t, w: F.conv2d(t, w, padding=1),
        "kernel": lambda t, w: F.conv2d(t, w),
        "stride": lambda t, w: F.conv2d(t, w, stride=0),
        "reflect": lambda t, w: F.pad(t, (0, 0, 6, 1), mode="reflect"),
        "circular": lambda t, w: F.pad(t, (0, 0, 7, 1), mode="circular"),
        "max pool": lambda t, w: F.max_pool2d(t, 2, padding=2),
        "avg pool": lambda t, w: F.avg_pool2d(t, 3, padding=2),
        "interpolate": lambda t, w: F.interpolate(t, scale_factor=-1.0),
    }
    problems = []
    for name, call in calls.items():
        w = weights.get(name)
        with pytest.raises(Exception) as want:
            call(x, w)
        wd = distribute_tensor(w, mesh, [Replicate()]) if w is not None else None
        for pl in ([Shard(2)], [Shard(3)]):
            try:
                call(distribute_tensor(x, mesh, pl), wd)
            except Exception as got:  # noqa: BLE001 - comparing with torch's exception
                if type(got) is not want.type or str(got) != str(want.value):
                    problems.append(f"{name} {pl}: {got!r} vs torch's {want.value!r}")
            else:
                problems.append(f"{name} {pl}: no error (torch raises {want.value!r})")
    assert not problems, "\n".join(problems)
