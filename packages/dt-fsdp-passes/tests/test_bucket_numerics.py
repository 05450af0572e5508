"""Bucketed collectives return exactly what the per-parameter ones did (traced graphs, gloo).

Graphs are traced with make_fx (fake tensors, as Inductor's post-grad graphs carry), the
passes run on them, and the rewritten graph is executed on real per-rank data; expected
values come from plain torch (concatenation of every rank's shard; sum or mean of every
rank's gradient, chunked), not from the code under test.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# A case: (list of (rows per rank, trailing dims, dtype name)), cap in bytes, reduce op,
# overlap, mode. make_fx graphs carry no module structure, so mode "auto" (the default)
# must fall back to "size" with the same cap: the same bucket counts are expected.
_param = st.tuples(
    st.integers(1, 3),
    st.lists(st.integers(1, 3), min_size=0, max_size=2),
    st.sampled_from(["float32", "float32", "float64"]),
)
_case = st.tuples(
    st.lists(_param, min_size=1, max_size=5),
    st.sampled_from([1, 64, 200, 10**6]),
    st.sampled_from(["sum", "avg"]),
    st.booleans(),
    st.sampled_from(["size", "auto"]),
)


def _rank_shard(rank: int, index: int, shape: list[int], dtype: object) -> object:
    import torch

    gen = torch.Generator().manual_seed(1000 * rank + index)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def _run_case(case: tuple) -> dict:
    import dt_fsdp_passes
    import torch
    import torch.distributed as dist
    from dt_core.compat.tracing import run_ordered_graph
    from dt_fsdp_passes.graph_utils import ALL_GATHER, REDUCE_SCATTER, count_calls, topo_valid
    from dt_fsdp_passes.groups import mark_fsdp_group
    from dt_fsdp_passes.passes import bucket_pass, overlap_pass
    from torch.fx.experimental.proxy_tensor import make_fx

    params, cap_bytes, op, overlap, mode = case
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD.group_name
    mark_fsdp_group(group)  # hand-built graphs: no simple_fsdp registered the group
    c10d = torch.ops._c10d_functional
    dtypes = [getattr(torch, d) for _, _, d in params]
    shard_shapes = [[rows, *rest] for rows, rest, _ in params]
    full_shapes = [[rows * world, *rest] for rows, rest, _ in params]

    def gather_all(*shards: torch.Tensor) -> list[torch.Tensor]:
        outs = []
        for shard in shards:
            gathered = c10d.wait_tensor(c10d.all_gather_into_tensor(shard, world, group))
            outs.append(gathered * 2)  # a compute user, as a matmul would be
        return outs

    def scatter_all(*grads: torch.Tensor) -> list[torch.Tensor]:
        return [
            c10d.wait_tensor(c10d.reduce_scatter_tensor(g * 3, op, world, group)).view(-1)
            for g in grads
        ]

    shards = [
        _rank_shard(rank, i, s, d)
        for i, (s, d) in enumerate(zip(shard_shapes, dtypes, strict=True))
    ]
    grads = [
        _rank_shard(rank, 100 + i, s, d)
        for i, (s, d) in enumerate(zip(full_shapes, dtypes, strict=True))
    ]
    dt_fsdp_passes.configure(mode=mode, bucket_cap_mb=cap_bytes / 2**20, overlap=overlap)
    try:
        gm_ag = make_fx(gather_all, tracing_mode="fake")(*shards)
        gm_rs = make_fx(scatter_all, tracing_mode="fake")(*grads)
        counts = {}
        for name, gm in (("ag", gm_ag), ("rs", gm_rs)):
            bucket_pass(gm.graph)
            overlap_pass(gm.graph)
            gm.graph.lint()
            if not topo_valid(gm.graph.nodes):
                raise RuntimeError("graph no longer topologically valid")
            gm.recompile()
            counts[name] = count_calls(gm.graph, ALL_GATHER if name == "ag" else REDUCE_SCATTER)
        got_ag = run_ordered_graph(gm_ag, *shards)
        got_rs = run_ordered_graph(gm_rs, *grads)
    finally:
        dt_fsdp_passes.configure(reset=True)

    errors = []
    for i, d in enumerate(dtypes):
        every = [_rank_shard(r, i, shard_shapes[i], d) for r in range(world)]
        expected = torch.cat(every) * 2
        errors.append((got_ag[i] - expected).abs().max().item())
        if got_ag[i].shape != expected.shape:
            errors.append(float("inf"))
        total = sum(_rank_shard(r, 100 + i, full_shapes[i], d) * 3 for r in range(world))
        if op == "avg":
            total = total / world
        want = total.chunk(world)[rank].reshape(-1)
        # Relative to the magnitude: gloo's summation order differs from Python's sum.
        scale = max(1.0, want.abs().max().item())
        errors.append((got_rs[i] - want).abs().max().item() / scale)
    return {"max_error": max(errors), "counts": counts}


def _expected_buckets(params: list, cap_bytes: int, world: int, gathered: bool) -> int:
    """Greedy adjacent bucketing, written out independently for the check."""
    import math

    buckets, used, last_dtype = 0, 0, None
    for rows, rest, dtype in params:
        size = rows * world * math.prod(rest) * (8 if dtype == "float64" else 4)
        if buckets and dtype == last_dtype and used + size <= cap_bytes:
            used += size
        else:
            buckets, used = buckets + 1, size
        last_dtype = dtype
    return buckets


@pytest.mark.parametrize("world", [2, 4])
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=_case)
def test_bucketed_collectives_match_plain_torch(dist_world, world: int, case: tuple) -> None:
    results = dist_world(world).run(_run_case, case)
    params, cap_bytes = case[:2]
    expected = _expected_buckets(params, cap_bytes, world, gathered=True)
    for result in results:
        assert result["max_error"] < 1e-6, result
        assert result["counts"] == {"ag": expected, "rs": expected}, (result, expected)
