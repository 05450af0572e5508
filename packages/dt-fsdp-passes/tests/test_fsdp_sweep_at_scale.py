"""simple_fsdp swept at scale: 2 to 64 simulated ranks in one process (LocalTensorMode).

Hypothesis draws a world, each octave (2-4, 4-8, ..., 32-64) as likely, and a mesh on it:
1-D (FSDP) three times in four, else 2-D (r, n) HSDP (replicate over r = 2-4, shard over
n). On it, a small float64 model of odd shapes: an Embedding (1-7 rows of 1-7 dims, maybe
a padding_idx) or not, then 1-3 layers among Linear (1-7 features in and out, bias or
not), Conv1d (1-7 channels, kernel 1-3, groups, bias or not) and Scale (a parameter of
shape (1,), (features,) or, one time in three, 0-dim), tanh between them, on 1-3
positions; reshard_after_forward or not. Every parameter has 1-7 rows, so past 7 ranks
most ranks hold an empty shard, and shards are uneven. Half the HSDP models draw every
row count n or 2n instead (see the torch limit below). Explicit cases run on 16, 32 (HSDP)
and 64 ranks, and the refusal of a 0-dim parameter and the torch limit on their own.

Each case against the reference model (deep-copied before sharding) on one process over
the whole batch, each simulated rank holding its own slice of it: every rank's output, the
mean of the ranks' losses, then every parameter's gradient (a DTensor laid out as its
parameter; full_tensor on every rank); and again after one SGD step (always up to 8
ranks, drawn up to 32). A 0-dim parameter must be refused by simple_fsdp's named
ValueError ("simple_fsdp: ..."). Failures are collected, not raised, so the report names
every wrong case in full, without hypothesis shrinking at 64 ranks. A wrong value, an
AssertionError or any other error fails.

A torch limit, not a simple_fsdp bug: with HSDP under LocalTensorMode, a parameter whose
rows do not split evenly over n has per-rank shard sizes, and the replicate-dim
`from_local` infers a global shape holding a LocalIntNode SymInt that torch 2.13's
from_local backward hashes (DTensorSpec.__hash__: "TypeError: unhashable type: non-nested
SymInt"; real ranks have plain ints). Such a case checks the forward and expects exactly
that TypeError from backward, or, on a torch that does not raise it, exact gradients.

Cost: a simulated rank costs time in every op, and torch's per-op mesh bookkeeping grows
with the world: a one-Linear step costs 3-4 s of CPU at 64 ranks against ~0.1 s at 4. So
worlds past 16 draw 1-2 layers, past 32 one layer, no Embedding and no second step. In
CI's scope (a fixed seed, 6 random cases) the file takes ~20 s of CPU (~30 s on a busy
2-core machine); `DT_SWEEP_SCALE=N` draws N times more.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from dt_core.testing import rank_values, simulated_ranks
from dt_core.testing.sweeps import sweep_settings
from torch import nn

# The simulated-rank twin of test_simple_fsdp_local_tensor.py's 2-4 ranks, which every
# release runs: CI runs this one on one release (tools/run_cell.py).
pytestmark = pytest.mark.ci_once

BUDGET = 6  # random examples in CI (times DT_SWEEP_SCALE)
MOST_RANKS = 64
DTYPE = torch.float64
# float64 throughout: only the order of the sums differs (the reduce-scatter adds the
# ranks' gradients, one process adds rows), a few ulps at these sizes.
RTOL, ATOL = 1e-9, 1e-12
# See the module docstring: torch's LocalTensorMode cannot hash per-rank sizes.
HSDP_UNEVEN_TORCH_ERROR = "unhashable type: non-nested SymInt"


def _worlds() -> Any:
    """2-64 ranks, each octave (2-4, 4-8, ..., 32-64) as likely: a few draws reach the
    large worlds while most stay affordable."""
    from hypothesis import strategies as st

    return st.integers(1, 5).flatmap(lambda b: st.integers(2**b, min(2 ** (b + 1), MOST_RANKS)))


class _Channels(nn.Module):
    """A Conv1d on (batch, positions, channels) activations, as Linear takes them."""

    def __init__(self, conv: nn.Conv1d) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.transpose(1, 2)).transpose(1, 2)


class _ScaleModule(nn.Module):
    """Multiplies by a parameter broadcast over the features: shape (), (1,) or (c,)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(shape, dtype=DTYPE))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


@dataclass(frozen=True)
class Embedding:
    rows: int
    dim: int
    padding_idx: int | None = None

    def build(self) -> nn.Module:
        return nn.Embedding(self.rows, self.dim, padding_idx=self.padding_idx, dtype=DTYPE)


@dataclass(frozen=True)
class Linear:
    inp: int
    out: int
    bias: bool = True

    def build(self) -> nn.Module:
        return nn.Linear(self.inp, self.out, bias=self.bias, dtype=DTYPE)


@dataclass(frozen=True)
class Conv1d:
    inp: int
    out: int
    kernel: int = 1
    groups: int = 1
    bias: bool = True

    def build(self) -> nn.Module:
        # kernel // 2 on each side: a kernel of 2 gives one position more (padding="same"
        # warns about even kernels)
        conv = nn.Conv1d(
            self.inp,
            self.out,
            self.kernel,
            padding=self.kernel // 2,
            groups=self.groups,
            bias=self.bias,
        )
        return _Channels(conv.to(DTYPE))


@dataclass(frozen=True)
class Scale:
    shape: tuple[int, ...]

    def build(self) -> nn.Module:
        return _ScaleModule(self.shape)


Layer = Embedding | Linear | Conv1d | Scale


@dataclass(frozen=True)
class Case:
    """One model on one mesh: `batch` rows of `seq` positions per simulated rank."""

    mesh: tuple[int, ...]
    layers: tuple[Layer, ...]
    inp: int = 1  # features of the input (unused when the first layer is an Embedding)
    batch: int = 1
    seq: int = 1
    second_step: bool = False
    reshard: bool = True  # simple_fsdp's reshard_after_forward (re-gather in backward)
    seed: int = 0

    @property
    def world(self) -> int:
        return math.prod(self.mesh)

    @property
    def name(self) -> str:
        layers = ", ".join(map(repr, self.layers))
        return (
            f"mesh={self.mesh} [{layers}] inp={self.inp} batch={self.batch} seq={self.seq} "
            f"second_step={self.second_step} reshard={self.reshard} seed={self.seed}"
        )

    def reference(self) -> nn.Module:
        torch.manual_seed(self.seed)
        modules: list[nn.Module] = []
        for i, layer in enumerate(self.layers):
            if i and not isinstance(self.layers[i - 1], Embedding):
                modules.append(nn.Tanh())
            modules.append(layer.build())
        return nn.Sequential(*modules)

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole batch (every rank's rows, rank by rank) and its targets."""
        gen = torch.Generator().manual_seed(self.seed + 1)
        rows = self.world * self.batch
        first = self.layers[0]
        if isinstance(first, Embedding):
            x = torch.randint(0, first.rows, (rows, self.seq), generator=gen)
        else:
            x = torch.randn(rows, self.seq, self.inp, generator=gen, dtype=DTYPE)
        with torch.no_grad():
            out = self.reference()(x)
        return x, torch.randn(out.shape, generator=gen, dtype=DTYPE)

    def hsdp_uneven(self, reference: nn.Module) -> bool:
        """HSDP with a parameter whose rows split unevenly over the shard dim (torch limit)."""
        n = self.mesh[-1]
        return len(self.mesh) == 2 and any(
            p.dim() and p.shape[0] % n for p in reference.parameters()
        )


class Mismatch(Exception):
    """A value simple_fsdp got wrong (kept apart from an AssertionError it raised)."""


@dataclass
class Outcomes:
    exact: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    torch_limited: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if got.shape != want.shape or not torch.allclose(got, want, rtol=RTOL, atol=ATOL):
        raise Mismatch(f"{what}: got {got.tolist()}, want {want.tolist()}")


def _expected(case: Case, steps: int) -> list[tuple[torch.Tensor, torch.Tensor, dict]]:
    """One process on the whole batch: (output, loss, gradients by name) at each step."""
    reference = case.reference()
    x, y = case.data()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    out: list[tuple[torch.Tensor, torch.Tensor, dict]] = []
    for _ in range(steps):
        output = reference(x)
        loss = ((output - y) ** 2).mean()
        loss.backward()
        grads = {k: p.grad.clone() for k, p in reference.named_parameters()}
        out.append((output.detach(), loss.detach(), grads))
        optimizer.step()
        optimizer.zero_grad()
    return out


def run_case(case: Case) -> str:
    """`case` on its simulated ranks against one process: "exact", "refused" or
    "torch-limited"; raises Mismatch for a wrong value, anything else as raised."""
    from dt_fsdp_passes import simple_fsdp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    reference = case.reference()
    zero_dim = any(p.dim() == 0 for p in reference.parameters())
    uneven = case.hsdp_uneven(reference)
    steps = 2 if case.second_step and not zero_dim and not uneven else 1
    expected = [] if zero_dim else _expected(case, steps)
    x, y = case.data()
    world, b = case.world, case.batch
    with simulated_ranks(world) as mode:
        names = ("replicate", "shard") if len(case.mesh) == 2 else ("fsdp",)
        mesh = init_device_mesh("cpu", case.mesh, mesh_dim_names=names)
        model = copy.deepcopy(reference)
        if zero_dim:
            try:
                simple_fsdp(model, mesh, reshard_after_forward=case.reshard)
            except ValueError as error:
                if str(error).startswith("simple_fsdp:"):
                    return "refused"
                raise
            raise Mismatch("a 0-dim parameter was sharded, not refused")
        simple_fsdp(model, mesh, reshard_after_forward=case.reshard)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        xs = mode.rank_map(lambda r: x[r * b : (r + 1) * b])
        ys = mode.rank_map(lambda r: y[r * b : (r + 1) * b])
        for step, (want_out, want_loss, want_grads) in enumerate(expected):
            at = f"step {step + 1}"
            output = model(xs)
            loss = ((output - ys) ** 2).mean()
            for r, got in enumerate(rank_values(output.detach(), world)):
                _close(got, want_out[r * b : (r + 1) * b], f"{at} output of rank {r}")
            losses = torch.stack(rank_values(loss.detach(), world))
            _close(losses.mean(), want_loss, f"{at} mean loss")
            try:
                loss.backward()
            except TypeError as error:
                if uneven and HSDP_UNEVEN_TORCH_ERROR in str(error):
                    return "torch-limited"
                raise
            for name, p in model.named_parameters():
                grad = p.grad
                if not isinstance(grad, DTensor) or grad.placements != p.placements:
                    raise Mismatch(f"{at} grad of {name}: {grad!r} not laid out as {p!r}")
                for r, got in enumerate(rank_values(grad.full_tensor(), world)):
                    _close(got, want_grads[name], f"{at} grad of {name} on rank {r}")
            optimizer.step()
            optimizer.zero_grad()
    return "exact"


def check(case: Case, outcomes: Outcomes) -> None:
    """Run `case`, noting its outcome; a wrong value or an unexpected error is a failure."""
    try:
        outcome = run_case(case)
    except Mismatch as error:
        outcomes.failed.append(f"{case.name}: wrong: {error}")
        return
    except AssertionError as error:  # never a refusal: an internal check failed
        outcomes.failed.append(f"{case.name}: AssertionError: {error}")
        return
    except Exception as error:
        outcomes.failed.append(f"{case.name}: unnamed {type(error).__name__}: {error}")
        return
    {"exact": outcomes.exact, "refused": outcomes.refused}.get(
        outcome, outcomes.torch_limited
    ).append(case.name)


def _most_layers(world: int) -> int:
    """Layers after an Embedding (see the module docstring's cost)."""
    return 3 if world <= 16 else 2 if world <= 32 else 1


def _cases() -> Any:
    """Cases as the module docstring says."""
    from hypothesis import strategies as st

    @st.composite
    def case(draw: Any) -> Case:
        world = draw(_worlds(), label="world")
        mesh: tuple[int, ...] = (world,)
        even = False
        if world >= 4 and draw(st.integers(0, 3), label="hsdp") == 0:
            r = draw(st.sampled_from([k for k in (2, 3, 4) if 2 * k <= world]), label="r")
            mesh = (r, world // r)
            even = draw(st.booleans(), label="even rows")  # values checked, not torch's limit
        n = mesh[-1]
        rows = st.sampled_from((n, 2 * n)) if even else st.integers(1, 7)
        features = inp = draw(rows, label="inp")
        layers: list[Layer] = []
        if world <= 32 and draw(st.integers(0, 3), label="embedding") == 0:
            dim = draw(rows, label="dim")
            count = draw(rows, label="embedding rows")
            pad = draw(st.one_of(st.none(), st.integers(0, count - 1)), label="padding_idx")
            layers.append(Embedding(count, dim, pad))
            features = dim
        for _ in range(draw(st.integers(1, _most_layers(world)), label="layers")):
            kind = draw(st.sampled_from(("linear", "conv1d", "scale")), label="kind")
            if kind == "scale":
                shapes = [(features,), (features,), ()] if even else [(1,), (features,), ()]
                layers.append(Scale(draw(st.sampled_from(shapes), label="shape")))
                continue
            out = draw(rows, label="out")
            bias = draw(st.booleans(), label="bias")
            if kind == "linear":
                layers.append(Linear(features, out, bias))
            else:
                common = [g for g in range(1, features + 1) if features % g == 0 and out % g == 0]
                groups = draw(st.sampled_from(common), label="groups")
                kernel = draw(st.integers(1, 3), label="kernel")
                layers.append(Conv1d(features, out, kernel, groups, bias))
            features = out
        return Case(
            mesh=mesh,
            layers=tuple(layers),
            inp=inp,
            batch=draw(st.integers(1, 2 if world <= 16 else 1), label="batch"),
            seq=draw(st.integers(1, 3), label="seq"),
            # always where cheap, sometimes up to 32 ranks, never past
            second_step=world <= 8 or (world <= 32 and draw(st.booleans(), label="2nd step")),
            reshard=draw(st.booleans(), label="reshard"),
            seed=draw(st.integers(0, 99), label="seed"),
        )

    return case()


def _report(outcomes: Outcomes) -> str:
    return (
        f"{len(outcomes.exact)} exact, {len(outcomes.refused)} refused, "
        f"{len(outcomes.torch_limited)} torch-limited (HSDP uneven), {len(outcomes.failed)} wrong"
    )


def test_simple_fsdp_sweep_2_to_64_simulated_ranks() -> None:
    """BUDGET drawn cases (times DT_SWEEP_SCALE) on 2-64 ranks: each exact, refused by
    name, or (HSDP, uneven rows) stopped by torch's named limit."""
    from hypothesis import given

    outcomes = Outcomes()

    @sweep_settings(BUDGET)
    @given(_cases())
    def sweep(case: Case) -> None:
        check(case, outcomes)

    sweep()
    print(_report(outcomes), *outcomes.exact, *outcomes.refused, *outcomes.torch_limited, sep="\n")
    assert not outcomes.failed, _report(outcomes) + ":\n" + "\n".join(outcomes.failed)
    assert outcomes.exact, f"no case ran in full: {_report(outcomes)}"


# One explicit case per large world, on top of the random draws.
LARGE_WORLDS = [
    # 16 ranks: an Embedding of 7 rows (9 empty shards) with a padding_idx, a Conv1d of 6
    # channels in 2 groups (kernel 3), a (1,) Scale and a bias-free Linear to 1 feature
    # (15 empty shards); two SGD steps.
    pytest.param(
        Case(
            (16,),
            (Embedding(7, 4, padding_idx=2), Conv1d(4, 6, 3, 2), Scale((1,)), Linear(6, 1, False)),
            batch=2,
            seq=3,
            second_step=True,
            seed=1,
        ),
        id="16ranks",
    ),
    # 32 ranks as HSDP (2, 16): 16 rows split evenly, so backward runs in full (values
    # checked), and SGD steps (Replicate, Shard(0)) parameters; gathers kept for backward.
    pytest.param(
        Case((2, 16), (Linear(3, 16, False),), inp=3, seq=2, second_step=True, reshard=False),
        id="32ranks-hsdp",
    ),
    # 64 ranks: 5 rows and a bias of 5 (59 empty shards each), one step.
    pytest.param(Case((64,), (Linear(2, 5),), inp=2, seq=1, seed=3), id="64ranks"),
]


@pytest.mark.parametrize("case", LARGE_WORLDS)
def test_large_world(case: Case) -> None:
    """One explicit case on 16, 32 or 64 ranks: exact, every step."""
    outcomes = Outcomes()
    check(case, outcomes)
    assert outcomes.exact == [case.name], _report(outcomes) + "\n" + "\n".join(outcomes.failed)


@pytest.mark.parametrize("mesh", [(5,), (2, 3)], ids=["fsdp5", "hsdp2x3"])
def test_zero_dim_parameter_refused_by_name(mesh: tuple[int, ...]) -> None:
    """A 0-dim parameter (after one that is sharded) is refused with simple_fsdp's
    ValueError, on FSDP and HSDP meshes."""
    assert run_case(Case(mesh, (Linear(2, 3), Scale(())), inp=2)) == "refused"


def test_hsdp_uneven_rows_exact_or_stopped_by_torchs_named_limit() -> None:
    """HSDP (2, 3) with 4 rows: the forward is exact; backward gives exact gradients or
    raises exactly torch's TypeError (see the module docstring), nothing else."""
    case = Case((2, 3), (Linear(2, 4, False),), inp=2, seq=2)
    assert run_case(case) in ("torch-limited", "exact")
