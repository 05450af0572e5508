"""dt-conv's op families swept at scale: 2 to 64 simulated ranks on 1-, 2- and 3-D meshes.

One process simulates every rank (torch's LocalTensorMode, `SimulatedWorld` of
test_local_tensor, built once per mesh and reused by all its examples). Hypothesis draws
convolutions, transposed convolutions, max and avg pooling, interpolation (nearest,
nearest-exact, linear / bilinear / bicubic / trilinear with align_corners both ways) and
padding (constant with crops, reflect, replicate, circular), 1-3 spatial dims, every
mesh dim sharding a spatial dim or the batch, or replicating. A sharded dim has 1 to
2 * ranks + 3 rows: fewer rows than ranks (empty shards), one or two rows a rank (thinner
than the halo of a 5-wide kernel or of a wide pad) and uneven chunks. Each mesh's first
example (hypothesis's simplest) is its `featured` op over such thin shards.

Every case is exact against plain torch on one process in float64, output and gradients
(input, weight, bias) on every simulated rank, the output keeps the input's placements,
and nothing falls back (a FallbackWarning fails the case); or it is refused with one of
dt-core's named errors (`DtPluginError`). Anything else raised (AssertionError,
IndexError, torch's own errors) fails. Failures are collected, not raised, so the report
names every wrong case in full, without hypothesis shrinking at 64 ranks.

Budgets come from `dt_core.testing.sweeps.sweep_settings` (in CI's scope a fixed seed,
one per mesh): few examples on the largest worlds, where one costs 1-4 s on a busy
2-core machine; `DT_SWEEP_SCALE=N` draws N times more. Worlds above 16 ranks are the
larger twins of the small ones and run `ci_once`.
"""

from __future__ import annotations

import math
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from test_local_tensor import SimulatedWorld, _conv, _conv_t, _fallbacks, randn

# (mesh shape, drawn examples in CI's budget, the op of its first example); the product
# of a shape is its world size
MESHES: list[tuple[tuple[int, ...], int, str]] = [
    ((2,), 8, "conv"),
    ((16,), 4, "pad:reflect"),
    ((64,), 2, "conv"),
    ((3, 5), 4, "interpolate:bicubic"),
    ((4, 4), 3, "max_pool"),
    ((8, 8), 2, "conv_transpose"),
    ((2, 3, 4), 2, "avg_pool"),
    ((4, 4, 4), 2, "conv"),
]
ONCE_ABOVE = 16  # larger worlds: twins of the small ones, run on CI's newest torch only


def _mesh_params() -> list[Any]:
    params = []
    for shape, budget, featured in MESHES:
        marks = [pytest.mark.ci_once] if math.prod(shape) > ONCE_ABOVE else []
        name = "x".join(map(str, shape))
        params.append(pytest.param(shape, budget, featured, marks=marks, id=name))
    return params


@dataclass
class Case:
    name: str
    fn: Callable[..., Any]
    x: torch.Tensor
    params: list[torch.Tensor]
    placements: list[Any]


@dataclass
class Outcomes:
    exact: int = 0
    refused: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def check(sim: SimulatedWorld, case: Case, outcomes: Outcomes) -> None:
    """Run `case` sharded on `sim` and file it as exact, refused or failed."""
    from dt_conv.fallback import reset_warnings
    from dt_core.errors import DtPluginError

    where = (
        f"{case.name} world={sim.world} mesh={sim.mesh_shape} {case.placements} "
        f"x{tuple(case.x.shape)}"
    )
    reset_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            failure = sim.compare(case.placements, case.fn, case.x, case.params, True, case.name)
        except DtPluginError as exc:  # a named refusal
            outcomes.refused.append(f"{type(exc).__name__}: {exc}: {where}")
            return
        except Exception as exc:  # AssertionError, IndexError, torch's errors: a bug
            failure = f"raised {type(exc).__name__}: {str(exc)[:300]}: {where}"
    if failure is None and _fallbacks(caught):
        failure = f"fell back {_fallbacks(caught)}: {where}"
    if failure is None:
        outcomes.exact += 1
    else:
        outcomes.failed.append(failure)


# ---- drawn cases ------------------------------------------------------------------------


def draw_layout(data: Any, mesh_shape: tuple[int, ...], n: int) -> tuple[list, dict[int, int]]:
    """Each mesh dim shards a spatial dim, the batch, or replicates (no tensor dim
    twice), at least one spatial dim sharded; and how many parts each dim has."""
    from hypothesis import strategies as st
    from torch.distributed.tensor import Replicate, Shard

    free: list[int] = [*range(2, 2 + n), 0]
    choices: list[int | None] = []
    for _ in mesh_shape:
        choice = data.draw(st.sampled_from([*free, None]), label="sharded dim")
        if choice is not None:
            free.remove(choice)
        choices.append(choice)
    if not any(c is not None and c >= 2 for c in choices):
        m = next((i for i, c in enumerate(choices) if c is None), 0)
        choices[m] = next(d for d in range(2, 2 + n) if d not in choices)
    placements = [Replicate() if c is None else Shard(c) for c in choices]
    parts = {c: mesh_shape[m] for m, c in enumerate(choices) if c is not None}
    return placements, parts


KINDS = ["conv", "conv_transpose", "max_pool", "avg_pool", "interpolate", "pad"]
PAD_MODES = ["constant", "reflect", "replicate", "circular"]


def draw_case(data: Any, mesh_shape: tuple[int, ...], featured: str) -> Case:
    """One op, its arguments, input and placements. Each draw lists first the value
    hypothesis tries first (its simplest example), so every mesh's first example is the
    `featured` op (a kind, or "kind:mode") over p + 1 rows on each mesh dim of p ranks
    (chunks of two rows, a one-row one, then empty ones), with a 5-wide kernel, padding
    2, bias, align_corners=True, pads of 3: thinner shards than the halo."""
    from hypothesis import strategies as st

    def pick(first: Any, *others: Any, label: str = "") -> Any:
        return data.draw(st.sampled_from([first, *(o for o in others if o != first)]), label)

    def picks(first: int, lo: int, hi: int, label: str = "") -> list[int]:
        return [pick(first, *range(lo, hi + 1), label=label) for _ in range(n)]

    want_kind, _, want_mode = featured.partition(":")
    kind = pick(want_kind, *KINDS, label="kind")
    n = pick(max(len(mesh_shape), 2), 1, 2, 3, label="spatial dims")
    placements, parts = draw_layout(data, mesh_shape, n)
    # a sharded dim: fewer rows than ranks, one or two rows a rank, uneven chunks
    sizes = [
        pick(parts[d] + 1, *range(1, 2 * parts[d] + 4)) if d in parts else pick(4, *range(1, 7))
        for d in range(2, 2 + n)
    ]
    batch, cin = pick(1, 2, 3, label="batch"), pick(2, 1, label="channels")
    seed = data.draw(st.integers(0, 99), label="seed")
    x = randn(batch, cin, *sizes, seed=seed)
    params: list[torch.Tensor] = []
    if kind in ("conv", "conv_transpose"):
        groups = pick(1, cin, label="groups")
        per_out = pick(2, 1, label="out channels per group")
        kernel, dilation = picks(5, 1, 5, "kernel"), picks(1, 1, 2, "dilation")
        if kind == "conv":
            stride = picks(1, 1, 3, "stride")
            padding: Any = picks(2, 0, 2, "padding")
            if all(s == 1 for s in stride) and pick(False, True, label="same"):
                padding = "same"
            w = randn(per_out * groups, cin // groups, *kernel, seed=1)
            kw: dict[str, Any] = {"stride": stride, "padding": padding, "dilation": dilation}
            fn = _conv(groups=groups, **kw)
            cout = w.shape[0]
        else:
            stride = picks(2, 1, 3, "stride")
            padding = [
                pick(min(1, d * (k - 1)), *range(d * (k - 1) + 1)) for d, k in zip(dilation, kernel)
            ]
            out_pad = [pick(max(s, d) - 1, *range(max(s, d))) for s, d in zip(stride, dilation)]
            w = randn(cin, per_out, *kernel, seed=1)
            kw = {"stride": stride, "padding": padding, "dilation": dilation}
            kw["output_padding"] = out_pad
            fn = _conv_t(groups=groups, **kw)
            cout = per_out * groups
        kw = {"kernel": kernel, **kw, "groups": groups}
        params = [w]
        if pick(True, False, label="bias"):
            params.append(randn(cout, seed=2))
            name = f"{kind}{n}d {kw} bias"
        else:
            fn = (lambda f: lambda t, v: f(t, v, None))(fn)
            name = f"{kind}{n}d {kw} no bias"
    elif kind in ("max_pool", "avg_pool"):
        # torch's pools want at least the kernel's rows (padding aside)
        kernel = [pick(min(5, s), *range(1, 6), label="kernel") for s in sizes]
        stride = picks(2, 1, 3, "stride")
        kw = {"stride": stride, "padding": [pick(k // 2, *range(k // 2 + 1)) for k in kernel]}
        kw["ceil_mode"] = pick(True, False, label="ceil_mode")
        if kind == "max_pool":
            kw["dilation"] = picks(1, 1, 2, "dilation")
            kw["return_indices"] = pick(True, False, label="indices")
            pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[n]
        else:
            kw["count_include_pad"] = pick(False, True, label="count_include_pad")
            if n > 1 and pick(False, True, label="divisor"):
                kw["divisor_override"] = pick(3, 1, 2)
            pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[n]
        fn = (lambda p, k, a: lambda t: p(t, k, **a))(pool, kernel, kw)
        name = f"{kind}{n}d kernel={kernel} {kw}"
    elif kind == "interpolate":
        modes = ["nearest", "nearest-exact", {1: "linear", 2: "bilinear", 3: "trilinear"}[n]]
        modes += ["bicubic"] if n == 2 else []
        kw = {"mode": pick(want_mode if want_mode in modes else modes[-1], *modes, label="mode")}
        if kw["mode"] not in ("nearest", "nearest-exact"):
            kw["align_corners"] = pick(True, False, label="align_corners")
        if pick(False, True, label="by size"):
            kw["size"] = [pick(2 * s - 1, *range(1, 2 * s + 3)) for s in sizes]
        else:
            kw["scale_factor"] = pick(1.5, 0.5, 0.75, 2.0, 3.0, label="scale")
        fn = (lambda a: lambda t: F.interpolate(t, **a))(kw)
        name = f"interpolate{n}d {kw}"
    else:
        mode = pick(want_mode if want_mode in PAD_MODES else "reflect", *PAD_MODES, label="mode")
        pad = []
        for size in reversed(sizes):  # F.pad lists the last dim first
            low = -min(2, size // 2) if mode == "constant" else 0
            high = {"constant": 5, "reflect": size - 1, "replicate": 5, "circular": size}[mode]
            pad += [pick(min(3, high), *range(low, high + 1), label="pad") for _ in range(2)]
        value = pick(0.5, 0.0) if mode == "constant" else None
        fn = (lambda p, m, v: lambda t: F.pad(t, p, mode=m, value=v))(pad, mode, value)
        name = f"pad{n}d {mode} {pad}" + (f" value={value}" if value else "")
    return Case(f"{name} seed={seed}", fn, x, params, placements)


@pytest.mark.parametrize("mesh_shape,budget,featured", _mesh_params())
def test_op_families_exact_at_scale(
    mesh_shape: tuple[int, ...], budget: int, featured: str
) -> None:
    """On one mesh of 2-64 simulated ranks, `budget` drawn cases (times DT_SWEEP_SCALE),
    the first the `featured` op over thin shards; each exact or refused by name, none
    falling back."""
    from dt_core.testing.sweeps import sweep_settings
    from hypothesis import HealthCheck, assume, given, seed
    from hypothesis import strategies as st

    settings = sweep_settings(budget, suppress_health_check=list(HealthCheck))
    # CI's fixed seed, one per mesh: the meshes draw different cases
    fixed = seed(zlib.crc32(repr(mesh_shape).encode())) if settings.derandomize else None
    outcomes = Outcomes()
    with SimulatedWorld(math.prod(mesh_shape), mesh_shape) as sim:

        @settings
        @given(st.data())
        def sweep(data: Any) -> None:
            with sim.mode.disable():  # plain tensors: factories under the mode go per rank
                case = draw_case(data, mesh_shape, featured)
                try:
                    out = case.fn(case.x, *case.params)
                except (RuntimeError, ValueError):  # torch rejects it unsharded
                    assume(False)
                # a max pool window all padding: torch returns -inf and an index outside
                # the input, whose gradient lands in the next channel; nothing to match
                assume(bool(torch.isfinite(out[0] if isinstance(out, tuple) else out).all()))
            check(sim, case, outcomes)

        (fixed(sweep) if fixed else sweep)()
    summary = f"{outcomes.exact} exact, {len(outcomes.refused)} refused"
    print(f"mesh {mesh_shape}: {summary}", *outcomes.refused, sep="\n  ")
    assert not outcomes.failed, f"{len(outcomes.failed)} cases wrong ({summary}):\n" + "\n".join(
        outcomes.failed[:20]
    )
    assert outcomes.exact >= 1, summary


# ---- found next to the sweep (whose layouts always shard a spatial dim) ----------------


@pytest.mark.parametrize("placement", ["Shard(0)", "Shard(1)", "Replicate()"])
def test_max_pool3d_backward_without_a_sharded_spatial_dim(placement: str) -> None:
    """max_pool3d on batch- or channel-sharded (or replicated) inputs, values and input
    gradient. Torch up to 2.14 has no sharding strategy for its backward (only for the 2-D
    one) and raised NotImplementedError: dt-conv hands such calls to torch only where
    torch has a strategy, and runs them itself otherwise."""
    from torch.distributed.tensor import Replicate, Shard

    layout = {"Shard(0)": Shard(0), "Shard(1)": Shard(1), "Replicate()": Replicate()}
    outcomes = Outcomes()
    with SimulatedWorld(2, (2,)) as sim:
        with sim.mode.disable():
            x = randn(2, 2, 2, 2, 2, seed=1)
        pool = Case("max_pool3d kernel=2", lambda t: F.max_pool3d(t, 2), x, [], [layout[placement]])
        check(sim, pool, outcomes)
    assert not outcomes.failed, outcomes.failed
