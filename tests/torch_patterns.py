"""torch 2.13's DTensor test patterns as cases for the plugins, and the code that checks them.

torch's own DTensor tests (math, pointwise, view, convolution, tensor-parallel examples,
attention) each run an op on DTensors and compare with the same op on plain tensors. Here
a case is a function of full tensors plus the layout of each operand; `reference` runs it
on one process (plain tensors), `sharded` runs it on DTensors over a mesh (ranks simulated
by LocalTensorMode or spawned, the same code), and `differences` lists every output and
gradient that differs. Inputs are float64, so only the summation order may differ.

The layouts and shapes follow torch's tests (e.g. a stride-4 downsampling conv on
`Shard(3)`, upsampling a 1x1x2x2 image sharded on the batch dim, a colwise/rowwise MLP),
written for the ops the plugins own: conv, pooling, interpolation, padding (dt-conv),
SDPA on sequence-sharded inputs (dt-cp), and torch's own ops on their outputs.
"""

from __future__ import annotations

import contextlib
import copy
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor

ATOL = 1e-10  # float64; the sharded sum of a conv/attention differs only in order

REPLICATED: tuple[Placement, ...] = ()  # an operand replicated on every mesh dim


@dataclass(frozen=True)
class Operand:
    """A case's argument: its full value, its layout (None: a plain tensor), whether the
    case differentiates it."""

    value: torch.Tensor
    placements: tuple[Placement, ...] | None = REPLICATED
    grad: bool = True


@dataclass(frozen=True)
class Case:
    name: str
    fn: Callable[..., Any]  # operands -> a tensor or a tuple of tensors
    operands: tuple[Operand, ...]
    keeps_layout: bool = False  # the (first) output must come back in operand 0's layout
    atol: float = ATOL
    plain_fn: Callable[..., Any] | None = None  # the one-process computation, if not `fn`


@dataclass
class Result:
    """What one run produced: outputs, operand gradients (None where none), and for the
    sharded run the first output's placements and the plugins' fallback warnings."""

    outputs: list[Any]
    grads: list[Any]
    placements: tuple[Placement, ...] | None = None
    fallbacks: list[str] = field(default_factory=list)


def randn(*shape: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def _as_tuple(out: Any) -> tuple[Any, ...]:
    return tuple(out) if isinstance(out, tuple | list) else (out,)


def _differentiable(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad


@contextlib.contextmanager
def recorded_fallbacks() -> Iterator[list[str]]:
    """Collect the plugins' FallbackWarnings raised inside (each re-armed first)."""
    from dt_core.kit import FallbackWarning, forget_fallback_warnings

    found: list[str] = []
    forget_fallback_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FallbackWarning)
        yield found
    found.extend(str(w.message) for w in caught if issubclass(w.category, FallbackWarning))
    for w in caught:  # anything else is shown as usual
        if not issubclass(w.category, FallbackWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def reference(case: Case, seed: int = 1234) -> tuple[Result, list[torch.Tensor | None]]:
    """The case on one process; also the output gradients both runs back-propagate."""
    leaves = [
        op.value.detach().clone().requires_grad_(op.grad and op.placements is not None)
        for op in case.operands
    ]
    outs = _as_tuple((case.plain_fn or case.fn)(*leaves))
    grad_outs = [
        randn(*o.shape, seed=seed + i).to(o.dtype) if _differentiable(o) else None
        for i, o in enumerate(outs)
    ]
    loss = sum((o * g).sum() for o, g in zip(outs, grad_outs, strict=True) if g is not None)
    if isinstance(loss, torch.Tensor):
        loss.backward()
    result = Result([o.detach() for o in outs], [leaf.grad for leaf in leaves])
    return result, grad_outs


def distribute(op: Operand, mesh: Any) -> Any:
    if op.placements is None:
        return op.value
    placements = op.placements or (Replicate(),) * mesh.ndim
    d = distribute_tensor(op.value, mesh, list(placements))
    return d.requires_grad_() if op.grad else d


def sharded(case: Case, mesh: Any, grad_outs: Sequence[torch.Tensor | None]) -> Result:
    """The case on DTensors over `mesh`: outputs and gradients as full tensors."""
    args = [distribute(op, mesh) for op in case.operands]
    with recorded_fallbacks() as fallbacks:
        outs = _as_tuple(case.fn(*args))
        fulls = [o.full_tensor() if isinstance(o, DTensor) else o for o in outs]
        loss = sum((f * g).sum() for f, g in zip(fulls, grad_outs, strict=True) if g is not None)
        if isinstance(loss, torch.Tensor):
            loss.backward()
    grads = [
        a.grad.full_tensor() if isinstance(a, DTensor) and a.grad is not None else None
        for a in args
    ]
    first = outs[0]
    placements = tuple(first.placements) if isinstance(first, DTensor) else None
    return Result([f.detach() for f in fulls], grads, placements, fallbacks)


def per_rank(t: torch.Tensor, world: int) -> list[torch.Tensor]:
    """What every rank holds: a simulated rank's share of a LocalTensor, else `t` itself."""
    from dt_core.testing import rank_values

    return rank_values(t, world)


def _mismatch(label: str, got: Any, want: Any, world: int, atol: float) -> str | None:
    if want is None or got is None:
        return None if want is None and got is None else f"{label}: {got!r:.40} vs {want!r:.40}"
    for rank, g in enumerate(per_rank(got, world)):
        if g.shape != want.shape or g.dtype != want.dtype:
            return f"{label} rank {rank}: {tuple(g.shape)} {g.dtype} vs {tuple(want.shape)}"
        if not want.is_floating_point():
            if not torch.equal(g, want):
                return f"{label} rank {rank}: values differ"
            continue
        err = (g - want).abs().max().item() if g.numel() else 0.0
        if not err <= atol:  # also catches NaN
            return f"{label} rank {rank}: max error {err:.3g}"
    return None


def differences(case: Case, want: Result, got: Result, world: int) -> list[str]:
    """Every output / gradient of `got` (sharded) that is not `want` (one process)."""
    found = []
    pairs = [(f"out{i}", g, w) for i, (g, w) in enumerate(zip(got.outputs, want.outputs))]
    pairs += [(f"grad{i}", g, w) for i, (g, w) in enumerate(zip(got.grads, want.grads))]
    if len(got.outputs) != len(want.outputs):
        found.append(f"{len(got.outputs)} outputs, want {len(want.outputs)}")
    for label, g, w in pairs:
        if problem := _mismatch(label, g, w, world, case.atol):
            found.append(problem)
    layout = case.operands[0].placements
    if case.keeps_layout and layout and got.placements != tuple(layout):
        found.append(f"output placements {got.placements}, want {tuple(layout)}")
    return [f"{case.name}: {p}" for p in found]


def check_here(case: Case, mesh: Any, world: int) -> tuple[list[str], list[str]]:
    """Reference and sharded run in this process (spawned ranks): (problems, fallbacks)."""
    want, grad_outs = reference(case)
    got = sharded(case, mesh, grad_outs)
    return differences(case, want, got, world), got.fallbacks


def check_all_here(
    cases: Sequence[Case], mesh: Any, world: int, torch_alone: bool = False
) -> list[str]:
    """Every case; one that raises is reported and the others still run (every rank
    raises alike, so no rank is left in a collective). With `torch_alone` (the plugins
    deactivated) torch's refusal of an op its own tables lack is its answer, not a
    problem (interpolation backward on torch 2.11 / 2.12)."""
    problems: list[str] = []
    for case in cases:
        found, error = outcome(lambda c=case: check_here(c, mesh, world)[0])
        if error is not None:
            refused = torch_alone and torch_lacks_a_strategy(error)
            found = [] if refused else [f"{case.name}: raised {type(error).__name__}: {error}"]
        problems += found
    return problems


_NO_STRATEGY = re.compile(r"Operator (\w+)\.(\w+)\.(\w+) does not have a sharding strategy")


def torch_lacks_a_strategy(error: BaseException) -> bool:
    """Whether `error` is DTensor refusing an op that torch's sharding tables lack right
    now (asked with the plugins deactivated: the gaps dt-core's torch-gaps plugin fills)."""
    from dt_core.compat.sharding_rules import has_sharding_entry

    found = _NO_STRATEGY.search(str(error)) if isinstance(error, NotImplementedError) else None
    if found is None:
        return False
    namespace, name, overload = found.groups()
    op = getattr(getattr(getattr(torch.ops, namespace), name), overload)
    return not has_sharding_entry(op)


@contextlib.contextmanager
def plugins_off() -> Iterator[None]:
    """torch alone: every plugin's contribution taken out, put back afterwards."""
    import dt_core

    dt_core.deactivate()
    try:
        yield
    finally:
        dt_core.activate()


def outcome(fn: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    try:
        return fn(), None
    except Exception as exc:
        return None, exc


def same_error(
    want: BaseException | None, got: BaseException | None, prefix: int | None = None
) -> str | None:
    """None when `got` is torch's error `want`: its type, and its first line within got's
    message (only its first `prefix` characters if given)."""
    if want is None:
        return "the one-process call did not raise"
    if got is None:
        return f"did not raise; one process raised {type(want).__name__}: {want}"
    if not isinstance(got, type(want)) or _first_line(want)[:prefix] not in str(got):
        return (
            f"raised {type(got).__name__}: {_first_line(got)}; want {type(want).__name__}: {want}"
        )
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


# --- the cases ----------------------------------------------------------------------------


def _conv2d(stride: int = 1, padding: Any = 0, groups: int = 1) -> Callable[..., Any]:
    def conv(x: Any, w: Any, b: Any) -> Any:
        return F.conv2d(x, w, b, stride=stride, padding=padding, groups=groups)

    return conv


def _conv_nd(dims: int, padding: int) -> Callable[..., Any]:
    op = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[dims]

    def conv(x: Any, w: Any, b: Any) -> Any:
        return op(x, w, b, padding=padding)

    return conv


def conv_cases(layouts: Sequence[tuple[Placement, ...]], seed: int = 0) -> list[Case]:
    """torch's test_convolution_ops patterns (downsampling, depthwise, 1-D/3-D, a conv
    whose input needs no gradient) on every given layout of the input."""
    cases: list[Case] = []
    for lay in layouts:
        tag = "/".join(map(str, lay))
        cases += [
            Case(  # the downsampling pattern: kernel 4, stride 4, no padding
                f"downsample conv2d {tag}",
                _conv2d(stride=4),
                (
                    Operand(randn(2, 3, 16, 24, seed=seed), lay),
                    Operand(randn(8, 3, 4, 4, seed=seed + 1)),
                    Operand(randn(8, seed=seed + 2)),
                ),
                keeps_layout=True,
            ),
            Case(  # the depthwise pattern: kernel 7, padding 3, one group per channel
                f"depthwise conv2d {tag}",
                _conv2d(padding=3, groups=4),
                (
                    Operand(randn(2, 4, 11, 13, seed=seed + 3), lay),
                    Operand(randn(4, 1, 7, 7, seed=seed + 4)),
                    Operand(randn(4, seed=seed + 5)),
                ),
                keeps_layout=True,
            ),
            Case(  # conv backward when the input needs no gradient
                f"conv2d input without grad {tag}",
                _conv2d(padding=1),
                (
                    Operand(randn(1, 4, 9, 10, seed=seed + 6), lay, grad=False),
                    Operand(randn(4, 4, 3, 3, seed=seed + 7)),
                    Operand(randn(4, seed=seed + 8)),
                ),
                keeps_layout=True,
            ),
        ]
    return cases


def conv_1d_3d_cases(mesh_ndim: int, seed: int = 10) -> list[Case]:
    """conv1d / conv3d (torch: replicated input, padding 1), replicated and sharded."""
    rep = (Replicate(),) * mesh_ndim
    spatial1 = (Shard(2),) if mesh_ndim == 1 else (Shard(0), Shard(2))
    spatial3 = (Shard(4),) if mesh_ndim == 1 else (Shard(2), Shard(4))
    x1, w1, b1 = randn(2, 6, 9, seed=seed), randn(6, 6, 3, seed=seed + 1), randn(6, seed=seed + 2)
    x3, w3 = randn(2, 3, 5, 6, 6, seed=seed + 3), randn(4, 3, 3, 3, 3, seed=seed + 4)
    b3 = randn(4, seed=seed + 5)
    cases = []
    for lay in (rep, spatial1):
        ops = (Operand(x1, lay), Operand(w1), Operand(b1))
        cases.append(Case(f"conv1d {lay}", _conv_nd(1, 1), ops, keeps_layout=True))
    for lay in (rep, spatial3):
        ops = (Operand(x3, lay), Operand(w3), Operand(b3))
        cases.append(Case(f"conv3d {lay}", _conv_nd(3, 1), ops, keeps_layout=True))
    return cases


def channel_conv_cases(mesh_ndim: int, seed: int = 20) -> list[Case]:
    """Weights sharded on output channels (the output comes back channel-sharded) and a
    transposed conv on a spatially sharded input."""
    if mesh_ndim != 1:
        return []

    def transposed(x: Any, w: Any, b: Any) -> Any:
        return F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1)

    return [
        Case(
            "conv2d weight Shard(0)",
            _conv2d(padding=1),
            (
                Operand(randn(2, 3, 8, 8, seed=seed)),
                Operand(randn(8, 3, 3, 3, seed=seed + 1), (Shard(0),)),
                Operand(randn(8, seed=seed + 2), (Shard(0),)),
            ),
        ),
        Case(
            "conv_transpose2d Shard(2)",
            transposed,
            (
                Operand(randn(1, 4, 7, 6, seed=seed + 3), (Shard(2),)),
                Operand(randn(4, 3, 3, 3, seed=seed + 4)),
                Operand(randn(3, seed=seed + 5)),
            ),
            keeps_layout=True,
        ),
    ]


def upsampling_pattern_cases(mesh_ndim: int) -> list[Case]:
    """torch's test_upsampling: a 1x1x2x2 image sharded on the batch dim (so all but one
    rank hold nothing), upsampled bilinear (align_corners), nearest and bicubic."""
    image = torch.arange(1, 5, dtype=torch.float64).view(1, 1, 2, 2)
    lay = (Shard(0),) * mesh_ndim if mesh_ndim == 1 else (Shard(0), Replicate())
    modules = {
        "UpsamplingBilinear2d": nn.UpsamplingBilinear2d(scale_factor=2),
        "UpsamplingNearest2d": nn.UpsamplingNearest2d(scale_factor=2),
        "Upsample bicubic": nn.Upsample(scale_factor=2, mode="bicubic"),
    }
    return [Case(f"{name} Shard(0)", m, (Operand(image, lay),)) for name, m in modules.items()]


def _interp(**kw: Any) -> Callable[[Any], Any]:
    def run(x: Any) -> Any:
        return F.interpolate(x, **kw)

    return run


def interpolate_cases(layouts: Sequence[tuple[Placement, ...]], seed: int = 30) -> list[Case]:
    """F.interpolate's modes on spatially sharded images (odd sizes: uneven shards)."""
    x = randn(1, 2, 7, 9, seed=seed)
    modes = {
        "bilinear x2": {"scale_factor": 2, "mode": "bilinear"},
        "bilinear align_corners size": {"size": (10, 5), "mode": "bilinear", "align_corners": True},
        "nearest x2": {"scale_factor": 2, "mode": "nearest"},
        "nearest-exact size": {"size": (11, 4), "mode": "nearest-exact"},
        "bicubic x2": {"scale_factor": 2, "mode": "bicubic"},
    }
    cases = [  # bicubic is torch's own op (dt-conv leaves it to torch)
        Case(f"interpolate {name} {lay}", _interp(**kw), (Operand(x, lay),), "cubic" not in name)
        for lay in layouts
        for name, kw in modes.items()
    ]
    return cases + _first_dim_sharded(
        layouts,
        seed,
        ("interpolate linear 1-D", _interp(scale_factor=3, mode="linear"), (2, 3, 5)),
        ("interpolate trilinear 3-D", _interp(scale_factor=2, mode="trilinear"), (1, 2, 3, 5, 4)),
    )


def _first_dim_sharded(
    layouts: Sequence[tuple[Placement, ...]],
    seed: int,
    *ops: tuple[str, Callable[[Any], Any], tuple[int, ...]],
) -> list[Case]:
    """1-D and 3-D variants: `(name, fn, input shape)` each, the input's first spatial dim
    sharded over the first mesh dim (seeds seed+1, seed+2, ...), layout kept."""
    one_d = (Shard(2),) + (Replicate(),) * (len(layouts[0]) - 1)
    return [
        Case(name, fn, (Operand(randn(*shape, seed=seed + i), one_d),), keeps_layout=True)
        for i, (name, fn, shape) in enumerate(ops, 1)
    ]


def pool_cases(layouts: Sequence[tuple[Placement, ...]], seed: int = 40) -> list[Case]:
    """Pooling on spatially sharded inputs; adaptive pooling is torch's own op."""
    x = randn(2, 3, 9, 10, seed=seed)
    ops: dict[str, Callable[[Any], Any]] = {
        "max_pool2d k2": lambda t: F.max_pool2d(t, 2),
        "max_pool2d k3 s1 p1": lambda t: F.max_pool2d(t, 3, 1, 1),
        "max_pool2d indices": lambda t: F.max_pool2d(t, 3, 2, 1, return_indices=True),
        "avg_pool2d k3 s2 p1 ceil": lambda t: F.avg_pool2d(
            t, 3, 2, 1, ceil_mode=True, count_include_pad=False
        ),
        "adaptive_avg_pool2d": lambda t: F.adaptive_avg_pool2d(t, (3, 5)),
    }
    cases = [
        Case(f"{name} {lay}", fn, (Operand(x, lay),), keeps_layout="adaptive" not in name)
        for lay in layouts
        for name, fn in ops.items()
    ]
    return cases + _first_dim_sharded(
        layouts,
        seed,
        ("max_pool1d k3 s2", lambda t: F.max_pool1d(t, 3, 2), (2, 3, 11)),
        ("avg_pool3d k2", lambda t: F.avg_pool3d(t, 2), (1, 2, 6, 4, 4)),
    )


def pad_cases(layouts: Sequence[tuple[Placement, ...]], seed: int = 50) -> list[Case]:
    x = randn(1, 2, 7, 6, seed=seed)
    pads: dict[str, Callable[[Any], Any]] = {
        "constant": lambda t: F.pad(t, (1, 2, 2, 1), value=1.5),
        "reflect": lambda t: F.pad(t, (2, 1, 2, 2), mode="reflect"),
        "replicate": lambda t: F.pad(t, (1, 1, 3, 1), mode="replicate"),
        "circular": lambda t: F.pad(t, (1, 2, 2, 1), mode="circular"),
    }
    return [
        Case(f"pad {name} {lay}", fn, (Operand(x, lay),), keeps_layout=True)
        for lay in layouts
        for name, fn in pads.items()
    ]


def _conv_then(after: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def run(x: Any, w: Any, b: Any) -> Any:
        return after(F.conv2d(x, w, b, padding=1), x)

    return run


def torch_flattens_a_sharded_inner_dim() -> bool:
    """Whether torch's own view op flattens dims of which one but the first is sharded
    (it redistributes from 2.12 on; torch 2.11 refuses: "Attempted to flatten multiple
    dimensions ... disallowed by the current operator"). Asked of torch alone."""
    import dt_core
    from dt_core.testing import simulated_ranks
    from torch.distributed.device_mesh import init_device_mesh

    with plugins_off() if dt_core.is_active() else contextlib.nullcontext(), simulated_ranks(2):
        mesh = init_device_mesh("cpu", (2,))
        sharded = distribute_tensor(torch.zeros(2, 4, 4), mesh, [Shard(2)])
        try:
            sharded.flatten(1)
        except RuntimeError as error:
            if "without redistribution" not in str(error):
                raise
            return False
    return True


def conv_then_torch_ops_cases(lay: tuple[Placement, ...], seed: int = 60) -> list[Case]:
    """torch's own pointwise / view / reduction ops on a sharded conv's output: the
    plugins hand them a DTensor in the input's layout, torch does the rest (a flatten
    of a W-sharded output only where torch flattens such a layout)."""
    chains: dict[str, Callable[[Any, Any], Any]] = {
        "relu + residual": lambda y, x: F.relu(y) + x,
        "gelu * 2 + sigmoid": lambda y, x: F.gelu(y) * 2 + y.sigmoid(),
        "permute + layer_norm(C)": lambda y, x: F.layer_norm(y.permute(0, 2, 3, 1), (4,)),
        "transpose(2, 3) * x": lambda y, x: y.transpose(2, 3) * x.transpose(2, 3),
        "flatten(2) + softmax(-1)": lambda y, x: y.flatten(2).softmax(-1),
        "sum over H, W": lambda y, x: y.sum(dim=(2, 3)),
        "mean": lambda y, x: y.mean(),
        "tanh + amax(1)": lambda y, x: y.tanh().amax(dim=1),
    }
    if any(isinstance(p, Shard) and p.dim == 3 for p in lay) and not (
        torch_flattens_a_sharded_inner_dim()
    ):
        del chains["flatten(2) + softmax(-1)"]
    operands = (
        Operand(randn(2, 4, 8, 6, seed=seed), lay),
        Operand(randn(4, 4, 3, 3, seed=seed + 1)),
        Operand(randn(4, seed=seed + 2)),
    )
    return [Case(f"conv -> {name} {lay}", _conv_then(fn), operands) for name, fn in chains.items()]


def _attention(**kw: Any) -> Callable[..., Any]:
    def attend(q: Any, k: Any, v: Any) -> Any:
        return F.scaled_dot_product_attention(q, k, v, **kw)

    return attend


def sdpa_cases(mesh_ndim: int, seed: int = 70) -> list[Case]:
    """SDPA on sequence-sharded q, k, v (dt-cp), as torch's context-parallel tests shard
    them: causal and not, even and uneven lengths, GQA; heads sharded too."""
    seq = (Shard(2),) if mesh_ndim == 1 else (Shard(0), Shard(2))
    heads = (Shard(1),) if mesh_ndim == 1 else (Replicate(), Shard(1))
    cases = []
    for length in (16, 13):
        q, k, v = (randn(2, 4, length, 8, seed=seed + i) for i in range(3))
        for causal in (True, False):
            ops = (Operand(q, seq), Operand(k, seq), Operand(v, seq))
            name = f"sdpa S={length} causal={causal} {seq}"
            cases.append(Case(name, _attention(is_causal=causal), ops, keeps_layout=True))
    q, k, v = (
        randn(2, 4, 12, 8, seed=seed + 5),
        randn(2, 2, 12, 8, seed=seed + 6),
        randn(2, 2, 12, 8, seed=seed + 7),
    )
    gqa = (Operand(q, seq), Operand(k, seq), Operand(v, seq))
    cases.append(Case(f"sdpa GQA causal {seq}", _attention(is_causal=True, enable_gqa=True), gqa))
    q, k, v = (randn(2, 4, 10, 8, seed=seed + 8 + i) for i in range(3))
    by_head = (Operand(q, heads), Operand(k, heads), Operand(v, heads))
    cases.append(Case(f"sdpa heads {heads}", _attention(is_causal=True), by_head))
    return cases


def _relative_bias(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
    return score + (q_idx - kv_idx) * 0.125  # exact in any float dtype


def _causal(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
    return q_idx >= kv_idx


def _flex(block_mask: Any) -> Callable[..., Any]:
    def attend(q: Any, k: Any, v: Any) -> Any:
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention(q, k, v, score_mod=_relative_bias, block_mask=block_mask)

    return attend


def _dense_relative_bias(causal: bool) -> Callable[..., Any]:
    """flex_attention with `_relative_bias` written out densely (torch refuses flex's
    backward on CPU tensors, so one process computes it this way)."""

    def attend(q: Any, k: Any, v: Any) -> Any:
        positions = torch.arange(q.shape[2], dtype=q.dtype)
        offsets = positions[:, None] - positions[None, :]
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5 + offsets * 0.125
        if causal:
            scores = scores.masked_fill(offsets < 0, float("-inf"))
        return scores.softmax(-1) @ v

    return attend


def flex_cases(seed: int = 80, with_default_mask: bool = False) -> list[Case]:
    """torch's own flex_attention front end on sequence-sharded inputs (dt-cp's HOP
    rule), with a causal BlockMask built for the global sequence (built here, outside
    any LocalTensorMode); `with_default_mask` adds the call without a block_mask."""
    from torch.nn.attention.flex_attention import create_block_mask

    length = 12
    q, k, v = (randn(1, 2, length, 8, seed=seed + i) for i in range(3))
    seq = (Shard(2),)
    ops = (Operand(q, seq), Operand(k, seq), Operand(v, seq))
    mask = create_block_mask(_causal, None, None, length, length, device="cpu")
    cases = [
        Case(
            "flex_attention causal BlockMask + score_mod Shard(2)",
            _flex(mask),
            ops,
            keeps_layout=True,
            plain_fn=_dense_relative_bias(causal=True),
        )
    ]
    if with_default_mask:
        name = "flex_attention score_mod, no block_mask, Shard(2)"
        cases.append(Case(name, _flex(None), ops, True, plain_fn=_dense_relative_bias(False)))
    return cases


def _dt_cp_flex(q: Any, k: Any, v: Any) -> Any:
    import dt_cp

    return dt_cp.flex_attention(q, k, v, score_mod=_relative_bias, mask_mod=_causal)


def dt_cp_flex_cases(seed: int = 85) -> list[Case]:
    """The same causal attention with a score_mod through dt-cp's own flex front end."""
    q, k, v = (randn(1, 2, 11, 8, seed=seed + i) for i in range(3))
    seq = (Shard(2),)
    ops = (Operand(q, seq), Operand(k, seq), Operand(v, seq))
    name = "dt_cp.flex_attention causal + score_mod Shard(2)"
    return [Case(name, _dt_cp_flex, ops, True, plain_fn=_dense_relative_bias(causal=True))]


def bad_input_cases(lay: tuple[Placement, ...]) -> list[Case]:
    """Arguments torch refuses: the sharded call must raise torch's error."""
    x = randn(1, 3, 8, 8, seed=90)
    return [
        Case(
            "conv2d channel mismatch",
            lambda t, w: F.conv2d(t, w),
            (Operand(x, lay), Operand(randn(4, 2, 3, 3, seed=91))),
        ),
        Case(
            "conv2d zero stride",
            lambda t, w: F.conv2d(t, w, stride=0),
            (Operand(x, lay), Operand(randn(4, 3, 3, 3, seed=92))),
        ),
        Case(
            "reflect pad too wide",
            lambda t: F.pad(t, (0, 0, 8, 8), mode="reflect"),
            (Operand(x, lay),),
        ),
        Case(
            "avg_pool2d padding over half the kernel",
            lambda t: F.avg_pool2d(t, 2, 1, 2),
            (Operand(x, lay),),
        ),
        Case("max_pool2d zero kernel", lambda t: F.max_pool2d(t, 0), (Operand(x, lay),)),
    ]


def raised(case: Case, mesh: Any | None) -> BaseException | None:
    """The error the case raises on one process (mesh None) or sharded over `mesh`."""
    if mesh is None:
        return outcome(lambda: case.fn(*(op.value for op in case.operands)))[1]
    args = [distribute(op, mesh) for op in case.operands]
    return outcome(lambda: case.fn(*args))[1]


# --- tensor-parallel examples (torch's test_tp_examples patterns) --------------------------


class MLP(nn.Module):
    """torch's MLPModule shape: 10 -> 16 -> 10 with a ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.net1 = nn.Linear(10, 16)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))


class Attention(nn.Module):
    """torch's test Attention shape (4 heads of 4, causal SDPA). With DTensor projections
    (`use_local_output=False`) the SDPA sees head-sharded DTensors."""

    def __init__(self, dim: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        head_dim = d // self.heads  # -1 heads: all of them, or this rank's local ones
        q, k, v = (
            p(x).view(b, s, -1, head_dim).transpose(1, 2) for p in (self.wq, self.wk, self.wv)
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


def mlp_plan() -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"net1": ColwiseParallel(), "net2": RowwiseParallel()}


def attention_plan(local_output: bool) -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {
        name: ColwiseParallel(use_local_output=local_output) for name in ("wq", "wk", "wv")
    }
    plan["wo"] = RowwiseParallel()
    return plan


class Block(nn.Module):
    """A pre-norm attention block, for torch's sequence-parallel TP example."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = Attention(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.norm(x))


def sequence_parallel_plan() -> dict[str, Any]:
    """The norm on sequence shards, the attention gathering them and handing its output
    back as sequence shards (torch's TP-with-sequence-parallel layout)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan: dict[str, Any] = {
        "norm": SequenceParallel(),
        "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attn.wo": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    }
    for name in ("wq", "wk", "wv"):
        plan[f"attn.{name}"] = ColwiseParallel(use_local_output=False)
    return plan


@dataclass(frozen=True)
class TpExample:
    name: str
    make: Callable[[], nn.Module]
    plan: Callable[[], dict[str, Any]]
    shape: tuple[int, ...]
    input_layout: tuple[Placement, ...] | None = None  # None: a plain (replicated) input


def tp_models() -> list[TpExample]:
    """torch's TP examples: an MLP, attention with local or DTensor heads, and a
    sequence-parallel block (input sharded on the sequence)."""
    return [
        TpExample("MLP colwise/rowwise", MLP, mlp_plan, (20, 10)),
        TpExample("attention, local heads", Attention, lambda: attention_plan(True), (2, 8, 16)),
        TpExample("attention, DTensor heads", Attention, lambda: attention_plan(False), (2, 8, 16)),
        TpExample(
            "sequence-parallel block", Block, sequence_parallel_plan, (2, 8, 16), (Shard(1),)
        ),
    ]


def tp_input(example: TpExample, x: torch.Tensor, mesh: Any) -> Any:
    if example.input_layout is None:
        return x
    return distribute_tensor(x, mesh, list(example.input_layout))


def train_reference(
    model: nn.Module, inputs: list[torch.Tensor], grads: list[torch.Tensor], lr: float = 0.05
) -> list[torch.Tensor]:
    """SGD steps backpropagating `grads[i]` from the output on `inputs[i]`; the outputs."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    outs = []
    for x, g in zip(inputs, grads, strict=True):
        opt.zero_grad()
        y = model(x)
        (y * g).sum().backward()
        opt.step()
        outs.append(y.detach())
    return outs


def full_value(t: Any) -> Any:
    return t.full_tensor() if isinstance(t, DTensor) else t


def gradient_step(model: nn.Module, x: Any, g: torch.Tensor) -> tuple[Any, dict[str, Any]]:
    """One forward and backward: the output and every parameter's gradient, as full
    tensors (call where the collectives can run)."""
    model.zero_grad()
    y = full_value(model(x))
    (y * g).sum().backward()
    return y.detach(), {k: full_value(p.grad) for k, p in model.named_parameters()}


def step_differences(
    name: str, want: tuple[Any, dict[str, Any]], got: tuple[Any, dict[str, Any]], world: int
) -> list[str]:
    """Output and parameter gradients of `gradient_step`, sharded vs one process."""
    problems = []
    if p := _mismatch("output", got[0], want[0], world, ATOL):
        problems.append(f"{name}: {p}")
    if got[1].keys() != want[1].keys():
        problems.append(f"{name}: parameters {sorted(got[1])} vs {sorted(want[1])}")
    for key, grad in got[1].items():
        if p := _mismatch(f"grad {key}", grad, want[1].get(key), world, ATOL):
            problems.append(f"{name}: {p}")
    return problems


def train_parallel(
    model: nn.Module,
    inputs: list[Any],
    grads: list[torch.Tensor],
    lr: float = 0.05,
) -> list[Any]:
    """The same steps on a parallelized model (outputs as full tensors)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    outs = []
    for x, g in zip(inputs, grads, strict=True):
        opt.zero_grad()
        y = full_value(model(x))
        (y * g).sum().backward()
        opt.step()
        outs.append(y.detach())
    return outs


def parallel_params(model: nn.Module) -> dict[str, Any]:
    """Every parameter as a full tensor (call where the collectives can run)."""
    return {key: full_value(p.detach()) for key, p in model.named_parameters()}


def training_differences(
    name: str,
    reference_model: nn.Module,
    ref_outs: list[torch.Tensor],
    outs: list[Any],
    params: dict[str, Any],
    world: int,
    atol: float = ATOL,
) -> list[str]:
    """Outputs of every step, then every parameter after the last step."""
    problems = []
    for step, (got, want) in enumerate(zip(outs, ref_outs, strict=True)):
        if p := _mismatch(f"step {step} output", got, want, world, atol):
            problems.append(f"{name}: {p}")
    want_params = dict(reference_model.named_parameters())
    if params.keys() != want_params.keys():
        problems.append(f"{name}: parameters {sorted(params)} vs {sorted(want_params)}")
    for key, got in params.items():
        if p := _mismatch(f"param {key}", got, want_params[key].detach(), world, atol):
            problems.append(f"{name}: {p}")
    return problems


def tp_data(shape: tuple[int, ...], steps: int, seed: int) -> tuple[list, list]:
    inputs = [randn(*shape, seed=seed + 2 * i) for i in range(steps)]
    grads = [randn(*shape, seed=seed + 2 * i + 1) for i in range(steps)]
    return inputs, grads


def seeded_model(make: Callable[[], nn.Module], seed: int = 5) -> nn.Module:
    torch.manual_seed(seed)
    return make().double()


def clone(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)
