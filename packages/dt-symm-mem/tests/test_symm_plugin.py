"""Plugin wiring, the CUDA dispatch decision (mocked: no GPU here), the multi-host
fallback path, and the demo stage."""

from __future__ import annotations

from typing import Any

import pytest
import torch


@pytest.mark.window_ends  # what `import torch` pulls in: the window's ends
def test_import_torch_leaves_torchs_symm_mem_module_unimported() -> None:
    """The kernels wait for torch's own module instead of importing it (~30 ms on every
    `import torch`); a fresh interpreter with every plugin active shows it."""
    import subprocess
    import sys

    probe = (
        "import sys, torch, dt_core; "
        "assert 'symm-mem' in [p.name for p in dt_core.plugins() if p.state == 'active']; "
        "print('torch.distributed._symmetric_memory' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", out.stdout


def test_plugin_is_active_and_claims_the_cpu_kernels() -> None:
    import dt_core
    import torch.distributed._symmetric_memory  # noqa: F401  (defines torch.ops.symm_mem.*)
    from dt_symm_mem.plugin import KERNELS, OWN_OPS

    info = {p.name: p for p in dt_core.plugins()}["symm-mem"]
    assert info.state == "active", info
    cpu_kernels = {f"symm_mem::{name}@CPU" for name in KERNELS}
    cpu_kernels |= {f"dt_symm_mem::{name}" for name in OWN_OPS}  # its own summed op
    simulated = {f"symm_mem::{name}[LocalTensorMode]" for name in KERNELS}
    simulated |= {f"dt_symm_mem::{name}[LocalTensorMode]" for name in OWN_OPS}
    # LocalTensorMode rules are listed once torch's module for that mode was imported
    assert set(info.ops) in (cpu_kernels, cpu_kernels | simulated), info.ops
    for name in KERNELS:
        lines = torch._C._dispatch_dump(f"symm_mem::{name}").splitlines()
        keyed = {line.split(":", 1)[0]: line for line in lines if ":" in line}
        assert "dt_core" in keyed.get("CPU", ""), lines  # registered through dt-core's library
        # CPU only: torch's CUDA and Meta kernels stay torch's, nothing else is ours
        assert "dt_core" not in keyed["CUDA"] and "dt_core" not in keyed["Meta"], lines
        ours = [key for key, line in keyed.items() if "dt_core" in line]
        assert ours == ["CPU"], lines


class _FakeCuda:
    """A CPU tensor that reports a CUDA device (there is no GPU here): enough for the
    API's routing and the reshapes it applies before calling torch's kernel."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.device = torch.device("cuda", 0)
        self.shape = t.shape

    def dim(self) -> int:
        return self.t.dim()

    def numel(self) -> int:
        return self.t.numel()

    def reshape(self, *shape: Any) -> _FakeCuda:
        return _FakeCuda(self.t.reshape(*shape))

    def movedim(self, src: int, dst: int) -> _FakeCuda:
        return _FakeCuda(self.t.movedim(src, dst))


def _cuda(*shape: int) -> _FakeCuda:
    return _FakeCuda(torch.arange(float(torch.Size(shape).numel())).view(shape))


def _bind(op_name: str, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Bind a recorded call to torch's registered schema of symm_mem::<op_name>, failing
    on a wrong count, an unknown keyword, a keyword-only argument passed positionally or
    a missing required argument: the call's argument order is torch's."""
    from dt_symm_mem.compat import op_arguments

    spec = op_arguments(op_name)
    positional = [name for name, kw_only, _ in spec if not kw_only]
    assert len(args) <= len(positional), (op_name, len(args), positional)
    bound = dict(zip(positional, args, strict=False))
    known = {name for name, _, _ in spec}
    for key, value in kwargs.items():
        assert key in known and key not in bound, (op_name, key)
        bound[key] = value
    missing = [name for name, _, has_default in spec if name not in bound and not has_default]
    assert not missing, (op_name, missing)
    return bound


class _Recorder:
    """Stands in for torch.ops.symm_mem.<op> (CUDA kernels): records the bound call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.results: dict[str, Any] = {}

    def __call__(self, name: str) -> Any:
        def op(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, _bind(name, args, kwargs)))
            return self.results.get(name, f"{name}-result")

        return op


def test_cuda_tensors_go_to_torchs_symmetric_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each CUDA call reaches torch's op with torch's argument names, order and values."""
    from dt_symm_mem import api

    recorder = _Recorder()
    waited: list[Any] = []
    monkeypatch.setattr(api, "_torch_op", recorder)
    monkeypatch.setattr(api, "_wait", lambda t: waited.append(t) or ("waited", t))
    A, A3, B, B2 = _cuda(4, 8), _cuda(2, 4, 8), _cuda(8, 2), _cuda(8, 3)

    got = api.fused_all_gather_matmul(A3, [B, B2], -2, "tp", return_A=False)
    assert got == "fused_all_gather_matmul-result"
    assert recorder.calls[-1] == (
        "fused_all_gather_matmul",
        {"A": A3, "Bs": [B, B2], "gather_dim": 1, "group_name": "tp", "return_A": False},
    )
    assert api.fused_matmul_reduce_scatter(A, B, "avg", -1, "tp").startswith("fused_matmul")
    assert recorder.calls[-1] == (
        "fused_matmul_reduce_scatter",
        {"A": A, "B": B, "reduce_op": "avg", "scatter_dim": 1, "group_name": "tp"},
    )
    # low-contention ops run on torch's side stream: the API waits on their result
    assert api.low_contention_all_gather(A, "tp") == ("waited", "_low_contention_all_gather-result")
    assert recorder.calls[-1] == ("_low_contention_all_gather", {"tensor": A, "group_name": "tp"})
    got = api.low_contention_reduce_scatter(A, "avg", "tp")
    assert got == ("waited", "_low_contention_reduce_scatter-result")
    assert recorder.calls[-1] == (
        "_low_contention_reduce_scatter",
        {"tensor": A, "reduce_op": "avg", "group_name": "tp"},
    )
    assert waited == ["_low_contention_all_gather-result", "_low_contention_reduce_scatter-result"]
    with pytest.raises(ValueError, match="out= is only supported for CPU"):
        api.low_contention_all_gather(A, "tp", out=A)

    scale, bias = _cuda(1), _cuda(2)
    api.fused_all_gather_scaled_matmul(A, [B, B2], scale, [scale, scale], 0, "tp")
    assert recorder.calls[-1] == (
        "fused_all_gather_scaled_matmul",
        {
            "A": A,
            "Bs": [B, B2],
            "A_scale": scale,
            "B_scales": [scale, scale],
            "gather_dim": 0,
            "group_name": "tp",
            "biases": [None, None],
            "result_scales": [None, None],
            "out_dtypes": [None, None],
            "use_fast_accum": [False, False],
        },
    )
    api.fused_all_gather_scaled_matmul(
        A, [B], scale, [scale], 0, "tp", [bias], [scale], [torch.bfloat16], [True]
    )
    _, call = recorder.calls[-1]
    assert (call["biases"], call["result_scales"]) == ([bias], [scale])
    assert (call["out_dtypes"], call["use_fast_accum"]) == ([torch.bfloat16], [True])
    calls = len(recorder.calls)
    with pytest.raises(NotImplementedError, match="last dim"):
        api.fused_all_gather_scaled_matmul(A, [B], scale, [scale], -1, "tp")
    assert len(recorder.calls) == calls


def test_cuda_scaled_reduce_scatter_is_called_in_the_form_torch_computes_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch 2.13's CUDA kernel splits A's flattened rows along the "after reshape" dim
    and is right only when that is the output's scatter dim at the front: the API views
    A (and row-wise scales) with the output's leading dims, scatter dim first, and moves
    the result's dim back."""
    from dt_symm_mem import api

    recorder = _Recorder()
    monkeypatch.setattr(api, "_torch_op", recorder)
    name = "fused_scaled_matmul_reduce_scatter"
    A = _cuda(2, 4, 6, 8)
    B, B_scale, bias = _cuda(8, 5), _cuda(1, 5), _cuda(5)
    A_scale = _cuda(2, 4, 6, 1)
    recorder.results[name] = _cuda(6 // 2, 2, 4, 5)  # what torch returns: scatter dim first
    out = api.fused_scaled_matmul_reduce_scatter(
        A, B, A_scale, B_scale, "sum", 2, "tp", bias=bias, out_dtype=torch.bfloat16
    )
    assert torch.equal(out.t, recorder.results[name].t.movedim(0, 2))
    _, call = recorder.calls[-1]
    assert torch.equal(call.pop("A").t, A.t.movedim(2, 0))
    assert torch.equal(call.pop("A_scale").t, A_scale.t.movedim(2, 0))
    assert call == {
        "B": B,
        "B_scale": B_scale,
        "reduce_op": "sum",
        "orig_scatter_dim": 0,
        "scatter_dim_after_maybe_reshape": 0,
        "group_name": "tp",
        "output_shape": [6, 2, 4, 5],
        "bias": bias,
        "result_scale": None,
        "out_dtype": torch.bfloat16,
        "use_fast_accum": False,
    }
    # A flattened to 2-D with a 3-D output_shape: A viewed with the output's leading dims
    A2, tensor_scale = _cuda(8, 8), _cuda(1)
    recorder.results[name] = _cuda(2, 4, 5)
    out = api.fused_scaled_matmul_reduce_scatter(
        A2, B, tensor_scale, B_scale, "avg", -2, "tp", output_shape=[2, 4, 5]
    )
    assert torch.equal(out.t, recorder.results[name].t.movedim(0, 1))
    _, call = recorder.calls[-1]
    assert torch.equal(call["A"].t, A2.t.reshape(2, 4, 8).movedim(1, 0))
    assert call["A_scale"] is tensor_scale and call["output_shape"] == [4, 2, 5]
    assert call["orig_scatter_dim"] == call["scatter_dim_after_maybe_reshape"] == 0
    with pytest.raises(NotImplementedError, match="last"):
        api.fused_scaled_matmul_reduce_scatter(A2, B, tensor_scale, B_scale, "sum", 1, "tp")


def test_cpu_tensors_never_reach_torchs_cuda_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    from dt_symm_mem import api

    assert not api.uses_torch_kernels(torch.ones(2), torch.ones(2))
    with pytest.raises(ValueError, match="mixed devices"):
        api.uses_torch_kernels(torch.ones(2), _cuda(2))


@pytest.mark.ranks(2)
def test_groups_without_shared_memory_use_ordinary_collectives() -> None:
    """A group that cannot share memory (here: disabled, as a multi-host group would be)
    warns once with the reason and still computes the same results through gloo."""
    import os
    import warnings

    import dt_symm_mem
    import torch.distributed as dist
    from dt_symm_mem.workspace import DISABLE_ENV, fallback_reason, get_workspace

    os.environ[DISABLE_ENV] = "1"
    try:
        group = dist.new_group([0, 1])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert get_workspace(group, 100) is None
            assert get_workspace(group, 100) is None
    finally:
        del os.environ[DISABLE_ENV]
    messages = [str(w.message) for w in caught if "dt-symm-mem" in str(w.message)]
    assert len(messages) == 1 and DISABLE_ENV in messages[0], messages
    assert fallback_reason(group) == f"{DISABLE_ENV}=1"
    rank = dist.get_rank()
    A = torch.arange(12.0).view(4, 3) + 10 * rank
    B = torch.arange(6.0).view(3, 2)
    full = torch.cat([torch.arange(12.0).view(4, 3), torch.arange(12.0).view(4, 3) + 10])
    got_A, (C,) = dt_symm_mem.fused_all_gather_matmul(A, [B], 0, group)
    assert torch.equal(got_A, full) and torch.equal(C, full @ B)
    rs = dt_symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 0, group)
    total = (torch.arange(12.0).view(4, 3) * 2 + 10) @ B
    assert torch.equal(rs, total.chunk(2)[rank])
    x8 = torch.ones(2, 4).to(torch.float8_e4m3fn)
    gathered = dt_symm_mem.low_contention_all_gather(x8, group)
    assert gathered.dtype == torch.float8_e4m3fn and gathered.float().sum() == 16


@pytest.mark.ranks(2)
def test_group_spanning_hosts_uses_ordinary_collectives() -> None:
    """Ranks that report different hosts (here: rank 1 pretends) never try shared memory."""
    import warnings

    import dt_symm_mem
    import torch.distributed as dist
    from dt_symm_mem import workspace

    rank = dist.get_rank()
    real = workspace._host_identity, workspace._map_segment

    def no_mapping(*args: Any) -> Any:
        raise AssertionError("a multi-host group must not set up shared memory")

    if rank == 1:
        workspace._host_identity = lambda: ("other-host", "other-boot")
    workspace._map_segment = no_mapping
    try:
        group = dist.new_group([0, 1])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x = torch.arange(6.0).view(2, 3) + 10 * rank
            got_A, (C,) = dt_symm_mem.fused_all_gather_matmul(x, [torch.eye(3)], 0, group)
    finally:
        workspace._host_identity, workspace._map_segment = real
    assert workspace.fallback_reason(group) == "the group spans several hosts"
    assert [str(w.message) for w in caught if "dt-symm-mem" in str(w.message)] != []
    full = torch.cat([torch.arange(6.0).view(2, 3), torch.arange(6.0).view(2, 3) + 10])
    assert torch.equal(got_A, full) and torch.equal(C, full)


@pytest.mark.ranks(2)
def test_demo_stage_small() -> None:
    from dt_core.testing.demo_stage import check_stage_result
    from dt_symm_mem.demo import run_stage

    result = run_stage(small=True)
    check_stage_result(result, ranks=2)
    assert result["bytes_communicated"] > 0


@pytest.mark.ranks(2)
def test_failed_attach_falls_back_on_every_rank() -> None:
    """If one rank cannot map the segment (e.g. a separate /dev/shm), all ranks fall back
    together, with one warning, and nothing is left in /dev/shm."""
    import warnings

    import dt_symm_mem
    import torch.distributed as dist
    from dt_symm_mem import segment
    from dt_symm_mem.workspace import fallback_reason

    rank = dist.get_rank()
    group = dist.new_group([0, 1])
    real = segment.attach, segment.open_anonymous
    before = set(segment.leftover_segments())

    def refuse(what: Any, size: int) -> Any:
        raise PermissionError("simulated: cannot open the segment")

    if rank == 1:
        segment.attach = segment.open_anonymous = refuse
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x = torch.full((3,), float(rank))
            got = dt_symm_mem.low_contention_all_gather(x, group)
    finally:
        segment.attach, segment.open_anonymous = real
    assert torch.equal(got, torch.tensor([0.0, 0, 0, 1, 1, 1]))
    reason = fallback_reason(group)
    assert reason is not None and "simulated" in reason
    assert sum("dt-symm-mem" in str(w.message) for w in caught) == 1
    dist.barrier()
    assert set(segment.leftover_segments()) <= before  # the creator unlinked it


@pytest.mark.ranks(2)
def test_named_segments_when_anonymous_ones_are_unavailable() -> None:
    """If some rank cannot open the creator's memfd (another pid namespace, /proc locked
    down) or the creator cannot make one, every rank agrees on named /dev/shm segments:
    same results, no warning (nothing is lost), nothing left in /dev/shm."""
    import warnings

    import dt_symm_mem
    import torch.distributed as dist
    from dt_symm_mem import segment
    from dt_symm_mem.workspace import fallback_reason, get_workspace

    rank = dist.get_rank()
    before = set(segment.leftover_segments())
    real = segment.open_anonymous, segment.memfd_supported

    def refuse(seg: Any, size: int) -> Any:
        raise PermissionError("simulated: /proc/<pid>/fd is not reachable")

    for who in ("peer cannot open", "creator cannot create"):
        group = dist.new_group([0, 1])
        if who == "peer cannot open" and rank == 1:
            segment.open_anonymous = refuse
        if who == "creator cannot create" and rank == 0:
            segment.memfd_supported = lambda: False
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                x = torch.arange(4.0) + 10 * rank
                got = dt_symm_mem.low_contention_all_gather(x, group)
                handle = get_workspace(group, 2 << 20)  # growth stays on named segments
                again = dt_symm_mem.low_contention_all_gather(x, group)
        finally:
            segment.open_anonymous, segment.memfd_supported = real
        want = torch.cat([torch.arange(4.0), torch.arange(4.0) + 10])
        assert torch.equal(got, want) and torch.equal(again, want), who
        assert handle is not None and handle.mechanism == "named", who
        assert handle.name.startswith(segment.NAME_PREFIX), who
        assert fallback_reason(group) is None, who
        assert not [w for w in caught if "dt-symm-mem" in str(w.message)], who
    dist.barrier()
    assert set(segment.leftover_segments()) <= before
