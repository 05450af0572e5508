"""The six symm_mem ops on CPU, through `torch.ops.symm_mem.*`, and dt-symm-mem's own
`dt_symm_mem::fused_matmuls_reduce_scatter`, against the plain collective + matmul
computed with gloo, on 2 and 4 ranks.

Inputs are small integers, so every product and sum is exact in fp32, bf16 and fp16 in
any order: results must be bitwise equal (torch.equal), not merely close. Output sizes
and strides must equal those of torch's own Meta kernels (Inductor asserts them). Each
rank test loops over many cases (one spawned world, many cases).
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
import torch

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def ints(shape: Any, seed: int, dtype: torch.dtype = torch.float32, low: int = -2) -> Any:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, 3, tuple(shape), generator=gen).to(dtype)


def gather(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Reference all-gather along `dim` with gloo (bytes, so any dtype works)."""
    import torch.distributed as dist

    raw = x.contiguous().view(-1).view(torch.uint8)
    parts = [torch.empty_like(raw) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, raw)  # torch's list form: the same name on every release
    return torch.cat([p.view(x.dtype).view(x.shape) for p in parts], dim=dim)


def reduce_scatter(x: torch.Tensor, reduce_op: str, dim: int) -> torch.Tensor:
    """Reference: gather every rank's full tensor, reduce in float64, take our chunk."""
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    everyone = gather(x.unsqueeze(0), 0).double()
    total = everyone.sum(0) if reduce_op == "sum" else everyone.mean(0)
    return total.chunk(world, dim=dim)[rank].to(x.dtype)


def same(got: torch.Tensor | None, want: torch.Tensor, meta: torch.Tensor | None = None) -> bool:
    if got is None or got.shape != want.shape or got.dtype != want.dtype:
        return False
    if meta is not None and (got.shape != meta.shape or got.stride() != meta.stride()):
        return False
    return torch.equal(got, want)


def check_all_gather_matmul(case: tuple, name: str) -> str | None:
    import torch.distributed as dist

    shape, gather_dim, n_b, dtype, return_A, seed = case
    rank, world = dist.get_rank(), dist.get_world_size()
    A = ints(shape, seed + rank, dtype)
    k = shape[-1] * (world if gather_dim == len(shape) - 1 else 1)
    Bs = [ints((k, 3 + i), seed + 100 + i, dtype) for i in range(n_b)]
    got_A, got = torch.ops.symm_mem.fused_all_gather_matmul(
        A, Bs, gather_dim, name, return_A=return_A
    )
    meta_A, meta = torch.ops.symm_mem.fused_all_gather_matmul(
        A.to("meta"), [B.to("meta") for B in Bs], gather_dim, name, return_A=return_A
    )
    full = gather(A, gather_dim)
    if return_A and not same(got_A, full, meta_A):
        return f"A differs: {case}"
    if not return_A and got_A is not None:
        return f"A returned although return_A=False: {case}"
    for i, B in enumerate(Bs):
        want = (full.double() @ B.double()).to(dtype)
        if not same(got[i], want, meta[i]):
            return f"output {i} differs: {case}"
    return None


def check_matmul_reduce_scatter(case: tuple, name: str) -> str | None:
    import torch.distributed as dist

    shape, scatter_dim, reduce_op, dtype, seed = case
    rank = dist.get_rank()
    A = ints(shape, seed + rank, dtype)
    B = ints((shape[-1], 8), seed + 50, dtype)
    got = torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, name)
    meta = torch.ops.symm_mem.fused_matmul_reduce_scatter(
        A.to("meta"), B.to("meta"), reduce_op, scatter_dim, name
    )
    want = reduce_scatter((A.double() @ B.double()).to(dtype), reduce_op, scatter_dim)
    return None if same(got, want, meta) else f"differs: {case}"


def check_summed_matmuls_reduce_scatter(case: tuple, name: str) -> str | None:
    """dt-symm-mem's own op (what its pass makes of a reduce-scatter of summed matmuls):
    three terms in fp32, two in the half types (sums stay exact integers there)."""
    import torch.distributed as dist

    shape, scatter_dim, reduce_op, dtype, seed = case
    rank = dist.get_rank()
    terms = 3 if dtype == torch.float32 else 2
    As = [ints(shape, seed + rank + 100 * t, dtype) for t in range(terms)]
    Bs = [ints((shape[-1], 8), seed + 50 + t, dtype) for t in range(terms)]
    op = torch.ops.dt_symm_mem.fused_matmuls_reduce_scatter
    got = op(As, Bs, reduce_op, scatter_dim, name)
    meta = op([a.to("meta") for a in As], [b.to("meta") for b in Bs], reduce_op, scatter_dim, name)
    total = sum(a.double() @ b.double() for a, b in zip(As, Bs, strict=True))
    want = reduce_scatter(total.to(dtype), reduce_op, scatter_dim)
    return None if same(got, want, meta) else f"summed differs: {case}"


def ag_cases(world: int, count: int) -> list[tuple]:
    rng = random.Random(world)  # same cases on every rank
    shapes = [(4, 8), (2, 3, 8), (1, 5), (3, 2, 2, 4)]
    cases = []
    for shape in shapes:
        for gather_dim in range(len(shape)):
            for dtype in DTYPES:
                cases.append((shape, gather_dim, rng.choice([1, 2, 3]), dtype, rng.random() < 0.5))
    rng.shuffle(cases)
    return [(*c, i) for i, c in enumerate(cases[:count])]


def rs_cases(world: int) -> list[tuple]:
    cases = []
    for (shape, dims), op, dtype in itertools.product(
        [((world * 2, 8), (0,)), ((world, world * 3, 4), (0, 1)), ((2, world, 6), (1,))],
        ["sum", "avg"],
        DTYPES,
    ):
        cases += [(shape, d, op, dtype, len(cases)) for d in dims]
    # scatter along the last (output) dim: B has 8 columns, 8 % world == 0
    cases += [((3, 5), 1, op, torch.float32, 900 + i) for i, op in enumerate(["sum", "avg"])]
    cases += [((2, 3, 5), 2, "sum", torch.bfloat16, 950)]
    return cases


# Shards without rows (or columns): empty results shaped as torch's, along every path (the
# kernels once inferred a size from an empty tensor and raised a reshape error).
EMPTY_AG = [
    ((0, 5), 0, 2, torch.float32, True, 990),
    ((2, 0, 4), 1, 1, torch.bfloat16, False, 991),
    ((2, 0, 4), 0, 1, torch.float32, True, 992),
    ((0, 3), 1, 1, torch.float32, True, 993),  # along K, the last dim
]
EMPTY_RS = [
    ((0, 8), 0, "sum", torch.float32, 994),
    ((2, 0, 6), 1, "avg", torch.float32, 995),
    ((0, 5), 1, "sum", torch.float32, 996),  # along the output columns
]


def check_random_floats(name: str) -> None:
    """Random (non-integer) inputs: equal to gather + matmul within torch's default
    tolerances for the dtype (chunked matmuls may round differently from one big one)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    for i, (dtype, gather_dim) in enumerate(
        itertools.product((torch.float32, torch.bfloat16), (0, 1, 2))
    ):
        gen = torch.Generator().manual_seed(1000 * i + rank)
        A = torch.randn(2, 4, 16, generator=gen).to(dtype)
        k = 16 * (world if gather_dim == 2 else 1)
        B = torch.randn(k, 8, generator=torch.Generator().manual_seed(i)).to(dtype)
        _, (C,) = torch.ops.symm_mem.fused_all_gather_matmul(A, [B], gather_dim, name)
        want = gather(A, gather_dim) @ B  # the plain collective + matmul, in the dtype
        torch.testing.assert_close(C, want, msg=f"all-gather-matmul {dtype} dim {gather_dim}")
        for scatter_dim in (0, 1, 2):
            A2 = torch.randn(world * 2, world, 16, generator=gen).to(dtype)
            got = torch.ops.symm_mem.fused_matmul_reduce_scatter(
                A2, B[:16], "sum", scatter_dim, name
            )
            want = reduce_scatter(A2 @ B[:16], "sum", scatter_dim)
            torch.testing.assert_close(got, want, msg=f"matmul-rs {dtype} dim {scatter_dim}")


def run_matmul_cases() -> None:
    import torch.distributed as dist
    import torch.distributed._symmetric_memory  # noqa: F401  (defines torch.ops.symm_mem.*)

    name = dist.group.WORLD.group_name
    world = dist.get_world_size()
    failures = [f for c in ag_cases(world, 48) if (f := check_all_gather_matmul(c, name))]
    failures += [f for c in EMPTY_AG if (f := check_all_gather_matmul(c, name))]
    failures += [f for c in rs_cases(world) if (f := check_matmul_reduce_scatter(c, name))]
    failures += [f for c in EMPTY_RS if (f := check_matmul_reduce_scatter(c, name))]
    failures += [f for c in rs_cases(world) if (f := check_summed_matmuls_reduce_scatter(c, name))]
    assert not failures, "\n".join(failures)
    check_random_floats(name)


@pytest.mark.ranks(2, 4)
def test_fused_matmul_ops() -> None:
    run_matmul_cases()


def run_low_contention_cases() -> None:
    import dt_symm_mem
    import torch.distributed as dist
    import torch.distributed._symmetric_memory  # noqa: F401  (defines torch.ops.symm_mem.*)

    name = dist.group.WORLD.group_name
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []
    for i, (rows, tail, dtype) in enumerate(
        itertools.product([world, 3 * world], [(), (5,), (2, 3)], [*DTYPES, torch.int64])
    ):
        x = ints((rows, *tail), 10 * i + rank, dtype)
        if not same(torch.ops.symm_mem._low_contention_all_gather(x, name), gather(x, 0)):
            failures.append(f"all_gather {x.shape} {dtype}")
        for op in ("sum", "avg") if dtype.is_floating_point else ("sum",):
            got = torch.ops.symm_mem._low_contention_reduce_scatter(x, op, name)
            if not same(got, reduce_scatter(x, op, 0)):
                failures.append(f"reduce_scatter {op} {x.shape} {dtype}")
    # the Python API with a preallocated output, and the group given as a ProcessGroup
    x = ints((3, 4), rank)
    out = torch.empty(3 * world, 4)
    returned = dt_symm_mem.low_contention_all_gather(x, dist.group.WORLD, out=out)
    if returned is not out or not same(out, gather(x, 0)):
        failures.append("all_gather out=")
    assert not failures, failures


@pytest.mark.ranks(2, 4)
def test_low_contention() -> None:
    run_low_contention_cases()


def check_python_api() -> None:
    import dt_symm_mem
    import torch.distributed as dist

    rank = dist.get_rank()
    A = ints((4, 6), rank)
    B = ints((6, 4), 7)
    A_full, (C,) = dt_symm_mem.fused_all_gather_matmul(A, [B], 0)
    assert torch.equal(A_full, gather(A, 0)) and torch.equal(C, gather(A, 0) @ B)
    rs = dt_symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 0, dist.group.WORLD)
    assert torch.equal(rs, reduce_scatter(A @ B, "sum", 0))
    got = dt_symm_mem.low_contention_reduce_scatter(A, "avg")
    assert torch.equal(got, reduce_scatter(A, "avg", 0))
    assert torch.equal(dt_symm_mem.low_contention_all_gather(A), gather(A, 0))


@pytest.mark.ranks(2)
def test_python_api_matches_ops() -> None:
    """dt_symm_mem.* (group as ProcessGroup, name or None) equal the reference, through
    torch.ops (plugin kernels installed) and directly (as when the plugin is disabled)."""
    from dt_symm_mem import api, ops

    before = ops.counters.snapshot()
    check_python_api()
    saved = api._cpu_kernel_installed
    api._cpu_kernel_installed = lambda _name: False
    try:
        check_python_api()
    finally:
        api._cpu_kernel_installed = saved
    calls = ops.counters.changes(before)
    assert calls["fused_all_gather_matmul"] == 2 and calls["low_contention_all_gather"] == 2


@pytest.mark.ranks(2)
def test_argument_errors_are_clear() -> None:
    import torch.distributed as dist
    import torch.distributed._symmetric_memory  # noqa: F401  (defines torch.ops.symm_mem.*)

    name = dist.group.WORLD.group_name
    A, B = torch.ones(4, 4), torch.ones(4, 4)
    with pytest.raises(ValueError, match="gather_dim"):
        torch.ops.symm_mem.fused_all_gather_matmul(A, [B], 2, name)
    with pytest.raises(ValueError, match="sum or avg"):
        torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "max", 0, name)
    with pytest.raises(ValueError, match="divisible"):
        torch.ops.symm_mem._low_contention_reduce_scatter(torch.ones(3, 2), "sum", name)
    with pytest.raises(NotImplementedError, match="float8"):
        torch.ops.symm_mem.fused_all_gather_scaled_matmul(
            A, [B], torch.ones(()), [torch.ones(())], 0, name, [None], [None], [None], [False]
        )


@pytest.mark.ranks(2)
def test_eager_calls_skip_the_dispatcher_and_tracers_see_the_op() -> None:
    """Plain CPU tensors run our kernel directly; traced calls (make_fx, real or fake)
    go through `torch.ops.symm_mem.*` as one node; inputs needing gradients are refused
    with an error that names the limitation."""
    import dt_symm_mem
    import torch.distributed as dist
    from dt_symm_mem import api
    from torch.fx.experimental.proxy_tensor import make_fx

    rank = dist.get_rank()
    A, B = ints((4, 6), rank), ints((6, 4), 7)
    expected = gather(A, 0) @ B

    def layer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return dt_symm_mem.fused_all_gather_matmul(a, [b], 0, return_A=False)[1][0]

    through_op = []
    saved = api._torch_op

    def recording(name: str) -> Any:
        through_op.append(name)
        return saved(name)

    api._torch_op = recording
    try:
        assert torch.equal(layer(A, B), expected) and through_op == []
        for mode in ("real", "fake"):
            graph = make_fx(layer, tracing_mode=mode)(A, B).graph
            targets = [str(n.target) for n in graph.nodes if n.op == "call_function"]
            assert "symm_mem.fused_all_gather_matmul.default" in targets, (mode, targets)
            assert not any("mm" in t.split(".")[1] for t in targets if t.startswith("aten.")), (
                mode,
                targets,
            )
        tracked = A.clone().requires_grad_(True)
        with pytest.raises(RuntimeError, match="no autograd formula.*torch.no_grad"):
            layer(tracked, B)
        with torch.no_grad():
            assert torch.equal(layer(tracked, B), expected)
    finally:
        api._torch_op = saved


@pytest.mark.ranks(4)
def test_matmul_reduce_scatter_holds_one_chunk_not_every_rank_s() -> None:
    """The fused matmul + reduce-scatter adds each peer's chunk as it reads it: what it
    allocates (torch's allocations on this rank; shared memory is not among them) stays
    near two chunks of the output, where stacking the P chunks first took P + 1."""
    import dt_symm_mem
    import torch.distributed as dist
    from dt_core.testing.memory import step_peak_bytes

    world, rank = dist.get_world_size(), dist.get_rank()
    A, B = ints((256 * world, 64), rank), ints((64, 1024), 7)
    chunk_bytes = 256 * 1024 * 4
    result: list[torch.Tensor] = []
    dt_symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 0, dist.group.WORLD)  # workspace
    peak = step_peak_bytes(
        lambda: result.append(
            dt_symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 0, dist.group.WORLD)
        )
    )
    assert torch.equal(result[0], reduce_scatter(A @ B, "sum", 0))
    assert peak < 2.5 * chunk_bytes, (peak, chunk_bytes)
