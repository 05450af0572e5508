"""simple_fsdp trains like the unsharded model, eager and compiled, with bucketed collectives.

Each rank body compiles once (fwd + bwd) and runs several checks: numerics against the
unsharded model (losses and parameters after a few steps), the collective counts the
passes report before and after bucketing, and the counts in Inductor's generated code.
FX graph / AOTAutograd caches are off inside the bodies so the passes always run.
"""

from __future__ import annotations

import math

import pytest

TOL = 2e-6  # fp32: reduction order differs between sharded and unsharded math


def _records(kind: str) -> list[dict]:
    from dt_fsdp_passes.passes import pass_log

    return [r for r in pass_log() if r["pass"] == kind]


def _mlp_size_buckets() -> dict:
    import dt_fsdp_passes
    import torch
    from dt_core.testing import cpu_mesh
    from dt_core.testing.compiled import compile_caches, run_and_get_code
    from dt_fsdp_passes.models import MLP, mse, train_and_compare, twin
    from dt_fsdp_passes.passes import clear_pass_log, counters

    torch._dynamo.reset()
    clear_pass_log()
    counted_from = counters.snapshot()
    width, depth = 16, 6
    cap_mb = 2 * width * width * 4 / 2**20  # two weights per bucket
    dt_fsdp_passes.configure(mode="size", bucket_cap_mb=cap_mb, overlap=True)
    torch.manual_seed(0)
    reference = MLP(width, depth)
    sharded = dt_fsdp_passes.simple_fsdp(
        twin(reference), cpu_mesh(torch.distributed.get_world_size())
    )
    compiled = torch.compile(sharded)
    batches = [(torch.randn(8, width), torch.randn(8, width)) for _ in range(3)]
    codes: list[str] = []

    def run(x: torch.Tensor) -> torch.Tensor:
        if codes:
            return compiled(x)
        out, code = run_and_get_code(lambda: compiled(x))
        codes.extend(code)
        return out

    try:
        with compile_caches(False):
            errors = train_and_compare(
                reference, sharded, run, batches, mse, lambda p: torch.optim.AdamW(p, lr=1e-2)
            )
    finally:
        dt_fsdp_passes.configure(reset=True)
    code = "\n".join(codes)
    calls = [
        line.strip()
        for line in code.splitlines()
        if "all_gather_into_tensor.default(" in line or "extern_kernels.mm(" in line
        if "assert" not in line
    ]
    return {
        "calls": calls,
        "errors": errors,
        "bucket": _records("bucket"),
        "overlap": _records("overlap"),
        "counters": counters.changes(counted_from),
        "code_all_gathers": code.count("= torch.ops._c10d_functional.all_gather_into_tensor."),
        "code_reduce_scatters": code.count("= torch.ops._c10d_functional.reduce_scatter_tensor."),
    }


@pytest.mark.ranks(2, timeout=300)
def test_compiled_mlp_buckets_by_size_and_matches_unsharded() -> None:
    result = _mlp_size_buckets()
    assert result["errors"]["loss"] < TOL and result["errors"]["params"] < TOL, result["errors"]
    forward, backward = result["bucket"][:2]
    depth = 6
    assert forward["all_gather_before"] == depth
    assert forward["all_gather_after"] == math.ceil(depth * 1024 / 2048) == 3
    # reshard_after_forward: backward gathers again (all weights but the first layer's).
    assert backward["all_gather_before"] == depth - 1
    assert backward["reduce_scatter_before"] == depth
    assert backward["reduce_scatter_after"] == 3
    # dt-core counters (`dt-plugins stats`): one forward and one backward graph.
    counted = result["counters"]
    assert counted["bucket_pass_runs"] == 2 and counted["overlap_pass_runs"] == 2, counted
    assert counted["reduce_scatters_merged"] == depth - 3, counted
    assert counted["all_gathers_merged"] == (depth - 3) + (
        backward["all_gather_before"] - backward["all_gather_after"]
    )
    assert counted["graphs_reordered_for_overlap"] == 2, counted
    assert all(r["overlap_applied"] for r in result["overlap"][:2]), result["overlap"]
    # The generated forward code issues exactly the bucketed all-gathers.
    assert result["code_all_gathers"] == 3, result
    assert result["code_reduce_scatters"] == 0, result
    # Overlap survives Inductor's scheduler: bucket 2 is gathered before bucket 1's matmuls.
    kinds = ["ag" if "all_gather" in c else "mm" for c in result["calls"]]
    assert kinds[:3] == ["ag", "ag", "mm"], result["calls"]


def _transformer_by_module() -> dict:
    import dt_fsdp_passes
    import torch
    from dt_core.testing import cpu_mesh
    from dt_core.testing.compiled import compile_caches
    from dt_fsdp_passes.models import Transformer, cross_entropy, train_and_compare, twin
    from dt_fsdp_passes.passes import clear_pass_log

    world = torch.distributed.get_world_size()
    mesh = cpu_mesh(world)
    torch.manual_seed(1)
    reference = Transformer()
    batches = [(torch.randint(0, 11, (4, 6)), torch.randint(0, 11, (4, 6))) for _ in range(3)]

    def sgd(p):
        return torch.optim.SGD(p, lr=0.5)

    # Eager simple_fsdp (no reshard) first: same numerics, no compiler involved.
    eager = dt_fsdp_passes.simple_fsdp(twin(reference), mesh, reshard_after_forward=False)
    eager_errors = train_and_compare(twin(reference), eager, eager, batches, cross_entropy, sgd)

    torch._dynamo.reset()
    clear_pass_log()
    dt_fsdp_passes.configure(reset=True)  # the default: mode="auto"
    sharded = dt_fsdp_passes.simple_fsdp(twin(reference), mesh)
    try:
        with compile_caches(False):
            errors = train_and_compare(
                reference, sharded, torch.compile(sharded), batches, cross_entropy, sgd
            )
    finally:
        dt_fsdp_passes.configure(reset=True)
    return {"eager": eager_errors, "compiled": errors, "bucket": _records("bucket")}


@pytest.mark.compile_heavy
@pytest.mark.ranks(2, timeout=300)
def test_transformer_eager_and_compiled_default_buckets_per_block() -> None:
    result = _transformer_by_module()
    for name in ("eager", "compiled"):
        errors = result[name]
        assert errors["loss"] < TOL and errors["params"] < TOL, (name, errors)
    forward, backward = result["bucket"][:2]
    assert forward["settings"]["mode"] == "auto"
    # One bucket per block; the small norm (16 floats) and head (99) share one, within the
    # largest block (a layer, 600 floats); embed (88) + layers.0 would not fit.
    blocks = [["embed"], ["layers.0"], ["layers.1"], ["head", "norm"]]
    assert forward["bucket_modules"] == blocks
    assert max(forward["all_gather_bucket_bytes"]) == 4 * 600
    assert forward["all_gather_before"] == 1 + 2 * 12 + 2 + 2  # embed, 2 blocks, norm, head
    assert forward["all_gather_after"] == len(blocks)
    assert backward["reduce_scatter_after"] == len(blocks)
    assert backward["reduce_scatter_before"] == forward["all_gather_before"]


def _uneven_four_ranks() -> dict:
    import dt_fsdp_passes
    import torch
    from dt_core.testing import cpu_mesh
    from dt_core.testing.compiled import compile_caches
    from dt_fsdp_passes.models import mse, train_and_compare, twin
    from dt_fsdp_passes.passes import clear_pass_log
    from torch import nn

    torch._dynamo.reset()
    clear_pass_log()
    torch.manual_seed(2)
    # 5, 3 and 2 rows over 4 ranks: uneven and empty shards, biases included.
    reference = nn.Sequential(
        nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3), nn.Tanh(), nn.Linear(3, 2)
    )
    sharded = dt_fsdp_passes.simple_fsdp(twin(reference), cpu_mesh(4))
    batches = [(torch.randn(8, 6), torch.randn(8, 2)) for _ in range(3)]
    dt_fsdp_passes.configure(mode="size", bucket_cap_mb=1.0, overlap=True)
    try:
        with compile_caches(False):
            errors = train_and_compare(
                reference,
                sharded,
                torch.compile(sharded),
                batches,
                mse,
                lambda p: torch.optim.SGD(p, lr=0.3, momentum=0.9),
            )
    finally:
        dt_fsdp_passes.configure(reset=True)
    return {"errors": errors, "bucket": _records("bucket")}


@pytest.mark.compile_heavy
@pytest.mark.ranks(4, timeout=300)
def test_uneven_shards_on_four_ranks_one_bucket_each_way() -> None:
    result = _uneven_four_ranks()
    assert result["errors"]["loss"] < TOL and result["errors"]["params"] < TOL, result["errors"]
    forward, backward = result["bucket"][:2]
    assert (forward["all_gather_before"], forward["all_gather_after"]) == (6, 1)
    assert (backward["reduce_scatter_before"], backward["reduce_scatter_after"]) == (6, 1)


def _mixed_precision() -> dict:
    import dt_fsdp_passes
    import torch
    from dt_core.testing import cpu_mesh
    from dt_core.testing.compiled import compile_caches
    from dt_fsdp_passes.models import MLP, mse, train_and_compare, twin
    from dt_fsdp_passes.passes import clear_pass_log

    torch._dynamo.reset()
    clear_pass_log()
    torch.manual_seed(3)
    reference = MLP(16, 3)
    policy = dt_fsdp_passes.MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    batches = [(torch.randn(8, 16), torch.randn(8, 16)) for _ in range(2)]

    def sgd(p):
        return torch.optim.SGD(p, lr=0.1)

    seen = {}
    eager = dt_fsdp_passes.simple_fsdp(twin(reference), cpu_mesh(2), mp_policy=policy)

    def record_dtype(module, inputs, output) -> None:
        seen.setdefault("dtype", output.dtype)

    eager.layers[0].register_forward_hook(record_dtype)
    eager_errors = train_and_compare(twin(reference), eager, eager, batches, mse, sgd)
    grad_dtypes = {p.dtype for p in eager.parameters()}
    compiled_model = dt_fsdp_passes.simple_fsdp(twin(reference), cpu_mesh(2), mp_policy=policy)
    dt_fsdp_passes.configure(mode="size", bucket_cap_mb=1.0)
    try:
        with compile_caches(False):
            errors = train_and_compare(
                twin(reference), compiled_model, torch.compile(compiled_model), batches, mse, sgd
            )
    finally:
        dt_fsdp_passes.configure(reset=True)
    state_e = dt_fsdp_passes.gathered_state(eager)
    state_c = dt_fsdp_passes.gathered_state(compiled_model)
    return {
        "eager": eager_errors,
        "compiled": errors,
        "eager_vs_compiled": max((state_e[k] - state_c[k]).abs().max().item() for k in state_e),
        "compute_dtype": str(seen["dtype"]),
        "param_dtypes": sorted(str(d) for d in grad_dtypes),
        "bucket": _records("bucket"),
    }


@pytest.mark.compile_heavy
@pytest.mark.ranks(2, timeout=300)
def test_mixed_precision_gathers_in_bf16_and_stays_close() -> None:
    result = _mixed_precision()
    assert result["compute_dtype"] == "torch.bfloat16"
    assert result["param_dtypes"] == ["torch.float32"]  # stored (and optimised) in fp32
    for name in ("eager", "compiled"):  # bf16 compute: loose against the fp32 model
        assert result[name]["loss"] < 3e-2 and result[name]["params"] < 3e-2, result
    assert result["eager_vs_compiled"] < 1e-2, result
    # The input-casting pre-hook compiles as its own small graph (no collectives).
    with_collectives = [r for r in result["bucket"] if r["all_gather_total_before"]]
    forward, backward = with_collectives
    assert (forward["all_gather_before"], forward["all_gather_after"]) == (3, 1)
    assert (backward["reduce_scatter_before"], backward["reduce_scatter_after"]) == (3, 1)
