"""torch 2.13's DTensor test patterns with every plugin installed, on spawned gloo ranks.

A representative subset of `test_torch_patterns_local.py` (which covers the breadth in
one process under LocalTensorMode), run where real processes exchange halos and K/V
blocks: every test runs many cases in dt-core's shared 2- and 4-rank worlds, each case
against the same computation on one process (values and gradients), every rank
checking its own full tensors.
"""

from __future__ import annotations

import contextlib

import pytest

TIMEOUT = 120


def _setup() -> None:
    import dt_core
    import torch

    torch.set_num_threads(1)
    if not dt_core.is_active():  # a test before may have deactivated them
        dt_core.activate()
    active = {info.name for info in dt_core.plugins() if info.state == "active"}
    assert {"conv", "cp", "symm-mem", "fsdp-passes"} <= active, active


def _check(cases: list, mesh_shape: tuple[int, ...]) -> None:
    import torch_patterns as tp
    from dt_core.testing import cpu_mesh

    problems = tp.check_all_here(cases, cpu_mesh(mesh_shape), 1)
    assert not problems, "\n".join(problems)


@pytest.mark.ranks(2, 4, timeout=TIMEOUT)
def test_convolution_patterns(world_size: int) -> None:
    import torch_patterns as tp
    from torch.distributed.tensor import Shard

    _setup()
    layouts = [(Shard(3),), (Shard(2),)]
    _check(
        tp.conv_cases(layouts) + tp.conv_1d_3d_cases(1) + tp.channel_conv_cases(1), (world_size,)
    )


@pytest.mark.ranks(4, timeout=TIMEOUT)
def test_spatial_patterns_2d_mesh() -> None:
    import torch_patterns as tp
    from torch.distributed.tensor import Shard

    _setup()
    layouts = [(Shard(2), Shard(3))]
    cases = tp.conv_cases(layouts) + tp.conv_1d_3d_cases(2) + tp.interpolate_cases(layouts)
    _check(cases + tp.pool_cases(layouts) + tp.pad_cases(layouts), (2, 2))


@pytest.mark.ranks(2, 4, timeout=TIMEOUT)
def test_upsampling_interpolate_pool_pad(world_size: int) -> None:
    """torch's math-ops upsampling pattern, then interpolation, pooling and padding on
    spatially sharded inputs."""
    import torch_patterns as tp
    from torch.distributed.tensor import Shard

    _setup()
    layouts = [(Shard(2),), (Shard(3),)]
    cases = tp.upsampling_pattern_cases(1) + tp.interpolate_cases(layouts)
    cases += tp.pool_cases(layouts) + tp.pad_cases(layouts)
    _check(cases, (world_size,))


@pytest.mark.ranks(2, 4, timeout=TIMEOUT)
def test_torch_ops_on_conv_outputs(world_size: int) -> None:
    import torch_patterns as tp
    from torch.distributed.tensor import Shard

    _setup()
    _check(tp.conv_then_torch_ops_cases((Shard(2),)), (world_size,))


@pytest.mark.ranks(2, 4, timeout=TIMEOUT)
def test_sdpa_sequence_sharded(world_size: int) -> None:
    import torch_patterns as tp

    _setup()
    _check(tp.sdpa_cases(1) + tp.flex_cases() + tp.dt_cp_flex_cases(), (world_size,))


@pytest.mark.ranks(2, timeout=TIMEOUT)
def test_flex_attention_without_block_mask() -> None:
    import torch_patterns as tp

    _setup()
    _check(tp.flex_cases(with_default_mask=True)[1:], (2,))


@pytest.mark.ranks(4, timeout=TIMEOUT)
def test_sdpa_sequence_and_batch_sharded_2d_mesh() -> None:
    import torch_patterns as tp

    _setup()
    _check(tp.sdpa_cases(2), (2, 2))


@pytest.mark.ranks(2, 4, timeout=TIMEOUT)
def test_tp_examples(world_size: int) -> None:
    """torch's test_tp_examples: colwise/rowwise MLP and attention, three SGD steps,
    outputs and parameters equal one process (dt-symm-mem and dt-cp installed)."""
    import torch_patterns as tp
    from dt_core.testing import cpu_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    _setup()
    problems = []
    mesh = cpu_mesh((world_size,))
    for seed, example in enumerate(tp.tp_models()):
        reference = tp.seeded_model(example.make)
        parallel = parallelize_module(tp.clone(reference), mesh, example.plan())
        inputs, grads = tp.tp_data(example.shape, steps=3, seed=100 + 10 * seed)
        ref_outs = tp.train_reference(reference, inputs, grads)
        xs = [tp.tp_input(example, x, mesh) for x in inputs]
        outs = tp.train_parallel(parallel, xs, grads)
        params = tp.parallel_params(parallel)
        problems += tp.training_differences(example.name, reference, ref_outs, outs, params, 1)
    assert not problems, "\n".join(problems)


@pytest.mark.ranks(2, timeout=TIMEOUT)
def test_downsampling_conv_training() -> None:
    """torch's downsampling-conv training loop on the last dim, as torch's test shards it."""
    import torch
    import torch_patterns as tp
    from dt_core.testing import cpu_mesh
    from torch.distributed.tensor import Shard, distribute_module, distribute_tensor

    _setup()
    mesh = cpu_mesh((2,))
    reference = tp.seeded_model(lambda: torch.nn.Conv2d(3, 8, kernel_size=4, stride=4))
    parallel = distribute_module(tp.clone(reference), mesh)
    inputs, _ = tp.tp_data((2, 3, 16, 24), steps=3, seed=200)
    grads = [tp.randn(2, 8, 4, 6, seed=300 + i) for i in range(3)]
    ref_outs = tp.train_reference(reference, inputs, grads)
    sharded_inputs = [distribute_tensor(x, mesh, [Shard(3)]) for x in inputs]
    outs = tp.train_parallel(parallel, sharded_inputs, grads)
    params = tp.parallel_params(parallel)
    problems = tp.training_differences("conv training", reference, ref_outs, outs, params, 1)
    assert not problems, "\n".join(problems)


@pytest.mark.ranks(2, timeout=TIMEOUT)
def test_bad_arguments_and_torch_alone() -> None:
    """Arguments torch refuses raise torch's error on every rank (no rank left waiting),
    with the plugins and without. With the plugins deactivated torch's own answers stay
    (the upsampling pattern) and so does its refusal (SDPA on a sharded sequence on CPU),
    which the plugins, back on, compute exactly."""
    import dt_core
    import torch_patterns as tp
    from dt_core.testing import cpu_mesh
    from torch.distributed.tensor import Shard

    _setup()
    mesh = cpu_mesh((2,))
    problems = []
    cases = tp.bad_input_cases((Shard(2),))
    for off in (False, True):
        for case in cases:
            want = tp.raised(case, None)
            with tp.plugins_off() if off else contextlib.nullcontext():
                got = tp.raised(case, mesh)
            # torch alone words a shape as torch.Size([..]): compare up to the values
            if problem := tp.same_error(want, got, prefix=40 if off else None):
                problems.append(f"{case.name} (plugins {'off' if off else 'on'}): {problem}")
    sdpa = tp.sdpa_cases(1)[0]
    with tp.plugins_off():
        problems += tp.check_all_here(tp.upsampling_pattern_cases(1), mesh, 1, torch_alone=True)
        refused = tp.raised(sdpa, mesh)
        if not isinstance(refused, NotImplementedError):
            problems.append(f"torch alone: {sdpa.name} raised {refused!r}")
    assert dt_core.is_active()
    problems += tp.check_here(sdpa, mesh, 1)[0]
    assert not problems, "\n".join(problems)
