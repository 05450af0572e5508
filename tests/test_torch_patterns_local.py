"""torch 2.13's DTensor test patterns with every plugin installed, in one process.

torch generates a LocalTensor variant of its DTensor test classes (LocalTensorMode over
a fake process group simulates every rank); these are our versions of its math,
pointwise, view, convolution, tensor-parallel-example and attention cases for the ops
the plugins own, each checked against the same computation on one process (values and
gradients) — the breadth of `test_torch_patterns_ranks.py`, which runs a subset on
spawned gloo ranks. Cases live in `torch_patterns.py`.

Each test records (`record_property("fallbacks", ...)`) the FallbackWarnings the plugins
raised: under LocalTensorMode dt-conv may still compute replicated (exact, one warning).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch_patterns as tp
from dt_core.testing import simulated_ranks
from torch.distributed.tensor import Replicate, Shard

PLUGINS = {"conv", "cp", "symm-mem", "fsdp-passes"}
ONE_D = [(Shard(3),), (Shard(2),), (Shard(0),)]
TWO_D = [(Shard(2), Shard(3)), (Shard(0), Shard(3))]


@pytest.fixture(autouse=True, scope="module")
def every_plugin_active() -> None:
    """All plugins active, whatever earlier tests in this process deactivated."""
    import dt_core

    torch.set_num_threads(1)
    if not dt_core.is_active():
        dt_core.activate()
    active = {info.name for info in dt_core.plugins() if info.state == "active"}
    assert PLUGINS <= active, active


def simulate(cases: Sequence[tp.Case], mesh_shape: Sequence[int]) -> tuple[list[str], set[str]]:
    """Every case sharded over simulated ranks vs one process: (problems, fallbacks)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = math.prod(mesh_shape)
    expected = [tp.reference(case) for case in cases]  # outside the mode: plain torch
    problems: list[str] = []
    fallbacks: set[str] = set()
    results: list[tuple[tp.Case, tp.Result, tp.Result]] = []
    with simulated_ranks(world):
        mesh = init_device_mesh("cpu", tuple(mesh_shape))
        for case, (want, grad_outs) in zip(cases, expected, strict=True):
            got, error = tp.outcome(lambda c=case, g=grad_outs: tp.sharded(c, mesh, g))
            if error is not None:
                problems.append(f"{case.name}: raised {type(error).__name__}: {error}")
                continue
            fallbacks.update(got.fallbacks)
            results.append((case, want, got))
    for case, want, got in results:
        problems += tp.differences(case, want, got, world)
    return problems, fallbacks


def check(cases: Sequence[tp.Case], mesh_shape: Sequence[int], record: Any) -> None:
    problems, fallbacks = simulate(cases, mesh_shape)
    record("fallbacks", sorted(fallbacks))
    assert not problems, "\n".join(problems)


# 4 simulated ranks: the larger twin of 2 and 3 (and of the 2x2 mesh), swept by CI on
# the newest torch only
MESHES = [pytest.param((2,), id="2"), pytest.param((4,), id="4", marks=pytest.mark.ci_once)]


def _doubled_when_sharded(x: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return x * 2 if isinstance(x, DTensor) else x


def _detached_when_sharded(x: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return x.detach() * x if isinstance(x, DTensor) else x * x


def test_the_checker_catches_wrong_values_gradients_and_layouts() -> None:
    """The comparison these tests rely on reports each kind of difference."""
    x = tp.randn(2, 3, 4, 4, seed=0)
    cases = [
        tp.Case("values", _doubled_when_sharded, (tp.Operand(x, (Shard(2),)),)),
        tp.Case("gradients", _detached_when_sharded, (tp.Operand(x, (Shard(2),)),)),
        tp.Case("layout", lambda t: t.sum(1), (tp.Operand(x, (Shard(1),)),), keeps_layout=True),
    ]
    problems, _ = simulate(cases, (2,))
    found = {(p.split(":")[0], p.split(":")[1].split()[0]) for p in problems}
    want = {("values", "out0"), ("values", "grad0"), ("gradients", "grad0"), ("layout", "output")}
    assert found == want, problems


@pytest.mark.parametrize("mesh_shape", [*MESHES, pytest.param((3,), id="3")])
def test_convolution_patterns(mesh_shape: tuple[int, ...], record_property: Any) -> None:
    cases = tp.conv_cases(ONE_D) + tp.conv_1d_3d_cases(1) + tp.channel_conv_cases(1)
    check(cases, mesh_shape, record_property)


def test_convolution_patterns_2d_mesh(record_property: Any) -> None:
    check(tp.conv_cases(TWO_D) + tp.conv_1d_3d_cases(2), (2, 2), record_property)


@pytest.mark.parametrize("mesh_shape", [*MESHES, pytest.param((2, 2), id="2x2")])
def test_math_ops_upsampling_pattern(mesh_shape: tuple[int, ...], record_property: Any) -> None:
    """torch's test_upsampling (its LocalTensor variant failed with the plugins once)."""
    check(tp.upsampling_pattern_cases(len(mesh_shape)), mesh_shape, record_property)


def _spatial(mesh_shape: tuple[int, ...]) -> list[tuple[Any, ...]]:
    return [(Shard(2),), (Shard(3),)] if len(mesh_shape) == 1 else [(Shard(2), Shard(3))]


def _circular(case: tp.Case) -> bool:
    return "circular" in case.name


@pytest.mark.parametrize(
    "mesh_shape", [*MESHES, pytest.param((3,), id="3"), pytest.param((2, 2), id="2x2")]
)
def test_interpolate_pool_pad(mesh_shape: tuple[int, ...], record_property: Any) -> None:
    layouts = _spatial(mesh_shape)
    cases = tp.interpolate_cases(layouts) + tp.pool_cases(layouts) + tp.pad_cases(layouts)
    # circular padding's layout is checked below; its values here
    cases = [dataclasses.replace(c, keeps_layout=False) if _circular(c) else c for c in cases]
    check(cases, mesh_shape, record_property)


def test_circular_pad_keeps_layout_under_local_tensor_mode(record_property: Any) -> None:
    check([c for c in tp.pad_cases(_spatial((2,))) if _circular(c)], (2,), record_property)


@pytest.mark.parametrize("mesh_shape", [*MESHES, pytest.param((2, 2), id="2x2")])
def test_torch_ops_on_conv_outputs(mesh_shape: tuple[int, ...], record_property: Any) -> None:
    """Pointwise, view and reduction ops (torch's own) after a sharded conv."""
    cases = [c for lay in _spatial(mesh_shape) for c in tp.conv_then_torch_ops_cases(lay)]
    if not tp.torch_flattens_a_sharded_inner_dim():
        record_property(
            "torch_limit",
            "flatten of a W-sharded conv output: torch's own view op refuses it "
            '("Attempted to flatten multiple dimensions"); redistribute W first',
        )
    check(cases, mesh_shape, record_property)


@pytest.mark.parametrize(
    "mesh_shape", [*MESHES, pytest.param((3,), id="3"), pytest.param((2, 2), id="2x2")]
)
def test_sdpa_sequence_sharded(mesh_shape: tuple[int, ...], record_property: Any) -> None:
    check(tp.sdpa_cases(len(mesh_shape)), mesh_shape, record_property)


@pytest.mark.parametrize("mesh_shape", MESHES)
def test_dt_cp_flex_attention_sequence_sharded(
    mesh_shape: tuple[int, ...], record_property: Any
) -> None:
    check(tp.dt_cp_flex_cases(), mesh_shape, record_property)


def test_torch_flex_attention_front_end_names_its_limit_under_local_tensor_mode() -> None:
    """torch's flex front end compiles even in eager, and Dynamo cannot trace the mode's
    simulated ranks: dt-cp says so and names dt_cp.flex_attention (exact there, above)
    instead of torch's internal assertion; spawned ranks compute it exactly."""
    problems, _ = simulate(tp.flex_cases(), (2,))
    assert len(problems) == 1 and "dt_cp.flex_attention" in problems[0], problems
    assert "AssertionError" not in problems[0], problems


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.ci_once)])
def test_tp_examples(world: int) -> None:
    """torch's test_tp_examples: colwise/rowwise MLP and attention (dt-symm-mem and dt-cp
    installed), outputs and parameter gradients of two steps equal one process. No
    optimizer step here (see the xfail below); the spawned-rank form trains."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    problems = []
    for seed, example in enumerate(tp.tp_models()):
        reference = tp.seeded_model(example.make)
        parallel = tp.clone(reference)
        inputs, grads = tp.tp_data(example.shape, steps=2, seed=100 + 10 * seed)
        wants = [tp.gradient_step(reference, x, g) for x, g in zip(inputs, grads)]
        with simulated_ranks(world):
            mesh = init_device_mesh("cpu", (world,))
            parallelize_module(parallel, mesh, example.plan())
            xs = [tp.tp_input(example, x, mesh) for x in inputs]
            gots = [tp.gradient_step(parallel, x, g) for x, g in zip(xs, grads)]
        for want, got in zip(wants, gots):
            problems += tp.step_differences(example.name, want, got, world)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("layout", [(Shard(3),), (Shard(2),)], ids=["Shard(3)", "Shard(2)"])
def test_downsampling_conv_steps(layout: tuple[Any, ...], record_property: Any) -> None:
    """torch's downsampling-conv pattern: distribute_module (replicated weights), input
    sharded; output and weight gradients of two steps equal one process."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_module, distribute_tensor

    reference = tp.seeded_model(lambda: torch.nn.Conv2d(3, 8, kernel_size=4, stride=4))
    parallel = tp.clone(reference)
    inputs, _ = tp.tp_data((2, 3, 16, 24), steps=2, seed=200)
    grads = [tp.randn(2, 8, 4, 6, seed=300 + i) for i in range(2)]
    wants = [tp.gradient_step(reference, x, g) for x, g in zip(inputs, grads)]
    with simulated_ranks(2), tp.recorded_fallbacks() as fallbacks:
        mesh = init_device_mesh("cpu", (2,))
        distribute_module(parallel, mesh)
        sharded = [distribute_tensor(x, mesh, list(layout)) for x in inputs]
        gots = [tp.gradient_step(parallel, x, g) for x, g in zip(sharded, grads)]
    record_property("fallbacks", sorted(set(fallbacks)))
    problems = []
    for want, got in zip(wants, gots):
        problems += tp.step_differences("conv steps", want, got, 2)
    assert not problems, "\n".join(problems)


@pytest.mark.xfail(
    strict=True,
    reason="LocalTensorMode: a replicated parameter made by "
    "distribute_module / parallelize_module holds one tensor object for every simulated "
    "rank, so an in-place optimizer update is applied once per rank (plugins deactivated "
    "too)",
)
def test_local_tensor_sgd_step_on_replicated_parameter() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_module

    reference = tp.seeded_model(lambda: torch.nn.Linear(3, 2))
    parallel = tp.clone(reference)
    x, g = tp.randn(4, 3, seed=1), tp.randn(4, 2, seed=2)
    tp.train_reference(reference, [x], [g])
    with tp.plugins_off(), simulated_ranks(2):
        distribute_module(parallel, init_device_mesh("cpu", (2,)))
        tp.train_parallel(parallel, [x], [g])
        params = tp.parallel_params(parallel)
    problems = tp.training_differences("sgd", reference, [], [], params, 2)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("layout", [(Shard(2),), (Shard(3),)], ids=["Shard(2)", "Shard(3)"])
def test_bad_arguments_raise_torchs_error(layout: tuple[Any, ...]) -> None:
    """Arguments torch refuses raise torch's own error under LocalTensorMode, with the
    plugins and without them."""
    from torch.distributed.device_mesh import init_device_mesh

    problems = []
    cases = tp.bad_input_cases(layout)
    wants = [tp.raised(case, None) for case in cases]
    for off in (False, True):
        with tp.plugins_off() if off else contextlib.nullcontext(), simulated_ranks(2):
            mesh = init_device_mesh("cpu", (2,))
            for case, want in zip(cases, wants, strict=True):
                # torch alone words a shape as torch.Size([..]): compare up to the values
                got = tp.raised(case, mesh)
                if problem := tp.same_error(want, got, prefix=40 if off else None):
                    problems.append(f"{case.name} (plugins {'off' if off else 'on'}): {problem}")
    assert not problems, "\n".join(problems)


# --- torch alone: the same cases with every plugin deactivated ------------------------------


def torch_owned_cases(lay: tuple[Any, ...]) -> list[tp.Case]:
    """Ops no plugin claims, on the layouts the plugins' outputs have."""
    x = tp.randn(2, 4, 8, 6, seed=400)
    ops = {
        "gelu * 2 + sigmoid": lambda t: torch.nn.functional.gelu(t) * 2 + t.sigmoid(),
        "permute + layer_norm": lambda t: torch.nn.functional.layer_norm(
            t.permute(0, 2, 3, 1), (4,)
        ),
        "flatten(2) + softmax": lambda t: t.flatten(2).softmax(-1),
        "sum over H, W": lambda t: t.sum(dim=(2, 3)),
        "cumsum(2)": lambda t: t.cumsum(2),
        "adaptive_avg_pool2d": lambda t: torch.nn.functional.adaptive_avg_pool2d(t, (3, 2)),
        "tanh + mean over C": lambda t: t.tanh().mean(1, keepdim=True),
    }
    if Shard(3) in lay and not tp.torch_flattens_a_sharded_inner_dim():
        del ops["flatten(2) + softmax"]  # torch 2.11's view refuses it, plugins or not
    return [tp.Case(f"{name} {lay}", fn, (tp.Operand(x, lay),)) for name, fn in ops.items()]


@pytest.mark.parametrize("layout", [(Shard(2),), (Shard(3),), (Replicate(),)], ids=str)
def test_torch_owned_ops_unchanged_by_plugins(layout: tuple[Any, ...]) -> None:
    """Where no plugin applies, torch's answer and output layout are the same with the
    plugins active and deactivated (and both equal one process)."""
    from torch.distributed.device_mesh import init_device_mesh

    cases = torch_owned_cases(layout)
    expected = [tp.reference(case) for case in cases]
    on: list[tp.Result] = []
    off: list[tuple[tp.Result | None, BaseException | None]] = []
    with simulated_ranks(2):
        mesh = init_device_mesh("cpu", (2,))
        on = [tp.sharded(c, mesh, g) for c, (_, g) in zip(cases, expected)]
    with tp.plugins_off(), simulated_ranks(2):
        mesh = init_device_mesh("cpu", (2,))
        off = [
            tp.outcome(lambda c=c, g=g: tp.sharded(c, mesh, g))
            for c, (_, g) in zip(cases, expected)
        ]
        refused = [(c.name, e) for c, (_, e) in zip(cases, off) if e is not None]
        gaps = {name for name, error in refused if tp.torch_lacks_a_strategy(error)}
    problems = []
    for case, (want, _), with_plugins, (alone, error) in zip(cases, expected, on, off, strict=True):
        problems += tp.differences(case, want, with_plugins, 2)
        if error is not None:
            # torch alone may refuse only what dt-core's torch-gaps plugin fills: an op
            # its sharding tables lack (pooling, flip, interpolation backward on 2.11)
            if case.name not in gaps:
                problems.append(f"{case.name}: torch alone raises {error!r}")
            continue
        assert alone is not None
        problems += tp.differences(case, want, alone, 2)
        if with_plugins.placements != alone.placements:
            problems.append(
                f"{case.name}: placements {with_plugins.placements} vs torch's {alone.placements}"
            )
    assert not problems, "\n".join(problems)


def plugin_owned_cases() -> list[tp.Case]:
    """One case per op family a plugin claims, on the layouts torch's tests use."""
    cases = tp.conv_cases([(Shard(3),)])[:1]  # torch's own tp conv handles the last dim
    cases += tp.conv_cases([(Shard(2),)])[:1]
    cases += tp.upsampling_pattern_cases(1)
    layouts = [(Shard(2),)]
    cases += [tp.interpolate_cases(layouts)[0], tp.pool_cases(layouts)[0]]
    cases += [c for c in tp.pad_cases(layouts) if "constant" in c.name or "reflect" in c.name]
    cases += tp.sdpa_cases(1)[:1]
    return cases


def test_plugin_owned_ops_against_torch_alone(record_property: Any) -> None:
    """The plugins' ops with the plugins deactivated: torch alone either raises (the
    plugins compute the case exactly instead) or gives the same values as with the
    plugins (often replicated where the plugins keep the input's layout). What torch
    alone did is recorded."""
    import dt_core
    from torch.distributed.device_mesh import init_device_mesh

    cases = plugin_owned_cases()
    problems, _ = simulate(cases, (2,))
    assert not problems, "\n".join(problems)
    expected = [tp.reference(case) for case in cases]
    torch_alone: dict[str, str] = {}
    with tp.plugins_off(), simulated_ranks(2):
        mesh = init_device_mesh("cpu", (2,))
        for case, (want, grad_outs) in zip(cases, expected, strict=True):
            got, error = tp.outcome(lambda c=case, g=grad_outs: tp.sharded(c, mesh, g))
            if error is not None:
                torch_alone[case.name] = f"raises {type(error).__name__}"
                continue
            torch_alone[case.name] = f"computes, output {got.placements}"
            any_layout = dataclasses.replace(case, keeps_layout=False)
            problems += tp.differences(any_layout, want, got, 2)
    record_property("torch_alone", torch_alone)
    assert dt_core.is_active()  # put back for the tests that follow
    assert not problems, "torch alone differs:\n" + "\n".join(problems)
