"""The Inductor pass: all_gather -> mm and mm -> reduce_scatter of a CPU gloo group, as
torch.compile sees them (functional collectives), become symm_mem fused ops that run
on our CPU kernels, with the same numbers as eager."""

from __future__ import annotations

import pytest
import torch


def _dim_1_gather(group: object):
    """An all-gather along dim 1 as torch.compile sees it: funcol's own where Dynamo traces
    it; on torch 2.12, whose Dynamo refuses funcol's chunk-cat helper for a dim other than
    0 ("Attempted to call function marked as skipped", torch alone too), the same split +
    cat written out, which is the graph funcol's gives on the releases that trace it."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    def by_funcol(t: torch.Tensor) -> torch.Tensor:
        return funcol.all_gather_tensor(t, 1, group)

    def written_out(t: torch.Tensor) -> torch.Tensor:
        gathered = funcol.all_gather_tensor(t, 0, group)
        return torch.cat(torch.chunk(gathered, dist.get_world_size(group), dim=0), dim=1)

    torch._dynamo.reset()
    try:
        torch.compile(by_funcol, backend="eager", fullgraph=True)(torch.ones(2, 2))
    except torch._dynamo.exc.Unsupported:
        return written_out
    return by_funcol


@pytest.mark.ranks(2, timeout=600)
def test_compiled_graph_uses_fused_ops_with_equal_numerics() -> None:
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    import torch.distributed._symmetric_memory  # noqa: F401  (defines torch.ops.symm_mem.*)
    from dt_symm_mem import ops

    group = dist.group.WORLD
    rank = dist.get_rank()

    gather_dim_1 = _dim_1_gather(group)

    def layer(
        x: torch.Tensor, y: torch.Tensor, B1: torch.Tensor, B2: torch.Tensor, W: torch.Tensor
    ):
        rows = funcol.all_gather_tensor(x, 0, group)  # gather dim 0, two consumers
        cols = gather_dim_1(y)  # gather dim 1 (split + cat)
        h = torch.relu(rows @ B1) + rows @ B2
        out = funcol.reduce_scatter_tensor(h @ W, "sum", 0, group)
        return out, cols @ B1

    gen = torch.Generator().manual_seed(rank)
    x = torch.randint(-2, 3, (4, 8), generator=gen).float()
    y = torch.randint(-2, 3, (2, 4, 8), generator=gen).float()
    B1, B2 = torch.randint(-2, 3, (8, 8)).float(), torch.ones(8, 8)
    W = torch.randint(-2, 3, (8, 6), generator=torch.Generator().manual_seed(3)).float()
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    before = ops.counters.snapshot()
    got = compiled(x, y, B1, B2, W)
    calls = ops.counters.changes(before)
    assert calls.get("fused_all_gather_matmul") == 2, calls
    assert calls.get("fused_matmul_reduce_scatter") == 1, calls
    want = layer(x, y, B1, B2, W)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and torch.equal(g, w)


@pytest.mark.ranks(2, timeout=600)
def test_fused_ops_called_directly_trace_under_compile() -> None:
    """dt_symm_mem.* and torch.ops.symm_mem.* inside a compiled function, fused and
    low-contention ops: one opaque op each (traced with torch's Meta kernels, lowered by
    Inductor), run by our CPU kernels."""
    import dt_symm_mem
    import torch.distributed as dist
    from dt_symm_mem import ops

    group = dist.group.WORLD
    rank = dist.get_rank()

    def block(x: torch.Tensor, B: torch.Tensor) -> tuple[torch.Tensor, ...]:
        A, (h,) = dt_symm_mem.fused_all_gather_matmul(x, [B], 1, group)
        y = torch.ops.symm_mem.fused_matmul_reduce_scatter(
            torch.relu(h), B.t(), "avg", 0, group.group_name
        )
        g = dt_symm_mem.low_contention_all_gather(y * 2, group)
        r = dt_symm_mem.low_contention_reduce_scatter(g + 1, "sum", group)
        return A.sum(-1), y, g, r

    x = torch.randint(-2, 3, (4, 2, 3), generator=torch.Generator().manual_seed(rank)).float()
    B = torch.randint(-2, 3, (3, 3)).float()
    torch._dynamo.reset()
    before = ops.counters.snapshot()
    got = torch.compile(block, fullgraph=True)(x, B)
    calls = ops.counters.changes(before)
    # The first op on these ranks also maps the group's workspace; which test runs first
    # on a shared world is up to the scheduler, so that counter is not part of the check.
    calls.pop("workspace_segments", None)
    assert calls == {
        "fused_all_gather_matmul": 1,
        "fused_matmul_reduce_scatter": 1,
        "low_contention_all_gather": 1,
        "low_contention_reduce_scatter": 1,
    }, calls
    want = block(x, B)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and torch.equal(g, w)


@pytest.mark.ranks(2, timeout=600)
def test_scaled_ops_trace_with_torchs_meta_kernels() -> None:
    """The float8 scaled variants through the API inside torch.compile (AOT tracing with
    fake tensors, i.e. torch's Meta kernels; no Inductor: CPU _scaled_mm has no Inductor
    lowering worth testing here) run our CPU kernels and equal eager."""
    import dt_symm_mem
    import torch.distributed as dist
    from dt_symm_mem import ops

    group = dist.group.WORLD
    rank = dist.get_rank()
    fp8 = torch.float8_e4m3fn

    def block(x: torch.Tensor, B: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        A, (h,) = dt_symm_mem.fused_all_gather_scaled_matmul(
            x, [B], s, [s], 0, group, out_dtypes=[torch.bfloat16]
        )
        y = dt_symm_mem.fused_scaled_matmul_reduce_scatter(
            x, B, s, s, "sum", -1, group, out_dtype=torch.float32
        )
        return A.float(), h, y

    gen = torch.Generator().manual_seed(rank)
    x = torch.randint(-2, 3, (2, 4, 16), generator=gen).float().to(fp8)
    B = torch.randint(-2, 3, (16, 32)).float().to(fp8).t().contiguous().t()  # Meta: 16 | dims
    s = torch.tensor(0.5)
    torch._dynamo.reset()
    before = ops.counters.snapshot()
    got = torch.compile(block, backend="aot_eager", fullgraph=True)(x, B, s)
    calls = ops.counters.changes(before)
    calls.pop("workspace_segments", None)  # mapped by whichever test runs first
    assert calls == {"fused_all_gather_scaled_matmul": 1, "fused_scaled_matmul_reduce_scatter": 1}
    want = block(x, B, s)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype and torch.equal(g, w)


@pytest.mark.ranks(2, timeout=600)
def test_reduce_scatter_of_summed_matmuls_fuses_into_one_fused_op() -> None:
    """SwiGLU's and q/k/v's input gradients: `A1 @ B1 + A2 @ B2 (+ A3 @ B3)` summed before
    the reduce-scatter. Each sum becomes one `fused_matmuls_reduce_scatter` (2-D and
    torch's N-D reshape form, three and two terms); a sum whose matmul is used elsewhere, one
    that broadcasts a term over rows and one mixing dtypes stay as they were.
    Integer-valued inputs: every result equals eager exactly."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from dt_symm_mem import ops

    group = dist.group.WORLD
    rank = dist.get_rank()

    def grads(a, b, c, x, y, B1, B2, B3):  # type: ignore[no-untyped-def]
        flat = a @ B1 + b @ B2 + c @ B3  # 2-D, three terms, scatter dim 0
        seq = x @ B1 + y @ B2  # N-D [2, 4, 6], scatter dim 1
        kept = a @ B2
        shared = funcol.reduce_scatter_tensor(kept + b @ B1, "sum", 0, group)
        # terms that must not be joined: one broadcast over rows, one in another dtype
        broadcast = funcol.reduce_scatter_tensor(b @ B1 + c[:1] @ B2, "sum", 0, group)
        mixed = funcol.reduce_scatter_tensor(a @ B3 + (b.double() @ B1.double()), "sum", 0, group)
        return (
            funcol.reduce_scatter_tensor(flat, "sum", 0, group),
            funcol.reduce_scatter_tensor(seq, "sum", 1, group),
            shared,
            kept,
            broadcast,
            mixed,
        )

    gen = torch.Generator().manual_seed(rank)

    def ints(*shape: int) -> torch.Tensor:
        return torch.randint(-2, 3, shape, generator=gen).float()

    a, b, c = ints(8, 5), ints(8, 5), ints(8, 5)
    x, y = ints(2, 4, 5), ints(2, 4, 5)
    weights = torch.Generator().manual_seed(7)
    B1, B2, B3 = (torch.randint(-2, 3, (5, 6), generator=weights).float() for _ in range(3))
    torch._dynamo.reset()
    before = ops.counters.snapshot()
    got = torch.compile(grads, fullgraph=True)(a, b, c, x, y, B1, B2, B3)
    calls = ops.counters.changes(before)
    assert calls.get("fused_matmuls_reduce_scatter") == 2, calls
    assert "fused_matmul_reduce_scatter" not in calls, calls  # the sums are never joined
    want = grads(a, b, c, x, y, B1, B2, B3)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and torch.equal(g, w)
    # The setting keeps the sums (and is part of the pass's cache key: a recompile).
    from dt_symm_mem.settings import settings

    torch._dynamo.reset()
    with settings.scoped(merge_summed_matmuls=False):
        before = ops.counters.snapshot()
        got = torch.compile(grads, fullgraph=True)(a, b, c, x, y, B1, B2, B3)
        calls = ops.counters.changes(before)
    assert not {"fused_matmul_reduce_scatter", "fused_matmuls_reduce_scatter"} & set(calls)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and torch.equal(g, w)


@pytest.mark.compile_heavy
@pytest.mark.ranks(2, timeout=600)
def test_swiglu_with_mismatched_shard_dims_compiles_to_one_process_values() -> None:
    """A SwiGLU block whose TP plan shards w1 by output columns but w3 by input rows (a
    plan mistake torch accepts: it redistributes between the two). Compiled with
    `_micro_pipeline_tp`, with the summed-matmul join on, forward and every gradient
    equal one process: a pass that fused across the mismatch would change them."""
    import torch.nn.functional as F
    from dt_core.testing import cpu_mesh
    from dt_symm_mem import ops
    from torch import nn
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    class SwiGLU(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1, self.w3 = nn.Linear(8, 16, bias=False), nn.Linear(8, 16, bias=False)
            self.w2 = nn.Linear(16, 8, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    torch.manual_seed(0)
    reference, model = SwiGLU(), SwiGLU()
    model.load_state_dict(reference.state_dict())
    mesh = cpu_mesh((2,), ("tp",))
    # DTensor outputs: the product of column shards and w3's replicated output is then
    # torch's to redistribute (as plain local tensors it is torch's own shape error)
    plan = {
        "w1": ColwiseParallel(input_layouts=Shard(1), use_local_output=False),
        "w3": RowwiseParallel(input_layouts=Shard(1), use_local_output=False),  # rows: the mismatch
        "w2": RowwiseParallel(output_layouts=Shard(1)),
    }
    parallelize_module(model, mesh, plan)
    x = torch.randn(2, 8, 8, generator=torch.Generator().manual_seed(1))
    rank = mesh.get_local_rank()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    with torch._inductor.config.patch(_micro_pipeline_tp=True):
        before = ops.counters.snapshot()
        out = compiled(x.chunk(2, dim=1)[rank].clone().requires_grad_())
        (out**2).sum().backward()
        calls = ops.counters.changes(before)
    want = reference(x)
    (want**2).sum().backward()
    assert calls, "the compiled block ran no dt-symm-mem op: the passes were not exercised"
    torch.testing.assert_close(out, want.chunk(2, dim=1)[rank], rtol=1e-5, atol=1e-5)
    references = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        ref = references[name]
        assert p.grad is not None and ref.grad is not None, name
        torch.testing.assert_close(p.grad.full_tensor(), ref.grad, rtol=1e-5, atol=1e-5)
