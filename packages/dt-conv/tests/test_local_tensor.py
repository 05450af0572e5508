"""dt-conv sharded under torch's LocalTensorMode: 2-8 ranks simulated in one process.

Every op dt-conv owns runs its halo path there (no replicated fallback, no warning):
each simulated rank's output and gradients (input, weight, bias) are compared in
float64 with plain torch on one process, and the output keeps the input's sharding.
The property sweep covers what spawned worlds cannot afford (world sizes 3 and 5-8, odd
2-D meshes); what only real processes show (overlap, hangs) stays in the gloo tests.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from dt_core.testing import rank_values, simulated_ranks
from dt_core.testing.sweeps import mesh_params

Op = Callable[..., Any]


def _fallbacks(caught: list[warnings.WarningMessage]) -> list[str]:
    from dt_core.kit import FallbackWarning

    return sorted({str(w.message) for w in caught if issubclass(w.category, FallbackWarning)})


class SimulatedWorld:
    """`world` ranks simulated in this process on one mesh, kept open for many cases (the
    mode caches each rank's mesh coordinates). References run with the mode disabled."""

    def __init__(self, world: int, mesh_shape: Sequence[int]) -> None:
        self.world, self.mesh_shape = world, tuple(mesh_shape)

    def __enter__(self) -> SimulatedWorld:
        from torch.distributed.device_mesh import init_device_mesh

        self._ranks = simulated_ranks(self.world)
        self.mode = self._ranks.__enter__()
        self.mesh = init_device_mesh("cpu", self.mesh_shape)
        from dt_core.compat.local_tensor import int_on_rank

        local = [self.mesh.get_local_rank(d) for d in range(self.mesh.ndim)]
        self.coords = [tuple(int_on_rank(c, r) for c in local) for r in range(self.world)]
        return self

    def shards(self, t: torch.Tensor, placements: Sequence[Any]) -> list[torch.Tensor]:
        """What each rank holds of `t` laid out by `placements`: `Shard`'s chunk rule
        (torch.chunk, trailing shards empty), read off mesh coordinates, no collective."""
        out = []
        for coord in self.coords:
            local = t
            for d, p in enumerate(placements):
                if p.is_shard():
                    chunks = local.chunk(self.mesh_shape[d], p.dim)
                    k = coord[d]
                    local = chunks[k] if k < len(chunks) else local.narrow(p.dim, 0, 0)
            out.append(local)
        return out

    def distribute(self, t: torch.Tensor, placements: Sequence[Any]) -> Any:
        """`distribute_tensor` without its scatter: each simulated rank's shard directly."""
        from torch.distributed.tensor import DTensor

        shards = self.shards(t.detach(), placements)
        local = self.mode.rank_map(lambda r: shards[r].clone())
        shape, stride = t.shape, t.stride()
        return DTensor.from_local(
            local, self.mesh, list(placements), run_check=False, shape=shape, stride=stride
        )

    def __exit__(self, *exc: object) -> None:
        self._ranks.__exit__(*exc)

    def compare(
        self,
        placements: Sequence[Any],
        fn: Op,
        x: torch.Tensor,
        params: Sequence[torch.Tensor] = (),
        keep: bool = True,
        name: str = "",
        param_placements: Sequence[Sequence[Any]] | None = None,
    ) -> str | None:
        """`fn(x, *params)` with `x` sharded (parameters replicated, or as given) against
        plain torch: every simulated rank's shard of the output (partial sums reduced)
        and of each gradient must be the matching shard of the unsharded result; a
        description of the first mismatch."""
        from torch.distributed.tensor import Replicate

        mesh, world = self.mesh, self.world
        case = f"{name} world={world} mesh={self.mesh_shape} {list(placements)} x{tuple(x.shape)}"
        with self.mode.disable():
            ref = [t.clone().requires_grad_() for t in (x, *params)]
            out_ref = fn(*ref)
            extra_ref = out_ref[1:] if isinstance(out_ref, tuple) else ()
            y_ref = out_ref[0] if isinstance(out_ref, tuple) else out_ref
            gen = torch.Generator().manual_seed(x.numel())
            g = torch.randn(y_ref.shape, generator=gen, dtype=y_ref.dtype)
            (y_ref * g).sum().backward()
        want = [y_ref.detach(), *(t.grad for t in ref)]
        rep = [Replicate()] * mesh.ndim
        xd = self.distribute(x, placements).requires_grad_()
        layouts = param_placements or [rep] * len(params)
        pd = [
            self.distribute(p, pl).requires_grad_() for p, pl in zip(params, layouts, strict=True)
        ]
        out = fn(xd, *pd)
        extra = out[1:] if isinstance(out, tuple) else ()
        y = out[0] if isinstance(out, tuple) else out
        if any(p.is_partial() for p in y.placements):  # a sum over ranks: reduce, as users do
            y = y.redistribute(mesh, [Replicate() if p.is_partial() else p for p in y.placements])
        if keep and tuple(y.placements) != tuple(placements):
            return f"output placements {tuple(y.placements)}: {case}"
        (y * self.distribute(g, y.placements)).sum().backward()
        got = [y, *(t.grad for t in (xd, *pd))]
        labels = ["out", "grad_input", *(f"grad_param{i}" for i in range(len(params)))]
        for label, value, expected in zip(labels, got, want, strict=True):
            if value is None or value.shape != expected.shape:
                return f"{label} missing or of shape {getattr(value, 'shape', None)}: {case}"
            if any(p.is_partial() for p in value.placements):  # torch may leave a sum
                reduced = [Replicate() if p.is_partial() else p for p in value.placements]
                value = value.redistribute(mesh, reduced)  # pending (2.12 does): reduce it
            shards = self.shards(expected, value.placements)
            for rank, (a, e) in enumerate(
                zip(rank_values(value.to_local(), world), shards, strict=True)
            ):
                if a.shape != e.shape or not torch.allclose(a, e, atol=1e-10):
                    return f"{label} differs on rank {rank}: {case}"
        for value, expected in zip(extra, extra_ref, strict=True):
            shards = self.shards(expected, value.placements)
            for rank, (a, e) in enumerate(
                zip(rank_values(value.to_local(), world), shards, strict=True)
            ):
                if not torch.equal(a, e):
                    return f"indices differ on rank {rank}: {case}"
        return None


def run_cases(cases: list[tuple]) -> None:
    """Every case exact, and none of them fell back (dt-conv's FallbackWarning). Cases
    are (world, mesh shape, placements, fn, x, params, keep, name); one world per mesh."""
    from dt_conv.fallback import reset_warnings

    reset_warnings()
    failures: list[str] = []
    meshes = sorted({(c[0], tuple(c[1])) for c in cases})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for world, mesh_shape in meshes:
            with SimulatedWorld(world, mesh_shape) as sim:
                for c in cases:
                    if (c[0], tuple(c[1])) == (world, mesh_shape):
                        failure = sim.compare(*c[2:8], param_placements=(c[8:] or [None])[0])
                        if failure is not None:
                            failures.append(failure)
    assert not _fallbacks(caught), _fallbacks(caught)
    assert not failures, f"{len(failures)}/{len(cases)} cases wrong:\n" + "\n".join(failures)


def sweep_simulated(
    mesh_shape: Sequence[int], budget: int, case: Callable[[SimulatedWorld, Any], str | None]
) -> None:
    """A hypothesis sweep of `budget` cases (derandomized: the same every run) on simulated
    ranks of `mesh_shape`, kept open for all of them. `case(sim, data)` draws one case,
    runs it and describes what it got wrong (None: right); every case runs before the
    test fails, listing the first 20 wrong."""
    from dt_core.testing.sweeps import sweep_settings
    from hypothesis import HealthCheck, given
    from hypothesis import strategies as st

    failures: list[str] = []
    with SimulatedWorld(math.prod(mesh_shape), mesh_shape) as sim:

        @sweep_settings(
            budget, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(st.data())
        def sweep(data: Any) -> None:
            failure = case(sim, data)
            if failure is not None:
                failures.append(failure)

        sweep()
    assert not failures, f"{len(failures)} cases wrong:\n" + "\n".join(failures[:20])


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64)


# ---- fixed cases: every op kind on 1-D and 2-D meshes, uneven and empty shards ----------


def _conv(**kw: Any) -> Op:
    return lambda x, w, b: {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[x.ndim](x, w, b, **kw)


def _conv_t(**kw: Any) -> Op:
    convs = {3: F.conv_transpose1d, 4: F.conv_transpose2d, 5: F.conv_transpose3d}
    return lambda x, w, b: convs[x.ndim](x, w, b, **kw)


def op_cases() -> list[tuple]:
    from torch.distributed.tensor import Replicate, Shard

    s2, s3 = [Shard(2)], [Shard(3)]
    grid = [Shard(2), Shard(3)]
    x7, x2d = randn(2, 3, 7, 9), randn(1, 2, 10, 7, seed=1)
    w3 = randn(4, 3, 3, 3, seed=2)
    b4 = randn(4, seed=3)
    cases: list[tuple] = [
        (2, (2,), s2, _conv(padding=1), x7, [w3, b4], True, "conv2d 3x3"),
        (3, (3,), s3, _conv(padding="same", dilation=2), x7, [w3, b4], True, "conv2d same"),
        (4, (2, 2), grid, _conv(stride=2, padding=1), x7, [w3, b4], True, "conv2d 2x2"),
        (5, (5,), s2, _conv(padding=2, dilation=2), x7, [w3, b4], True, "thin+empty shards"),
        (
            2,
            (2,),
            s2,
            _conv(groups=3, padding=1),
            randn(1, 3, 8, 5),
            [randn(3, 1, 3, 3, seed=4), randn(3, seed=5)],
            True,
            "depthwise",
        ),
        (
            3,
            (3,),
            [Shard(2)],
            _conv(stride=2, dilation=2, padding=3),
            randn(2, 2, 11),
            [randn(3, 2, 4, seed=6), randn(3, seed=7)],
            True,
            "conv1d even kernel",
        ),
        (
            4,
            (2, 2),
            [Shard(3), Shard(4)],
            _conv(padding=1, stride=(1, 2, 1)),
            randn(1, 2, 4, 5, 6),
            [randn(2, 2, 3, 3, 3, seed=8), randn(2, seed=9)],
            True,
            "conv3d",
        ),
        (
            4,
            (2, 2),
            [Shard(0), Shard(2)],
            _conv(padding=1),
            randn(3, 3, 6, 4),
            [w3, b4],
            True,
            "batch x spatial",
        ),
        (
            3,
            (3,),
            s2,
            _conv_t(stride=2, padding=1, output_padding=1),
            randn(1, 3, 5, 4),
            [randn(3, 2, 3, 3, seed=10), randn(2, seed=11)],
            True,
            "conv_transpose2d",
        ),
        (
            4,
            (2, 2),
            grid,
            _conv_t(stride=(2, 3), dilation=2, groups=1),
            x2d,
            [randn(2, 3, 2, 3, seed=12), randn(3, seed=13)],
            True,
            "conv_transpose2d 2x2",
        ),
        (
            2,
            (2,),
            [Shard(2)],
            _conv_t(stride=3, padding=2),
            randn(2, 2, 6),
            [randn(2, 1, 4, seed=14), randn(1, seed=15)],
            True,
            "conv_transpose1d",
        ),
    ]
    window: list[tuple[str, Op]] = [
        ("max_pool2d", lambda t: F.max_pool2d(t, 3, 2, 1, ceil_mode=True)),
        ("max_pool2d indices", lambda t: F.max_pool2d(t, 2, 1, dilation=2, return_indices=True)),
        ("avg_pool2d", lambda t: F.avg_pool2d(t, 3, 2, 1, ceil_mode=True)),
        ("avg_pool2d no pad count", lambda t: F.avg_pool2d(t, 3, 1, 1, count_include_pad=False)),
        ("avg_pool2d divisor", lambda t: F.avg_pool2d(t, 2, divisor_override=3)),
        ("nearest", lambda t: F.interpolate(t, scale_factor=2, mode="nearest")),
        ("nearest-exact", lambda t: F.interpolate(t, size=(13, 5), mode="nearest-exact")),
        ("bilinear", lambda t: F.interpolate(t, scale_factor=1.5, mode="bilinear")),
        (
            "bilinear corners",
            lambda t: F.interpolate(t, size=(4, 11), mode="bilinear", align_corners=True),
        ),
        ("bicubic", lambda t: F.interpolate(t, scale_factor=2, mode="bicubic")),
        ("bicubic down", lambda t: F.interpolate(t, size=(6, 4), mode="bicubic")),
        (
            "bicubic corners",
            lambda t: F.interpolate(t, scale_factor=1.5, mode="bicubic", align_corners=True),
        ),
        ("pad constant", lambda t: F.pad(t, (1, 2, 3, 0), value=0.5)),
        ("pad crop", lambda t: F.pad(t, (-1, 2, 2, -2))),
        ("pad reflect", lambda t: F.pad(t, (2, 1, 3, 2), mode="reflect")),
        ("pad replicate", lambda t: F.pad(t, (2, 1, 3, 2), mode="replicate")),
        ("pad circular", lambda t: F.pad(t, (2, 1, 3, 2), mode="circular")),
    ]
    for name, fn in window:
        cases.append((2, (2,), s2, fn, x2d, [], True, name))
        cases.append((3, (3,), s3, fn, x2d, [], True, name))
        cases.append((6, (3, 2), grid, fn, x2d, [], True, name))
    x1, x3 = randn(2, 2, 9), randn(1, 2, 5, 4, 6)
    for name, fn, x, pl in [
        ("max_pool1d", lambda t: F.max_pool1d(t, 3, 2, 1), x1, [Shard(2)]),
        ("avg_pool1d", lambda t: F.avg_pool1d(t, 2, 2), x1, [Shard(2)]),
        ("linear", lambda t: F.interpolate(t, size=14, mode="linear"), x1, [Shard(2)]),
        ("pad1d circular", lambda t: F.pad(t, (3, 2), mode="circular"), x1, [Shard(2)]),
        ("pad1d reflect", lambda t: F.pad(t, (3, 2), mode="reflect"), x1, [Shard(2)]),
        ("max_pool3d", lambda t: F.max_pool3d(t, 2, 2, ceil_mode=True), x3, [Shard(2), Shard(4)]),
        ("avg_pool3d", lambda t: F.avg_pool3d(t, 3, 1, 1), x3, [Shard(3), Shard(2)]),
        (
            "trilinear",
            lambda t: F.interpolate(t, scale_factor=2, mode="trilinear", align_corners=True),
            x3,
            [Shard(2), Shard(4)],
        ),
        ("nearest3d", lambda t: F.interpolate(t, size=(7, 3, 9)), x3, [Shard(4), Shard(3)]),
        (
            "pad3d replicate",
            lambda t: F.pad(t, (1, 2) * 3, mode="replicate"),
            x3,
            [Shard(2), Replicate()],
        ),
    ]:
        world, mesh_shape = (4, (2, 2)) if len(pl) == 2 else (3, (3,))
        cases.append((world, mesh_shape, pl, fn, x, [], True, name))
    return cases


def test_every_op_runs_sharded_and_exact_without_falling_back() -> None:
    """Conv 1-3-D (stride, dilation, 'same', groups, even kernels), transposed conv,
    max/avg pooling, every interpolate mode and every pad mode: values and gradients of
    input, weight and bias on every simulated rank, sharding kept, no FallbackWarning."""
    run_cases(op_cases())


def test_a_layer_chain_under_local_tensor_mode() -> None:
    """The op chain of a small net (reflect pad, conv, max pool, bilinear, circular pad,
    avg pool) in one autograd graph, 2 simulated ranks, no fallback."""
    from torch.distributed.tensor import Shard

    def layer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(F.pad(a, (1, 1, 1, 1), mode="reflect"), b)
        y = F.max_pool2d(torch.tanh(y), 2)
        y = F.interpolate(y, scale_factor=2, mode="bilinear")
        return F.avg_pool2d(F.pad(y, (1, 1, 1, 1), mode="circular"), 2)

    x, w = randn(1, 2, 10, 9), randn(3, 2, 3, 3, seed=1)
    run_cases([(2, (2,), [Shard(2)], layer, x, [w], True, "chain")])


def test_channel_sharded_convs_stay_sharded_under_the_mode() -> None:
    """The three channel layouts (output channels, input channels with partial sums,
    whole groups incl. depthwise) with uneven chunks: exact, weights never gathered."""
    from torch.distributed.tensor import Replicate, Shard

    x, w = randn(2, 4, 6, 5), randn(5, 4, 3, 3, seed=1)
    b = randn(5, seed=2)
    conv = _conv(padding=1)
    cases = []
    for world, mesh_shape, x_pl, w_pl, b_pl, name in [
        (3, (3,), [Replicate()], [Shard(0)], [Shard(0)], "out channels"),
        (3, (3,), [Shard(1)], [Shard(1)], [Replicate()], "in channels, partial sums"),
        (2, (2,), [Shard(1)], [Replicate()], [Replicate()], "in channels, sliced weight"),
        (4, (2, 2), [Shard(2), Shard(1)], [Replicate(), Shard(1)], [Replicate()] * 2, "in x H"),
        (
            4,
            (2, 2),
            [Replicate(), Shard(3)],
            [Shard(0), Replicate()],
            [Shard(0), Replicate()],
            "out x W",
        ),
    ]:
        # output channels come out Shard(1), input channels as partial sums
        cases.append((world, mesh_shape, x_pl, conv, x, [w, b], False, name, [w_pl, b_pl]))
    xg, wg, bg = randn(1, 6, 7, 4), randn(6, 2, 3, 3, seed=3), randn(6, seed=4)
    grouped = _conv(groups=3, padding=1)
    depthwise = _conv(groups=6, padding=(1, 0))
    wd, bd = randn(6, 1, 3, 2, seed=5), randn(6, seed=6)
    for world, mesh_shape, x_pl, w_pl, b_pl in [
        (3, (3,), [Shard(1)], [Shard(0)], [Shard(0)]),
        (6, (3, 2), [Shard(1), Shard(2)], [Shard(0), Replicate()], [Shard(0), Replicate()]),
    ]:
        cases.append((world, mesh_shape, x_pl, grouped, xg, [wg, bg], True, "groups", [w_pl, b_pl]))
    cases.append((3, (3,), [Shard(1)], depthwise, xg, [wd, bd], True, "depthwise", None))
    cases.append((6, (2, 3), [Shard(1), Shard(3)], depthwise, xg, [wd, bd], True, "dw 2x3", None))
    run_cases(cases)


def test_what_cannot_run_sharded_falls_back_exactly_with_one_warning_naming_the_op() -> None:
    """A Partial input and a transposed conv on channel-sharded input take the replicated
    path under the mode too: exact on every rank, one FallbackWarning per op naming it."""
    from dt_conv.fallback import reset_warnings
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    x, w, wt = randn(1, 4, 6, 5), randn(3, 4, 3, 3, seed=1), randn(4, 2, 3, 3, seed=2)
    reset_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with SimulatedWorld(2, (2,)) as sim:
            wd = distribute_tensor(w, sim.mesh, [Replicate()])
            halves = sim.mode.rank_map(lambda r: x / 2)  # two halves summing to x
            xp = DTensor.from_local(halves, sim.mesh, [Partial()], run_check=False)
            y1 = F.conv2d(xp, wd, padding=1).full_tensor()
            xc = distribute_tensor(x, sim.mesh, [Shard(1)])
            wtd = distribute_tensor(wt, sim.mesh, [Replicate()])
            y2 = F.conv_transpose2d(xc, wtd, padding=1).full_tensor()
    for a in rank_values(y1, 2):
        torch.testing.assert_close(a, F.conv2d(x, w, padding=1))
    for a in rank_values(y2, 2):
        torch.testing.assert_close(a, F.conv_transpose2d(x, wt, padding=1))
    fell_back = _fallbacks(caught)
    assert len(fell_back) == 2, fell_back
    assert all("convolution" in m for m in fell_back), fell_back
    assert any("Partial" in m for m in fell_back) and any("transposed" in m for m in fell_back)


def test_antialiased_interpolation_falls_back_exactly_with_one_warning() -> None:
    """torch's own rules would replicate `antialias=True` without a word: dt-conv takes
    it, runs it on replicated inputs (exact) and warns once per op, naming the reason."""
    from dt_conv.fallback import reset_warnings
    from torch.distributed.tensor import Shard

    x = randn(1, 2, 12, 7)
    modes = [("bilinear", (5, 4)), ("bicubic", (5, 4)), ("bicubic", (4, 3))]
    reset_warnings()
    failures = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with SimulatedWorld(3, (3,)) as sim:
            for mode, size in modes:

                def fn(t: torch.Tensor, mode: str = mode, size: tuple = size) -> torch.Tensor:
                    return F.interpolate(t, size=size, mode=mode, antialias=True)

                failures.append(sim.compare([Shard(2)], fn, x, name=f"{mode} antialias"))
    assert failures == [None] * len(modes), failures
    fell_back = _fallbacks(caught)
    assert len(fell_back) == 4, fell_back  # bilinear and bicubic, forward and backward
    assert all("antialias" in m for m in fell_back), fell_back


def test_wrong_arguments_raise_torchs_error_under_the_mode() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    x, w = randn(1, 2, 6, 6), randn(3, 4, 3, 3)
    with pytest.raises(RuntimeError) as plain:
        F.conv2d(x, w)
    with simulated_ranks(2):
        mesh = init_device_mesh("cpu", (2,))
        xd = distribute_tensor(x, mesh, [Shard(2)])
        with pytest.raises(RuntimeError) as sharded:
            F.conv2d(xd, distribute_tensor(w, mesh, [Replicate()]))
    assert str(sharded.value) == str(plain.value)


# ---- property sweep -------------------------------------------------------------------


# 1-D and 2-D meshes of 2-8 simulated ranks, odd sizes included; every release sweeps the
# first three (even, uneven, 2-D), CI the others on one release only
MESHES = [(2,), (3,), (2, 2), (4,), (5,), (6,), (2, 3), (7,), (8,), (4, 2)]


def _placements(data: Any, mesh_shape: tuple, op_dims: list[int]) -> list:
    """Each mesh dim replicates or shards the batch or one of the op's dims (never one
    tensor dim twice), at least one of the op's dims sharded."""
    from hypothesis import strategies as st
    from torch.distributed.tensor import Replicate, Shard

    placements: list[Any] = []
    free = [0, *op_dims]
    for _ in mesh_shape:
        choice = data.draw(st.sampled_from([None, *free]), label="placement")
        if choice is None:
            placements.append(Replicate())
        else:
            free.remove(choice)
            placements.append(Shard(choice))
    if not any(isinstance(p, Shard) and p.dim in op_dims for p in placements):
        i = next((i for i, p in enumerate(placements) if isinstance(p, Replicate)), 0)
        taken = {p.dim for p in placements if isinstance(p, Shard)}
        placements[i] = Shard(next(d for d in op_dims if d not in taken))
    return placements


def _chunks(n: int, parts: int) -> list[tuple[int, int]]:
    """torch.chunk's rows per rank, as `Shard` lays them out (trailing chunks empty)."""
    step = -(-n // parts)
    return [(min(i * step, n), min(i * step + step, n)) for i in range(parts)]


def _channel_layout(
    data: Any, placements: list, params: list, name: str, mesh_shape: tuple
) -> tuple[list, list]:
    """One mesh dim re-purposed for a channel layout (output channels: weight and bias
    `Shard(0)` under a replicated input; input channels: input `Shard(1)`, weight
    `Shard(1)` or replicated; groups: input `Shard(1)`, weight `Shard(0)` or replicated);
    the other mesh dims keep their placements. A layout the chunks would not fit falls
    back (the sweep counts that as a failure), so grouped convs whose filter chunks do
    not line up with their channel chunks stay unchanged."""
    from hypothesis import strategies as st
    from torch.distributed.tensor import Replicate, Shard

    rep = [Replicate()] * len(placements)
    m = data.draw(st.integers(0, len(placements) - 1), label="channel mesh dim")
    groups, cout = _groups_of(name), params[0].shape[0]
    if groups > 1:  # depthwise here: one input channel per group
        per_out = cout // groups
        cin_chunks, out_chunks = _chunks(groups, mesh_shape[m]), _chunks(cout, mesh_shape[m])
        if any(
            (c, d) != (a * per_out, b * per_out) for (a, b), (c, d) in zip(cin_chunks, out_chunks)
        ):
            return placements, [rep] * len(params)
    kind = data.draw(st.sampled_from(["group"] if groups > 1 else ["out", "in"]), label="layout")
    placements = list(placements)
    w_pl: list[Any] = list(rep)
    b_pl: list[Any] = list(rep)
    if kind == "out":
        placements[m] = Replicate()
        w_pl[m] = b_pl[m] = Shard(0)
    elif kind == "in":
        placements[m] = Shard(1)
        w_pl[m] = data.draw(st.sampled_from([Shard(1), Replicate()]))
    else:
        placements[m] = Shard(1)
        w_pl[m] = b_pl[m] = data.draw(st.sampled_from([Shard(0), Replicate()]))
    return placements, [w_pl, b_pl][: len(params)]


def _groups_of(name: str) -> int:
    return int(name.split("'groups': ")[1].split("}")[0].split(",")[0])


def _draw_case(data: Any) -> tuple:
    from hypothesis import strategies as st

    kind = data.draw(
        st.sampled_from(
            ["conv", "conv_channels", "conv_t", "max_pool", "avg_pool", "interpolate", "pad"]
        ),
        label="kind",
    )
    n = data.draw(st.integers(1, 3), label="spatial dims")
    top = {1: 13, 2: 9, 3: 6}[n]
    sizes = [data.draw(st.integers(1, top), label="size") for _ in range(n)]
    batch, cin = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
    x = randn(batch, cin, *sizes, seed=data.draw(st.integers(0, 99)))
    ints = lambda lo, hi: [data.draw(st.integers(lo, hi)) for _ in range(n)]  # noqa: E731
    params: list[torch.Tensor] = []
    if kind in ("conv", "conv_channels", "conv_t"):
        groups = data.draw(st.sampled_from([1, cin]))
        per_out = data.draw(st.integers(1, 2))
        kernel, dilation = ints(1, 4), ints(1, 2)
        if kind != "conv_t":
            stride = ints(1, 3)
            if all(s == 1 for s in stride) and data.draw(st.booleans(), label="same"):
                padding: Any = "same"
            else:
                padding = ints(0, 2)
            w = randn(per_out * groups, cin // groups, *kernel, seed=1)
            kw = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
            fn = _conv(**kw)
        else:
            stride = ints(1, 3)
            padding = [data.draw(st.integers(0, d * (k - 1))) for d, k in zip(dilation, kernel)]
            out_pad = [data.draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation)]
            w = randn(cin, per_out, *kernel, seed=1)
            kw = {
                "stride": stride,
                "padding": padding,
                "output_padding": out_pad,
                "dilation": dilation,
                "groups": groups,
            }
            fn = _conv_t(**kw)
        params = [w]
        if data.draw(st.booleans(), label="bias"):
            params.append(randn(w.shape[1] * groups if kind == "conv_t" else w.shape[0], seed=2))
            name = f"{kind} {kw} bias"
        else:
            fn = (lambda f: lambda x, w: f(x, w, None))(fn)
            name = f"{kind} {kw}"
    elif kind in ("max_pool", "avg_pool"):
        kernel, stride = ints(1, 3), ints(1, 3)
        padding = [data.draw(st.integers(0, k // 2)) for k in kernel]
        ceil = data.draw(st.booleans(), label="ceil_mode")
        if kind == "max_pool":
            dilation = ints(1, 2)
            pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[n]
            kw = {"stride": stride, "padding": padding, "dilation": dilation, "ceil_mode": ceil}
        else:
            pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[n]
            kw = {
                "stride": stride,
                "padding": padding,
                "ceil_mode": ceil,
                "count_include_pad": data.draw(st.booleans()),
            }
            if n > 1 and data.draw(st.booleans(), label="divisor"):
                kw["divisor_override"] = data.draw(st.integers(1, 3))
        fn = (lambda p, k, a: lambda t: p(t, k, **a))(pool, kernel, kw)
        name = f"{kind}{n}d k={kernel} {kw}"
    elif kind == "interpolate":
        modes = ["nearest", "nearest-exact", {1: "linear", 2: "bilinear", 3: "trilinear"}[n]]
        modes += ["bicubic"] if n == 2 else []
        mode = data.draw(st.sampled_from(modes), label="mode")
        kw = {"mode": mode}
        if "linear" in mode or mode == "bicubic":
            kw["align_corners"] = data.draw(st.booleans())
        if data.draw(st.booleans(), label="by size"):
            kw["size"] = ints(1, 2 * top)
        else:
            kw["scale_factor"] = data.draw(st.sampled_from([0.5, 1.5, 2.0, 3.0]))
        fn = (lambda a: lambda t: F.interpolate(t, **a))(kw)
        name = f"interpolate {kw}"
    else:
        mode = data.draw(st.sampled_from(["constant", "reflect", "replicate", "circular"]))
        pad = []
        for size in reversed(sizes):
            limit = {"constant": 3, "reflect": size - 1, "replicate": 3, "circular": size}[mode]
            low = -min(2, size // 2) if mode == "constant" else 0
            pad += [data.draw(st.integers(low, limit)) for _ in range(2)]
        fn = (lambda p, m: lambda t: F.pad(t, p, mode=m))(pad, mode)
        name = f"pad {mode} {pad}"
    return x, params, fn, name, n


@pytest.mark.parametrize("mesh_shape", mesh_params(MESHES))
def test_random_configurations_property(mesh_shape: tuple) -> None:
    """Hypothesis over op kinds, shapes (tiny, uneven and empty shards), kernel, stride,
    dilation, padding, groups, interpolation sizes and modes, pad modes and placements,
    on each mesh of 2-8 simulated ranks: exact and never falling back."""
    from dt_conv.fallback import reset_warnings
    from hypothesis import assume

    def case(sim: SimulatedWorld, data: Any) -> str | None:
        with sim.mode.disable():  # plain tensors: factories under the mode go per rank
            x, params, fn, name, n = _draw_case(data)
            try:
                fn(x, *params)
            except RuntimeError:  # torch rejects it unsharded: nothing to compare with
                assume(False)
        placements = _placements(data, mesh_shape, list(range(2, 2 + n)))
        layouts, keep = None, True
        if name.startswith("conv_channels"):
            placements, layouts = _channel_layout(data, placements, params, name, mesh_shape)
            keep = False  # output channels come out Shard(1), input channels partial
            name = f"{name} channels {placements} {layouts}"
        reset_warnings()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            failure = sim.compare(placements, fn, x, params, keep, name, layouts)
        if _fallbacks(caught):
            return f"fell back {_fallbacks(caught)}: {name}"
        return failure

    sweep_simulated(mesh_shape, 30, case)
