"""torch.compile(fullgraph=True) of sharded spatial ops equals the same ops on one process.

The halo exchange is made of functional collectives, so Dynamo and AOTAutograd trace
dt-conv's handlers with fake tensors and the compiled graph carries the exchange. Each
rank test compiles a few small models (compiling is slow on 2 cores) covering every op
kind; float64, forward and gradients of the input and every parameter.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from dt_core.testing import cpu_mesh


def compare(
    fn: Callable[..., torch.Tensor],
    mesh: Any,
    x: torch.Tensor,
    placements: list,
    params: list[torch.Tensor],
    backend: str = "aot_eager",
    param_placements: list[list] | None = None,
) -> None:
    """fn(x, *params) compiled with fullgraph on DTensors == eager fn on full tensors
    (values, output placements = input placements, every gradient)."""
    import torch._dynamo
    from torch.distributed.tensor import Replicate, distribute_tensor

    torch._dynamo.reset()
    ref = [t.clone().requires_grad_(True) for t in (x, *params)]
    expected = fn(*ref)
    gen = torch.Generator().manual_seed(7)
    g = torch.randn(expected.shape, generator=gen, dtype=expected.dtype)
    (expected * g).sum().backward()

    rep = [Replicate()] * mesh.ndim
    xd = distribute_tensor(x, mesh, placements).requires_grad_(True)
    layouts = param_placements or [rep] * len(params)
    pd = [
        distribute_tensor(p, mesh, pl).requires_grad_(True)
        for p, pl in zip(params, layouts, strict=True)
    ]
    got = torch.compile(fn, backend=backend, fullgraph=True)(xd, *pd)
    if any(p.is_partial() for p in got.placements):  # input-channel sharding: sum it
        got = got.redistribute(mesh, [Replicate() if p.is_partial() else p for p in got.placements])
    if param_placements is None:
        assert tuple(got.placements) == tuple(placements), got.placements
    gd = distribute_tensor(g, mesh, list(got.placements))
    (got * gd).sum().backward()
    torch.testing.assert_close(got.full_tensor(), expected, rtol=1e-9, atol=1e-9)
    for name, d, r in zip(["input"] + [f"param{i}" for i in range(len(params))], [xd, *pd], ref):
        assert d.grad is not None, name
        torch.testing.assert_close(d.grad.full_tensor(), r.grad, rtol=1e-9, atol=1e-9, msg=name)


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def small_net(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor):  # type: ignore[no-untyped-def]
    """The issue's net: 3x3 convs, ReLU, avg_pool2d, a dilated conv."""
    y = F.relu(F.conv2d(x, w1, padding=1))
    y = F.avg_pool2d(y, 2)
    y = F.relu(F.conv2d(y, w2, padding=2, dilation=2))
    return F.conv2d(y, w3, padding=1)


def two_convs(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor):  # type: ignore[no-untyped-def]
    """Two 3x3 convs and a ReLU: the least that shows overlap between layers."""
    return F.conv2d(F.relu(F.conv2d(x, w1, padding=1)), w2, padding=1)


def window_ops_2d(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor):  # type: ignore[no-untyped-def]
    """Every 2-D op kind: pad modes, conv, pooling, interpolation, transposed conv."""
    y = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="reflect"), w1)
    y = F.max_pool2d(torch.tanh(y), 3, stride=2, padding=1)
    y = F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False)
    y = F.pad(y, (2, 1, 1, 2), mode="replicate")
    y = F.conv_transpose2d(y, w2, stride=2, padding=1)
    y = F.avg_pool2d(F.pad(y, (0, 1, 1, 0), value=0.5), 2, ceil_mode=True)
    y = F.pad(y, (1, 1, 2, 2), mode="circular")
    y = F.interpolate(y, scale_factor=1.5, mode="bicubic")
    return F.interpolate(y, size=(9, 7), mode="nearest")


def ops_1d(x: torch.Tensor, w: torch.Tensor):  # type: ignore[no-untyped-def]
    y = F.conv1d(F.pad(x, (2, 2), mode="circular"), w, dilation=2)
    y = F.avg_pool1d(y, 3, stride=1, padding=1, count_include_pad=False)
    y = F.max_pool1d(y, 2)
    return F.interpolate(y, scale_factor=3, mode="linear", align_corners=True)


def ops_3d(x: torch.Tensor, w: torch.Tensor):  # type: ignore[no-untyped-def]
    y = F.conv3d(x, w, padding=1, stride=(1, 2, 1))
    y = F.max_pool3d(y, 2, ceil_mode=True)
    return F.interpolate(y, scale_factor=2, mode="trilinear")


def channel_conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor):  # type: ignore[no-untyped-def]
    return F.conv2d(x, w, b, padding=1)


def transposed(x: torch.Tensor, w: torch.Tensor):  # type: ignore[no-untyped-def]
    return F.conv_transpose2d(x, w, stride=2, padding=1)


@pytest.mark.ranks(2, timeout=600)  # compiles ~20 graphs: minutes on a loaded host
def test_every_op_kind_compiles_fullgraph_on_2_ranks() -> None:
    """Uneven shards (11 rows on 2 ranks), 1-D, 2-D and 3-D ops, every pad mode,
    pooling, interpolation, transposed conv; channel-sharded convs; a fallback."""
    from torch.distributed.tensor import Replicate, Shard

    torch.set_num_threads(1)
    mesh = cpu_mesh(2)
    net_params = [
        _randn(4, 3, 3, 3, seed=1),
        _randn(4, 4, 3, 3, seed=2),
        _randn(2, 4, 3, 3, seed=3),
    ]
    compare(small_net, mesh, _randn(2, 3, 12, 10), [Shard(3)], net_params)
    ops_params = [_randn(3, 2, 3, 3, seed=4), _randn(3, 2, 4, 4, seed=5)]
    for placements in ([Shard(2)], [Shard(3)]):
        compare(window_ops_2d, mesh, _randn(1, 2, 11, 9), placements, ops_params)
    compare(ops_1d, mesh, _randn(2, 2, 13), [Shard(2)], [_randn(3, 2, 3, seed=6)])
    compare(ops_3d, mesh, _randn(1, 2, 5, 7, 6), [Shard(3)], [_randn(2, 2, 3, 3, 3, seed=7)])
    # output-channel sharded weight and bias: the output is channel sharded (no halo);
    # the local backward's bias sizes are the local channels (traced kernels use them)
    compare(
        channel_conv,
        mesh,
        _randn(1, 3, 6, 5),
        [Replicate()],
        [_randn(4, 3, 3, 3, seed=8), _randn(4, seed=9)],
        param_placements=[[Shard(0)], [Shard(0)]],
    )
    # a fallback (transposed conv on channel-sharded input: replicated, exact) traces too
    compare(transposed, mesh, _randn(1, 4, 5, 6), [Shard(1)], [_randn(4, 3, 3, 3, seed=12)])
    # input-channel sharded input and weight: per-rank partial sums (Partial output)
    compare(
        channel_conv,
        mesh,
        _randn(1, 4, 6, 5),
        [Shard(1)],
        [_randn(3, 4, 3, 3, seed=10), _randn(3, seed=11)],
        param_placements=[[Shard(1)], [Replicate()]],
    )


@pytest.mark.compile_heavy
@pytest.mark.ranks(2, timeout=900)
def test_inductor_compiles_the_sharded_ops() -> None:
    """Every 2-D op kind through Inductor on uneven shards (9 columns on 2 ranks): values
    and gradients, and both convs, plain and transposed, overlap an exchange forward and
    backward. (Overlap between conv layers is checked on both mesh dims by the 2x2 test.)"""
    from torch.distributed.tensor import Shard

    torch.set_num_threads(1)
    mesh = cpu_mesh(2)
    ops_params = [_randn(3, 2, 3, 3, seed=4), _randn(3, 2, 4, 4, seed=5)]
    lines = _inductor_lines(
        compare, window_ops_2d, mesh, _randn(1, 2, 11, 9), [Shard(3)], ops_params
    )
    # a weight gradient is computed while its conv's input-gradient halo travels home;
    # convolution_backward's `transposed` argument is followed by output_padding, which
    # Inductor prints as a tuple (a list on torch 2.11)
    backward = _during_exchange(lines, BACKWARD_CALL)
    for transposed in (False, True):
        called = re.compile(rf", {transposed}, [(\[]")
        assert [ln for ln in backward if called.search(ln)], "\n".join(lines)
    # the interior is computed while the halo arrives
    forward = _during_exchange(lines, FORWARD_CALL)
    for transposed in (False, True):
        assert [ln for ln in forward if f"transposed={transposed}" in ln], "\n".join(lines)


@pytest.mark.compile_heavy
@pytest.mark.ranks(4, timeout=900)
def test_2x2_mesh_compiles_fullgraph() -> None:
    """The issue's case: H over mesh dim 0, W over mesh dim 1, and each alone; uneven
    (values and gradients through aot_eager); Inductor's values and overlap on both
    dims."""
    from torch.distributed.tensor import Replicate, Shard

    torch.set_num_threads(1)
    mesh = cpu_mesh((2, 2))
    params = [_randn(4, 3, 3, 3, seed=1), _randn(4, 4, 3, 3, seed=2), _randn(2, 4, 3, 3, seed=3)]
    x = _randn(1, 3, 13, 10)
    for placements in ([Shard(2), Shard(3)], [Shard(2), Replicate()], [Replicate(), Shard(3)]):
        compare(small_net, mesh, x, placements, params)
    # Inductor on an even image, 12 x 12, whose ranks share more kernel shapes (uneven
    # 13 x 10 made the 4 ranks compile 152 kernels for small_net against 73: 180 s against
    # 121 s on 2 cores, cold), and on two convs (57 kernels, 32 s less than small_net);
    # uneven shards through Inductor: the 2-rank test above.
    lines = _inductor_lines(
        compare, two_convs, mesh, _randn(1, 3, 12, 12), [Shard(2), Shard(3)], [params[0], params[2]]
    )
    # Forward: each conv (6 x 6 per rank) computes its interior during H's exchange and
    # H's seam rows during W's (measured: 6 convs). Backward: weight-gradient blocks
    # travel with both of each conv's gradient exchanges home, 2 layers x 2 dims
    # (measured: 8 exchanges busy; the input halos are the forward's, kept by Inductor).
    assert len(_during_exchange(lines, FORWARD_CALL)) >= 4, "\n".join(lines)
    assert len(_exchanges_busy_with(lines, BACKWARD_CALL)) >= 4, "\n".join(lines)
    ops_params = [_randn(3, 2, 3, 3, seed=4), _randn(3, 2, 4, 4, seed=5)]
    compare(window_ops_2d, mesh, _randn(1, 2, 11, 9), [Shard(3), Shard(2)], ops_params)


def _code_lines(codes: list[str]) -> list[str]:
    """Inductor's generated code without its comments (they name source ops too)."""
    return [ln for c in codes for ln in c.splitlines() if not ln.strip().startswith("#")]


def _first(lines: list[str], text: str, after: int = -1) -> int:
    return next(i for i, ln in enumerate(lines) if i > after and text in ln)


BACKWARD_CALL = "= torch.ops.aten.convolution_backward.default("
FORWARD_CALL = "= extern_kernels.convolution("
_START = re.compile(r"\s*(\w+) = torch\.ops\._c10d_functional\.all_to_all_single\.default\(")
_WAIT = re.compile(r"_c10d_functional\.wait_tensor\.default\((\w+)\)")


def _inductor_lines(check: Callable[..., None], *args: Any) -> list[str]:
    """Inductor's code (forward and backward) for `check(*args, backend="inductor")`."""
    from dt_core.testing.compiled import run_and_get_code

    _, codes = run_and_get_code(lambda: check(*args, backend="inductor"))
    return _code_lines(codes)


def _exchanges_busy_with(lines: list[str], call: str) -> set[str]:
    """The halo all-to-alls in Inductor's code during which some line calls `call`."""
    in_flight: set[str] = set()
    busy: set[str] = set()
    for ln in lines:
        if start := _START.match(ln):
            in_flight.add(start.group(1))
        elif wait := _WAIT.search(ln):
            in_flight.discard(wait.group(1))
        elif call in ln:
            busy |= in_flight
    return busy


def _during_exchange(lines: list[str], call: str) -> list[str]:
    """The lines calling `call` while a halo all-to-all is in flight (started, not
    yet waited for) in Inductor's code."""
    in_flight: set[str] = set()
    found = []
    for ln in lines:
        if start := _START.match(ln):
            in_flight.add(start.group(1))
        elif wait := _WAIT.search(ln):
            in_flight.discard(wait.group(1))
        elif call in ln and in_flight:
            found.append(ln)
    return found


@pytest.mark.compile_heavy
@pytest.mark.ranks(2, timeout=900)
def test_compiled_code_waits_for_the_halo_after_the_interior_conv() -> None:
    """Overlap survives compilation: the exchange starts, the local conv runs, then the
    wait, then only the seam rows are recomputed (dt-conv's start/wait order)."""
    from dt_core.testing.compiled import run_and_get_code
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.set_num_threads(1)
    torch._dynamo.reset()
    mesh = cpu_mesh(2)
    x, w = _randn(1, 2, 16, 8), _randn(3, 2, 3, 3, seed=1)
    xd = distribute_tensor(x, mesh, [Shard(2)])
    wd = distribute_tensor(w, mesh, [Replicate()])
    fn = torch.compile(lambda a, b: F.conv2d(a, b, padding=1), backend="inductor", fullgraph=True)
    with torch.no_grad():
        out, codes = run_and_get_code(fn, xd, wd)
    torch.testing.assert_close(out.full_tensor(), F.conv2d(x, w, padding=1))
    lines = _code_lines(codes)
    start = _first(lines, "_c10d_functional.all_to_all_single.default(")
    interior = _first(lines, "extern_kernels.convolution(", start)
    wait = _first(lines, "_c10d_functional.wait_tensor.default(", start)
    seam = _first(lines, "extern_kernels.convolution(", wait)
    assert start < interior < wait < seam, "\n".join(lines[start : seam + 1])


@pytest.mark.ranks(2, timeout=600)
def test_bad_arguments_make_fx_and_tracing_detection() -> None:
    """Under torch.compile a bad conv raises torch's own eager message on every rank (and
    no collective is left waiting); make_fx traces a sharded layer written over local
    tensors (DTensor.from_local ... to_local) into a graph holding the exchange, which
    reruns exactly on new data; dt-core's is_tracing sees fake DTensors only."""
    import re

    import torch.distributed as dist
    from dt_core.tracing import is_tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.fx.experimental.proxy_tensor import make_fx

    torch.set_num_threads(1)
    torch._dynamo.reset()
    mesh = cpu_mesh(2)
    x, bad_w = _randn(1, 2, 10, 9), _randn(3, 5, 3, 3, seed=1)
    with pytest.raises(RuntimeError) as eager:
        F.conv2d(x, bad_w)
    xd = distribute_tensor(x, mesh, [Shard(2)])
    bad = distribute_tensor(bad_w, mesh, [Replicate()])
    compiled = torch.compile(lambda a, b: F.conv2d(a, b), backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match=re.escape(str(eager.value))):
        compiled(xd, bad)
    dist.barrier()

    w = _randn(3, 2, 3, 3, seed=2)

    def layer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = F.max_pool2d(torch.tanh(F.conv2d(a, b, padding=1)), 2)
        return F.interpolate(y, scale_factor=2, mode="bilinear")

    def over_locals(xl: torch.Tensor, wl: torch.Tensor) -> torch.Tensor:
        a = DTensor.from_local(xl, mesh, [Shard(2)], run_check=False)
        b = DTensor.from_local(wl, mesh, [Replicate()], run_check=False)
        return layer(a, b).to_local()

    graph = make_fx(over_locals, tracing_mode="fake")(xd.to_local(), w)
    assert "all_to_all_single" in graph.code
    x2 = _randn(1, 2, 10, 9, seed=3)
    x2d = distribute_tensor(x2, mesh, [Shard(2)])
    got = DTensor.from_local(graph(x2d.to_local(), w), mesh, [Shard(2)], run_check=False)
    torch.testing.assert_close(got.full_tensor(), layer(x2, w))

    assert not is_tracing(xd)
    fake = FakeTensorMode().from_tensor(xd)
    assert isinstance(fake, DTensor) and is_tracing(fake)
