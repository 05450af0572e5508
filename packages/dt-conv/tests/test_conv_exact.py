"""Sharded convolutions on 2 and 4 CPU ranks equal the same convolution on one process.

Each rank test loops over many configurations (one world spawn, many cases); forward and
all three gradients are compared in float64 against plain torch on the full tensors.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from dt_core.testing import cpu_mesh
from dt_core.testing.cases import expect_exact

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def check(
    mesh: Any,
    placements: list,
    x_shape: tuple,
    w_shape: tuple,
    bias: bool,
    seed: int = 0,
    needs: tuple[bool, bool, bool] = (True, True, True),
    w_placements: list | None = None,
    b_placements: list | None = None,
    transposed: bool = False,
    **kw: Any,
) -> str | None:
    """Run one case sharded and unsharded; return a description of any mismatch."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    conv = (CONV_T if transposed else CONV)[len(x_shape) - 2]
    mode = kw.pop("padding_mode", "zeros")
    if mode != "zeros":  # as nn.Conv*d does it: pad first, then an unpadded conv
        pads = [kw.pop("padding")] * 2 * (len(x_shape) - 2)
        conv = (lambda c: lambda t, *a, **k: c(F.pad(t, pads, mode=mode), *a, **k))(conv)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(x_shape, generator=gen, dtype=torch.float64)
    w = torch.randn(w_shape, generator=gen, dtype=torch.float64)
    out_channels = w_shape[1] * kw.get("groups", 1) if transposed else w_shape[0]
    b = torch.randn(out_channels, generator=gen, dtype=torch.float64) if bias else None
    ref = [t.clone().requires_grad_(n) if t is not None else None for t, n in zip((x, w, b), needs)]
    y_ref = conv(*ref, **kw)
    g = torch.randn(y_ref.shape, generator=gen, dtype=torch.float64)
    wants_grad = any(needs[: 3 if bias else 2])
    if wants_grad:
        (y_ref * g).sum().backward()

    rep = [Replicate()] * mesh.ndim
    xd = distribute_tensor(x, mesh, placements).requires_grad_(needs[0])
    wd = distribute_tensor(w, mesh, w_placements or rep).requires_grad_(needs[1])
    bd = distribute_tensor(b, mesh, b_placements or rep).requires_grad_(needs[2]) if bias else None
    y = conv(xd, wd, bd, **kw)
    if any(p.is_partial() for p in y.placements):  # a sum over ranks: reduce it, as users do
        y = y.redistribute(mesh, [Replicate() if p.is_partial() else p for p in y.placements])
    gd = distribute_tensor(g, mesh, list(y.placements))
    if wants_grad:
        (y * gd).sum().backward()
    case = f"{placements} x{x_shape} w{w_shape} bias={bias} {mode} {kw}"
    if not torch.allclose(y.full_tensor(), y_ref):
        return f"forward differs: {case}"
    grads = [("input", xd, ref[0]), ("weight", wd, ref[1])]
    if bias:
        grads.append(("bias", bd, ref[2]))
    for name, got, want in grads:
        if not want.requires_grad:
            if got.grad is not None:
                return f"unexpected grad_{name}: {case}"
            continue
        if got.grad is None or not torch.allclose(got.grad.full_tensor(), want.grad):
            return f"grad_{name} differs: {case}"
    return None


def same_on_every_rank(max_examples: int) -> Any:
    """Hypothesis settings for a property every rank runs in step: the same examples in the
    same order (derandomized, no database), and no shrinking, which would diverge."""
    from hypothesis import Phase, settings

    return settings(
        max_examples=max_examples,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.generate],
    )


def run_cases(mesh: Any, cases: list[tuple]) -> None:
    """Check every case; all of them must take the sharded (non-fallback) path."""
    expect_exact("conv", (functools.partial(check, mesh, *c[:4], **c[4]) for c in cases))


@pytest.mark.ranks(2)
def test_conv2d_kernels_paddings_dilations_on_2_ranks() -> None:
    from torch.distributed.tensor import Shard

    mesh = cpu_mesh(2)
    cases = []
    for dim, size, k, pad, dil, stride in itertools.product(
        (2, 3), (8, 7, 3), (1, 2, 3, 4, 5), (0, 1, 2), (1, 2), (1, 2)
    ):
        x_shape = [2, 2, 6, 6]
        x_shape[dim] = size
        w_shape = [3, 2, 3, 3]
        w_shape[dim] = k
        if size + 2 * pad < dil * (k - 1) + 1:
            continue
        kw = {"padding": pad, "dilation": dil, "stride": stride}
        cases.append(([Shard(dim)], tuple(x_shape), tuple(w_shape), k % 2 == 1, kw))
    assert len(cases) > 200
    from dt_conv.engine.halo.exchange import counters

    sent = counters.get("bytes_sent")
    run_cases(mesh, cases)
    assert counters.get("bytes_sent") > sent  # halo exchanges counted (dt-core's Counters)


@pytest.mark.ranks(2)
def test_conv1d_conv3d_groups_bias_same_padding_on_2_ranks() -> None:
    from torch.distributed.tensor import Replicate, Shard

    mesh = cpu_mesh(2)
    cases = [
        ([Shard(2)], (2, 4, 11), (4, 2, 3), True, {"padding": 1, "groups": 2}),
        ([Shard(2)], (2, 4, 10), (4, 1, 5), False, {"padding": 2, "groups": 4}),  # depthwise
        ([Shard(2)], (2, 4, 9), (8, 1, 3), True, {"padding": "same", "groups": 4}),
        ([Shard(2)], (1, 3, 12), (2, 3, 3), True, {"padding": "same", "dilation": 2}),
        ([Shard(2)], (1, 3, 5), (2, 3, 4), True, {"stride": 3, "padding": 2}),
        ([Shard(0)], (3, 3, 8), (2, 3, 3), True, {"padding": 1}),
        ([Replicate()], (2, 3, 8), (2, 3, 3), True, {"padding": 1}),
        ([Shard(2)], (1, 2, 5, 6, 4), (3, 2, 3, 2, 3), True, {"padding": 1}),
        ([Shard(3)], (1, 2, 5, 7, 4), (3, 2, 3, 3, 3), False, {"padding": (0, 1, 2)}),
        ([Shard(4)], (2, 4, 4, 4, 5), (4, 2, 3, 3, 3), True, {"padding": 1, "groups": 2}),
        ([Shard(2)], (1, 4, 9, 6), (4, 1, 3, 3), True, {"padding": "same", "groups": 4}),
        ([Shard(3)], (1, 2, 6, 9), (2, 2, 3, 5), False, {"padding": "same", "dilation": 2}),
        ([Shard(2)], (2, 2, 1, 6), (2, 2, 1, 3), True, {"padding": (0, 1)}),  # one row
    ]
    run_cases(mesh, cases)


@pytest.mark.ranks(4)
def test_thin_and_empty_shards_on_4_ranks() -> None:
    from torch.distributed.tensor import Shard

    mesh = cpu_mesh(4)
    cases = []
    for size, k, pad, stride in itertools.product((2, 3, 5, 9, 16), (1, 3, 4, 5), (0, 2), (1, 2)):
        if size + 2 * pad < k:
            continue
        kw = {"padding": pad, "stride": stride}
        cases.append(([Shard(2)], (2, 2, size, 3), (2, 2, k, 3), True, kw))
        cases.append(([Shard(3)], (1, 2, 3, size), (2, 2, 3, k), False, kw))
    cases.append(([Shard(0)], (3, 2, 6, 6), (2, 2, 3, 3), True, {"padding": 1}))  # empty batch
    cases.append(([Shard(2)], (1, 2, 13), (2, 2, 5), True, {"dilation": 2, "padding": 3}))
    run_cases(mesh, cases)


@contextlib.contextmanager
def recording(module: Any, name: str, record: Callable[[Any], Any] = lambda out: out) -> Any:
    """Record `record(result)` per call of `module.name` (looked up at call time)."""
    original, seen = getattr(module, name), []

    def wrapper(*args: Any) -> Any:
        out = original(*args)
        seen.append(record(out))
        return out

    setattr(module, name, wrapper)
    try:
        yield seen
    finally:
        setattr(module, name, original)


def counting(module: Any, name: str) -> Any:
    """Record, per call of `module.name`, whether it returned something (a path taken)."""
    return recording(module, name, lambda out: out is not None)


@pytest.mark.ranks(4)
def test_several_sharded_dims_on_a_2x2_mesh() -> None:
    from dt_conv.ops.conv import forward
    from torch.distributed.tensor import Replicate, Shard

    mesh = cpu_mesh((2, 2))
    cases = []
    for pl, (h, w_), k, pad in itertools.product(
        (
            [Shard(2), Shard(3)],
            [Shard(3), Shard(2)],
            [Shard(0), Shard(3)],
            [Shard(2), Shard(0)],
            [Replicate(), Shard(3)],
            [Shard(2), Replicate()],
        ),
        ((8, 8), (7, 5), (3, 4)),
        (1, 2, 3),
        (0, 1),
    ):
        cases.append((pl, (3, 2, h, w_), (2, 2, k, k), k != 2, {"padding": pad}))
    cases.append(([Shard(2), Shard(4)], (1, 2, 5, 3, 6), (2, 2, 3, 3, 3), True, {"padding": 1}))
    cases.append(
        (
            [Shard(3), Shard(2)],
            (2, 4, 9, 7),
            (4, 2, 3, 3),
            True,
            {"padding": 1, "groups": 2, "stride": 2},
        )
    )
    with counting(forward, "_interior_first") as taken:
        run_cases(mesh, cases)
    assert sum(taken) >= 20, taken  # interior computed during the exchange on two dims


@pytest.mark.ranks(4)
def test_backward_on_a_2x2_mesh_overlaps_every_exchange() -> None:
    """Both gradients on two sharded dims: the weight gradient by blocks of output rows,
    each block during an exchange after its input halos arrived, sums exactly.

    Hand-derived schedules: 8x8 in 4x4 shards, 3x3 'same' conv: each dim's interior is
    2 rows, so every rank has the all-interior block, halo slabs along the first dim and
    along the last: one for each exchange after the first (which carries the input
    gradient). 2x8: H shards of one row have no interior and go first (the order from
    the shapes); the H slab with W's interior and the two W slabs still fill the three.
    4x4, 3x3 dilated by 2: no interior anywhere, one 2x2 block per rank that only the
    gradient exchanges can carry: halved until each of them has a piece.
    """
    from dt_conv.engine.overlap import backward as backward_overlap
    from torch.distributed.tensor import Shard

    mesh = cpu_mesh((2, 2))
    conv = ((2, 3, 3, 3), {"padding": 1})
    exact: list[tuple] = []
    for pl, (h, w_) in itertools.product(
        ([Shard(2), Shard(3)], [Shard(3), Shard(2)]), ((8, 8), (2, 8))
    ):
        exact.append((pl, (1, 3, h, w_), *conv))
    exact.append(([Shard(2), Shard(3)], (1, 3, 4, 4), conv[0], {"padding": 2, "dilation": 2}))
    with recording(backward_overlap, "backward_schedule") as schedules:
        run_cases(mesh, [(pl, x, w, True, kw) for pl, x, w, kw in exact])
    busy = [[exchange for exchange, blocks in s if blocks] for s in schedules]
    # exchange order: ties keep the mesh order; the thin H first
    assert busy == [
        [("input", 3), ("grad", 3), ("grad", 2)],
        [("input", 3), ("grad", 3), ("grad", 2)],
        [("input", 2), ("grad", 2), ("grad", 3)],
        [("input", 3), ("grad", 3), ("grad", 2)],
        [("grad", 3), ("grad", 2)],
    ], busy
    # uneven and one-row shards, strides, dilations, groups, both mesh orders: exact
    cases = []
    for pl, (h, w_), k, kw in itertools.product(
        ([Shard(2), Shard(3)], [Shard(3), Shard(2)]),
        ((7, 5), (3, 9), (2, 2), (11, 6)),
        (2, 3),
        ({"padding": 1}, {"stride": 2, "padding": 1}, {"dilation": 2, "padding": 2}),
    ):
        if min(h, w_) + 2 * kw["padding"] > kw.get("dilation", 1) * (k - 1):
            cases.append((pl, (2, 4, h, w_), (4, 2, k, k), k == 3, {**kw, "groups": 2}))
    with recording(backward_overlap, "backward_schedule") as schedules:
        run_cases(mesh, cases)
    assert len(schedules) >= len(cases) // 2, len(schedules)  # the staged path is common


@pytest.mark.ranks(2)
def test_unsupported_layouts_fall_back_exactly_and_warn_once() -> None:
    import warnings

    from dt_conv import fallback
    from dt_core.kit import FallbackWarning
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = cpu_mesh(2)
    fallback.reset_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # groups cut by the channel shards: fallback, twice, warned once
            case = ((2, 6, 7, 6), (3, 2, 3, 3), True)
            assert check(mesh, [Shard(1)], *case, padding=1, groups=3) is None
    texts = [str(w.message) for w in caught if "dt-conv" in str(w.message)]
    assert sum("channel dim" in t for t in texts) == 2  # forward once, backward once
    assert all(w.category is FallbackWarning for w in caught if "dt-conv" in str(w.message))
    assert all("exact" in t for t in texts)

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 7, 5, generator=gen, dtype=torch.float64)
    w = torch.randn(3, 2, 3, 3, generator=gen, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        xd = distribute_tensor(x, mesh, [Shard(1)])
        wd = distribute_tensor(w, mesh, [Replicate()])
        y = F.conv_transpose2d(xd, wd, padding=1)
    assert torch.allclose(y.full_tensor(), F.conv_transpose2d(x, w, padding=1))
    assert any("transposed" in str(c.message) for c in caught)

    # a plain input with DTensor parameters: a replicated DTensor out, and the input's
    # gradient plain (a plain op upstream gets it), both equal to one process's
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    F.conv2d(xr * 2, wr.transpose(0, 1), padding=1).square().sum().backward()
    xp = x.clone().requires_grad_()
    wd = distribute_tensor(w, mesh, [Replicate()]).requires_grad_()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        y = F.conv2d(xp * 2, wd.transpose(0, 1), padding=1)
        assert y.placements == (Replicate(),)
        y.square().sum().backward()
    assert type(xp.grad) is torch.Tensor and torch.allclose(xp.grad, xr.grad)
    assert torch.allclose(wd.grad.full_tensor(), wr.grad)


@pytest.mark.ranks(2)
def test_random_configurations_property() -> None:
    from hypothesis import given
    from hypothesis import strategies as st
    from torch.distributed.tensor import Shard

    mesh = cpu_mesh(2)

    # the breadth (meshes of 2-8 ranks, 300 examples) runs in one process under
    # LocalTensorMode (test_local_tensor.py); real ranks keep a sample of the same sweep
    @same_on_every_rank(max_examples=20)
    @given(st.data())
    def prop(data: Any) -> None:
        nspatial = data.draw(st.integers(1, 3))
        groups = data.draw(st.sampled_from([1, 2]))
        sizes = [data.draw(st.integers(1, 9 if nspatial < 3 else 5)) for _ in range(nspatial)]
        kernels = [data.draw(st.integers(1, 4)) for _ in range(nspatial)]
        dilation = data.draw(st.integers(1, 2))
        stride = data.draw(st.integers(1, 3))
        same = stride == 1 and data.draw(st.booleans())
        padding: Any = "same" if same else data.draw(st.integers(0, 2))
        pad = 0 if same else padding
        if any(s + 2 * pad < dilation * (k - 1) + 1 for s, k in zip(sizes, kernels)):
            return
        dim = data.draw(st.integers(0, nspatial + 1))
        if dim == 1:
            dim = 0
        x_shape = (2, 2 * groups, *sizes)
        w_shape = (2 * groups, 2, *kernels)
        kw = {"padding": padding, "dilation": dilation, "groups": groups}
        if not same:
            kw["stride"] = stride
        problem = check(mesh, [Shard(dim)], x_shape, w_shape, data.draw(st.booleans()), **kw)
        assert problem is None, problem

    prop()


@pytest.mark.ranks(2)
def test_output_mask_and_sharded_weight() -> None:
    from torch.distributed.tensor import Shard

    mesh = cpu_mesh(2)
    cases = []
    for needs in itertools.product((True, False), repeat=3):
        kw = {"padding": 1, "needs": needs}
        cases.append(([Shard(2)], (2, 2, 7, 5), (4, 2, 3, 3), True, kw))
        cases.append(([Shard(3)], (2, 2, 5, 7), (4, 2, 3, 3), True, {**kw, "stride": 2}))
    cases.append(([Shard(2)], (2, 2, 7, 5), (4, 2, 3, 3), True, {"w_placements": [Shard(0)]}))
    run_cases(mesh, cases)


@pytest.mark.ranks(2)
def test_partial_input_falls_back_to_a_replicated_exact_result() -> None:
    import warnings

    from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor

    mesh = cpu_mesh(2)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 2, 6, 5, generator=gen, dtype=torch.float64)
    w = torch.randn(3, 2, 3, 3, generator=gen, dtype=torch.float64)
    xd = DTensor.from_local(x / 2, mesh, [Partial()], run_check=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = F.conv2d(xd, distribute_tensor(w, mesh, [Replicate()]), padding=1)
    assert y.placements == (Replicate(),)
    assert torch.allclose(y.to_local(), F.conv2d(x, w, padding=1))
    assert any("Partial" in str(c.message) for c in caught)


def transposed_cases(placements: list, sizes: tuple) -> list[tuple]:
    cases = []
    for size, k, stride, pad, dil, out_pad in itertools.product(
        sizes, (1, 2, 3, 4), (1, 2, 3), (0, 1, 2), (1, 2), (0, 1)
    ):
        if (
            out_pad >= max(stride, dil)
            or (size - 1) * stride - 2 * pad + dil * (k - 1) + out_pad < 0
        ):
            continue
        kw = {"stride": stride, "padding": pad, "dilation": dil, "output_padding": out_pad}
        x_shape = [2, 2, 5, 4]
        x_shape[placements[0].dim] = size
        cases.append(
            (placements, tuple(x_shape), (2, 3, k, 3), k % 2 == 0, {**kw, "transposed": True})
        )
    return cases


@pytest.mark.ranks(2)
def test_transposed_conv_on_2_ranks() -> None:
    from torch.distributed.tensor import Shard

    mesh = cpu_mesh(2)
    cases = transposed_cases([Shard(2)], (1, 4, 7))
    cases += [
        (
            [Shard(2)],
            (2, 4, 9),
            (4, 1, 3),
            True,
            {"stride": 2, "padding": 1, "groups": 2, "transposed": True},
        ),
        (
            [Shard(3)],
            (1, 2, 4, 5, 6),
            (2, 2, 3, 2, 3),
            True,
            {"stride": 2, "padding": 1, "transposed": True},
        ),
        ([Shard(0)], (3, 2, 5, 5), (2, 2, 3, 3), True, {"stride": 2, "transposed": True}),
    ]
    run_cases(mesh, cases)


@pytest.mark.ranks(4)
def test_transposed_conv_thin_shards_and_2x2_mesh() -> None:
    from dt_conv.engine.overlap import backward as backward_overlap
    from dt_conv.ops.transposed import forward as transposed
    from torch.distributed.tensor import Shard

    # 5 rows on 4 ranks: 2, 2, 1, 0 (an empty shard); 11 rows: 3, 3, 3, 2
    cases = transposed_cases([Shard(2)], (2, 5))
    cases += [c for c in transposed_cases([Shard(2)], (11,)) if c[4]["dilation"] == 1 < c[2][2]]
    with counting(transposed, "_interior_first") as taken:
        run_cases(cpu_mesh(4), cases)
    assert sum(taken) >= 20, taken  # interior computed during the exchange on 4 ranks
    cases = [
        (
            [Shard(2), Shard(3)],
            (1, 2, 5, 6),
            (2, 3, 3, 3),
            True,
            {"stride": 2, "padding": 1, "transposed": True},
        ),
        (
            [Shard(3), Shard(0)],
            (2, 2, 4, 7),
            (2, 2, 4, 2),
            False,
            {"stride": 3, "output_padding": 1, "transposed": True},
        ),
    ]
    # both dims sharded, uneven and thin (1-row shards, shards thinner than the reach)
    for pl, (h, w_), k, stride in itertools.product(
        ([Shard(2), Shard(3)], [Shard(3), Shard(2)]), ((3, 8), (7, 2), (6, 5)), (2, 3), (1, 2)
    ):
        kw = {"stride": stride, "padding": k - 2, "transposed": True}
        cases.append((pl, (1, 2, h, w_), (2, 3, k, 3), k == 3, kw))
    with counting(transposed, "_interior_first") as taken:
        with recording(backward_overlap, "backward_schedule") as schedules:
            run_cases(cpu_mesh((2, 2)), cases)
    assert sum(taken) >= 20, taken
    # backward: weight-gradient blocks during every exchange after the first (on this
    # rank) in most cases
    busy = [all(blocks for _, blocks in s) for s in schedules]
    assert len(busy) >= 20 and sum(busy) >= len(busy) // 2, busy
    # three sharded dims (one of them over a mesh dim of size 1: no halo)
    cases = [
        ([Shard(2), Shard(3), Shard(4)], (1, 2, 5, 4, 7), (2, 2, 3, 2, 3), True, {"padding": 1}),
        ([Shard(4), Shard(2), Shard(3)], (1, 2, 6, 3, 5), (2, 2, 3, 3, 2), False, {"stride": 2}),
        (
            [Shard(3), Shard(4), Shard(2)],
            (1, 2, 4, 5, 6),
            (2, 2, 3, 3, 3),
            True,
            {"stride": 2, "padding": 1, "transposed": True},
        ),
    ]
    run_cases(cpu_mesh((2, 1, 2)), cases)


@pytest.mark.ranks(4)
def test_output_channel_sharded_weights_give_channel_sharded_outputs() -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = cpu_mesh((2, 2))
    cases = []
    for x_pl, w_pl in (
        ([Shard(2), Replicate()], [Replicate(), Shard(0)]),
        ([Replicate(), Shard(3)], [Shard(0), Replicate()]),
        ([Shard(0), Replicate()], [Replicate(), Shard(0)]),
        ([Replicate(), Replicate()], [Shard(0), Replicate()]),
    ):
        for cout, b_pl in itertools.product((4, 5), (None, "like_weight")):
            kw = {"padding": 1, "w_placements": w_pl, "b_placements": w_pl if b_pl else None}
            cases.append((x_pl, (2, 3, 7, 6), (cout, 3, 3, 3), True, kw))
    run_cases(mesh, cases)
    gen = torch.Generator().manual_seed(0)
    x = distribute_tensor(torch.randn(1, 2, 6, 6, generator=gen), mesh, [Shard(2), Replicate()])
    w = distribute_tensor(torch.randn(4, 2, 3, 3, generator=gen), mesh, [Replicate(), Shard(0)])
    assert F.conv2d(x, w, padding=1).placements == (Shard(2), Shard(1))


@pytest.mark.ranks(2)
def test_same_convs_take_the_overlapped_path_and_stay_exact() -> None:
    from dt_conv.ops.conv import same as same_conv
    from torch.distributed.tensor import Shard

    cases = [
        ([Shard(d)], (2, 3, 9, 8), (4, 3, k, k), True, {"padding": "same", "dilation": dil})
        for d, k, dil in itertools.product((2, 3), (3, 5), (1, 2))
    ]
    with counting(same_conv, "same_conv_overlapped") as taken:
        with counting(same_conv, "same_conv_gradients") as backward_taken:
            run_cases(cpu_mesh(2), cases)
    assert sum(taken) >= 4, taken  # thick enough shards overlap; thin ones use the window
    assert backward_taken == taken, (backward_taken, taken)  # backward: the same cases


@pytest.mark.ranks(4)
def test_same_conv_backward_without_a_window_on_4_ranks() -> None:
    """The 'same' conv's backward split at the seams equals one process's, next to ranks
    too thin for it (which take the window path, same exchanges): uneven shards of 4 to
    1 rows, halos of 1-4 rows, dilation, groups, padding along an unsharded dim."""
    from dt_conv.ops.conv import same as same_conv
    from torch.distributed.tensor import Shard

    cases = []
    for size, k, dil, bias in itertools.product((16, 13, 7), (3, 5), (1, 2), (True, False)):
        groups = 1 + bias
        kw = {"padding": "same", "dilation": dil, "groups": groups}
        cases.append(([Shard(2)], (2, 2 * groups, size, 5), (4, 2, k, 3), bias, kw))
    cases.append(([Shard(3)], (1, 2, 4, 9, 3), (3, 2, 3, 3, 3), True, {"padding": 1}))
    with counting(same_conv, "same_conv_gradients") as taken:
        run_cases(cpu_mesh(4), cases)
    assert sum(taken) >= 4, taken  # on every rank: the last one's shards are 4, 1, 1 rows


@pytest.mark.ranks(4)
def test_input_channel_sharding_gives_partial_outputs() -> None:
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    cases = []
    for cin, bias, w_pl in itertools.product((4, 5, 3), (True, False), ("rep", "shard")):
        kw = {"padding": 1, "w_placements": [Shard(1)] if w_pl == "shard" else None}
        cases.append(([Shard(1)], (2, cin, 7, 6), (3, cin, 3, 3), bias, kw))
    cases.append(([Shard(1)], (2, 3, 9), (2, 3, 4), True, {"stride": 2, "padding": 2}))
    cases.append(([Shard(1)], (1, 4, 4, 5, 3), (2, 4, 3, 3, 1), True, {"padding": 1}))
    run_cases(cpu_mesh(4), cases)  # 3 channels on 4 ranks: one rank holds none

    mesh = cpu_mesh((2, 2))
    cases = []
    for x_pl, w_pl in (
        ([Shard(1), Shard(2)], [Shard(1), Replicate()]),
        ([Shard(3), Shard(1)], [Replicate(), Shard(1)]),
        ([Shard(0), Shard(1)], [Replicate(), Replicate()]),
    ):
        for needs in ((True, True, True), (False, True, False), (True, False, True)):
            kw = {"padding": 1, "w_placements": w_pl, "needs": needs}
            cases.append((x_pl, (2, 5, 7, 6), (3, 5, 3, 3), True, kw))
    run_cases(mesh, cases)
    gen = torch.Generator().manual_seed(0)
    x = distribute_tensor(torch.randn(1, 4, 6, 6, generator=gen), mesh, [Shard(2), Shard(1)])
    w = distribute_tensor(torch.randn(2, 4, 3, 3, generator=gen), mesh, [Replicate(), Shard(1)])
    assert F.conv2d(x, w, padding=1).placements == (Shard(2), Partial())


@pytest.mark.ranks(4)
def test_grouped_and_depthwise_convs_stay_channel_sharded() -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    cases = []
    for (cin, cout, groups), w_pl, bias in itertools.product(
        ((4, 4, 4), (8, 8, 8), (4, 8, 4), (8, 12, 4), (8, 4, 4)), ("rep", "shard"), (True, False)
    ):
        w_pl_list = [Shard(0)] if w_pl == "shard" else None
        kw = {"padding": 1, "groups": groups, "w_placements": w_pl_list, "b_placements": w_pl_list}
        cases.append(([Shard(1)], (2, cin, 7, 6), (cout, cin // groups, 3, 3), bias, kw))
    cases.append(([Shard(1)], (1, 4, 9), (8, 1, 4), True, {"groups": 4, "stride": 2}))
    run_cases(cpu_mesh(4), cases)

    mesh = cpu_mesh((2, 2))
    cases = []
    for x_pl, w_pl in (
        ([Shard(2), Shard(1)], [Replicate(), Shard(0)]),
        ([Shard(1), Shard(3)], [Replicate(), Replicate()]),
    ):
        for needs in ((True, True, True), (False, True, True), (True, False, False)):
            kw = {"padding": 1, "groups": 6, "w_placements": w_pl, "needs": needs}
            cases.append((x_pl, (2, 6, 7, 6), (12, 1, 3, 3), True, kw))
    run_cases(mesh, cases)
    gen = torch.Generator().manual_seed(0)
    x = distribute_tensor(torch.randn(1, 4, 6, 6, generator=gen), mesh, [Shard(2), Shard(1)])
    w = distribute_tensor(torch.randn(4, 1, 3, 3, generator=gen), mesh, [Replicate(), Shard(0)])
    assert F.conv2d(x, w, padding=1, groups=4).placements == (Shard(2), Shard(1))


@pytest.mark.ranks(4)
def test_random_configurations_on_4_ranks_and_2x2_mesh_property() -> None:
    """Hypothesis over meshes (1-D of 4, 2x2), placements, padding modes and conv settings."""
    from hypothesis import given
    from hypothesis import strategies as st
    from torch.distributed.tensor import Replicate, Shard

    meshes = {"4": cpu_mesh(4), "2x2": cpu_mesh((2, 2))}

    @same_on_every_rank(max_examples=15)
    @given(st.data())
    def prop(data: Any) -> None:
        mesh = meshes[data.draw(st.sampled_from(sorted(meshes)))]
        nspatial = data.draw(st.integers(1, 3))
        sizes = [data.draw(st.integers(1, 9 if nspatial < 3 else 5)) for _ in range(nspatial)]
        kernels = [data.draw(st.integers(1, 4)) for _ in range(nspatial)]
        dilation, stride = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
        mode = data.draw(st.sampled_from(["zeros", "reflect", "replicate", "circular"]))
        pad = data.draw(st.integers(0, 2))
        if mode == "reflect" and pad >= min(sizes) or mode == "circular" and pad > min(sizes):
            return  # torch rejects these (tested elsewhere)
        if any(s + 2 * pad < dilation * (k - 1) + 1 for s, k in zip(sizes, kernels)):
            return
        dims = data.draw(
            st.lists(
                st.sampled_from([None, 0, *range(2, nspatial + 2)]),
                min_size=mesh.ndim,
                max_size=mesh.ndim,
            ).filter(
                lambda ds: (
                    len([d for d in ds if d is not None]) == len({d for d in ds if d is not None})
                )
            )
        )
        placements = [Replicate() if d is None else Shard(d) for d in dims]
        groups = data.draw(st.sampled_from([1, 2]))
        x_shape = (2, 2 * groups, *sizes)
        w_shape = (2 * groups, 2, *kernels)
        kw = {"padding": pad, "dilation": dilation, "groups": groups, "stride": stride}
        kw["padding_mode"] = mode
        problem = check(mesh, placements, x_shape, w_shape, data.draw(st.booleans()), **kw)
        assert problem is None, problem

    prop()


@pytest.mark.ranks(4)
def test_random_transposed_convs_on_4_ranks_and_2x2_mesh_property() -> None:
    """Hypothesis over meshes, placements and transposed conv settings: the overlapped
    forward (blocks by stage, thin dims first) and backward stay exact."""
    from dt_conv.ops.transposed import forward as transposed
    from hypothesis import given
    from hypothesis import strategies as st
    from torch.distributed.tensor import Replicate, Shard

    meshes = {"4": cpu_mesh(4), "2x2": cpu_mesh((2, 2))}

    @same_on_every_rank(max_examples=12)
    @given(st.data())
    def prop(data: Any) -> None:
        mesh = meshes[data.draw(st.sampled_from(sorted(meshes)))]
        nspatial = data.draw(st.integers(1, 2))
        sizes = [data.draw(st.integers(1, 9)) for _ in range(nspatial)]
        kernels = [data.draw(st.integers(1, 4)) for _ in range(nspatial)]
        dilation, stride = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
        pad = data.draw(st.integers(0, 2))
        out_pad = data.draw(st.integers(0, max(stride, dilation) - 1))
        reach = [dilation * (k - 1) for k in kernels]
        if (
            min((n - 1) * stride - 2 * pad + r + out_pad for n, r in zip(sizes, reach, strict=True))
            < 0
        ):
            return  # an empty output (torch's error is tested elsewhere)
        dims = data.draw(
            st.lists(
                st.sampled_from([None, 0, *range(2, nspatial + 2)]),
                min_size=mesh.ndim,
                max_size=mesh.ndim,
                unique=True,
            )
        )
        placements = [Replicate() if d is None else Shard(d) for d in dims]
        groups = data.draw(st.sampled_from([1, 2]))
        kw = {"padding": pad, "dilation": dilation, "groups": groups, "stride": stride}
        kw["output_padding"], kw["transposed"] = out_pad, True
        x_shape, w_shape = (2, 2 * groups, *sizes), (2 * groups, 2, *kernels)
        problem = check(mesh, placements, x_shape, w_shape, data.draw(st.booleans()), **kw)
        assert problem is None, problem

    with counting(transposed, "_interior_first") as taken:
        prop()
    assert any(taken), taken  # some examples overlapped on this rank


@pytest.mark.ranks(2)
def test_other_convs_compute_their_interior_while_halos_travel() -> None:
    from dt_conv.ops.conv import backward, forward
    from dt_conv.ops.conv import same as same_conv
    from torch.distributed.tensor import Shard

    cases = [
        ([Shard(d)], (2, 3, 12, 11), (4, 3, k, k), True, {"padding": p, "stride": st})
        for d, k, p, st in itertools.product((2, 3), (2, 3, 4), (0, 1, 2), (1, 2))
    ]
    cases.append(([Shard(2)], (1, 2, 20), (2, 2, 3), False, {"dilation": 3, "padding": 1}))
    with counting(forward, "_interior_first") as taken:
        with counting(backward, "_overlapped_gradients") as backward_taken:
            with counting(same_conv, "same_conv_gradients") as same:
                run_cases(cpu_mesh(2), cases)
    assert sum(taken) >= 20, taken
    # one sharded dim, both gradients wanted: overlapped, 'same' convs split at the seams
    assert len(backward_taken) + sum(same) == len(cases), (backward_taken, same)
    assert len(backward_taken) > sum(same) > 0, (backward_taken, same)


@pytest.mark.ranks(2)
def test_transposed_convs_compute_their_interior_while_halos_travel() -> None:
    from dt_conv.ops.transposed import forward as transposed
    from torch.distributed.tensor import Shard

    cases = []
    for d, k, st, pad, dil, out_pad in itertools.product(
        (2, 3), (2, 3, 4), (1, 2, 3), (0, 2), (1, 2), (0, 1)
    ):
        # taps of neighbouring input rows overlap (a wider stride may need no halo)
        if out_pad < max(st, dil) and dil * (k - 1) >= st:
            kw = {"stride": st, "padding": pad, "dilation": dil, "output_padding": out_pad}
            cases.append(([Shard(d)], (2, 3, 12, 11), (3, 2, k, k), k != 3, kw))
    cases.append(([Shard(2)], (1, 4, 10), (4, 1, 3), True, {"stride": 2, "groups": 2}))
    cases = [(*case[:4], {**case[4], "transposed": True}) for case in cases]
    with counting(transposed, "_interior_first") as taken:
        run_cases(cpu_mesh(2), cases)
    # shards of 5 or more rows: every rank has output rows reading only its own rows
    assert len(taken) == len(cases) and all(taken), taken


def _chain_matches(mesh: Any, placements: list, x_shape: tuple, layers: list) -> None:
    """`layers` (F op, weight shape, kwargs) applied in turn to a DTensor equal the same
    ops on one process: output, input and weight gradients."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(x_shape, generator=gen, dtype=torch.float64)
    ws = [torch.randn(s, generator=gen, dtype=torch.float64) if s else None for _, s, _ in layers]
    ref = [t.clone().requires_grad_() for t in (x, *[w for w in ws if w is not None])]
    xd = distribute_tensor(x, mesh, placements).requires_grad_()
    rep = [Replicate()] * mesh.ndim
    wd = [distribute_tensor(w, mesh, rep).requires_grad_() for w in ws if w is not None]

    def run(t: Any, params: list) -> Any:
        it = iter(params)
        for op, shape, kw in layers:
            t = op(t, next(it), **kw) if shape else op(t, **kw)
        return t

    y_ref, y = run(ref[0], ref[1:]), run(xd, wd)
    assert tuple(y.placements) == tuple(placements)
    g = torch.randn(y_ref.shape, generator=gen, dtype=torch.float64)
    (y_ref * g).sum().backward()
    (y * distribute_tensor(g, mesh, placements)).sum().backward()
    torch.testing.assert_close(y.full_tensor(), y_ref)
    for got, want in zip([xd, *wd], ref, strict=True):
        torch.testing.assert_close(got.grad.full_tensor(), want.grad)


@pytest.mark.ranks(4)
def test_later_layers_on_a_2x2_mesh_overlap_the_second_exchange() -> None:
    """Shards too thin along the first sharded dim for any interior still overlap the
    second dim's exchange: the slabs along the first dim (its window has arrived) with
    the second dim's interior. Stages are hand-derived per rank from the shapes."""
    from dt_conv.engine.overlap import forward as interior
    from torch.distributed.tensor import Shard

    mesh = cpu_mesh((2, 2))
    h = mesh.get_local_rank(0)  # this rank's chunk of H
    conv = (F.conv2d, (3, 2, 3, 3), {"padding": 1})
    # 12x24 -> 6x12 per rank: interiors on both dims (stage 0) and H's halo rows
    # computed during W's exchange (stage 1); pooled to 3x6, H shards of 2 and 1 rows
    # have no interior for a 3x3 conv, W shards of 3 have one: stage 1 only
    pool = (F.avg_pool2d, None, {"kernel_size": 4})
    layers = [conv, pool, (F.conv2d, (2, 3, 3, 3), {"padding": 1})]
    with recording(interior, "overlapped_stages") as stages:
        _chain_matches(mesh, [Shard(2), Shard(3)], (1, 2, 12, 24), layers)
    assert stages == [[0, 1], [1]], stages
    # the thin dim sharded over the second mesh dim: its halos still travel first (the
    # order all ranks derive from the shapes), else no block would precede the last wait
    with recording(interior, "overlapped_stages") as stages:
        _chain_matches(mesh, [Shard(3), Shard(2)], (1, 2, 12, 24), layers)
    assert stages == [[0, 1], [1]], stages
    # transposed 3x3, padding 1, on 2x8: each H chunk holds one input and one output
    # row, and each output row reads both input rows: no interior along H anywhere; W
    # shards of 4 have one: stage 1 only, on every rank
    layers = [(F.conv_transpose2d, (2, 3, 3, 3), {"padding": 1})]
    with recording(interior, "overlapped_stages") as stages:
        _chain_matches(mesh, [Shard(2), Shard(3)], (1, 2, 2, 8), layers)
    assert stages == [[1]], stages
    # transposed 3x3, stride 2, padding 1, output_padding 1 on 8x8: every chunk has an
    # interior on both dims; H chunk 0's output row 7 reads input row 4 (chunk 1's),
    # so it also computes during W's exchange
    kw = {"stride": 2, "padding": 1, "output_padding": 1}
    layers = [(F.conv_transpose2d, (2, 3, 3, 3), kw)]
    with recording(interior, "overlapped_stages") as stages:
        _chain_matches(mesh, [Shard(2), Shard(3)], (1, 2, 8, 8), layers)
    assert stages == ([[0, 1]] if h == 0 else [[0]]), (h, stages)
