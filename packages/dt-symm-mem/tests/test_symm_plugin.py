"""Plugin wiring, the CUDA dispatch decision (mocked: no GPU here), the multi-host
fallback path, and the demo stage."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch


def test_plugin_is_active_and_claims_the_cpu_kernels() -> None:
    import dt_core
    import dt_symm_mem  # noqa: F401
    from dt_symm_mem.plugin import KERNELS

    info = {p.name: p for p in dt_core.plugins()}["symm-mem"]
    assert info.state == "active", info
    assert set(info.ops) == {f"symm_mem::{name}@CPU" for name in KERNELS}
    for name in KERNELS:
        dump = torch._C._dispatch_dump(f"symm_mem::{name}")
        cpu = [line for line in dump.splitlines() if line.startswith("CPU:")]
        assert cpu and "dt_core" in cpu[0], dump  # registered through dt-core's library
        assert any(line.startswith("Meta:") for line in dump.splitlines())  # torch's own


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def __call__(self, name: str) -> Any:
        def op(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            return "torch-result"

        return op


def _cuda(*shape: int) -> Any:
    return SimpleNamespace(device=torch.device("cuda", 0), shape=shape)


def test_cuda_tensors_go_to_torchs_symmetric_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    from dt_symm_mem import api

    recorder = _Recorder()
    monkeypatch.setattr(api, "_torch_op", recorder)
    A, B = _cuda(4, 8), _cuda(8, 2)
    assert api.fused_all_gather_matmul(A, [B], 0, "tp", return_A=False) == "torch-result"
    assert api.fused_matmul_reduce_scatter(A, B, "avg", 1, "tp") == "torch-result"
    assert api.low_contention_all_gather(A, "tp") == "torch-result"
    assert api.low_contention_reduce_scatter(A, "sum", "tp") == "torch-result"
    scale = _cuda()
    api.fused_all_gather_scaled_matmul(A, [B], scale, [scale], 0, "tp")
    api.fused_scaled_matmul_reduce_scatter(A, B, scale, scale, "sum", 0, "tp")
    names = [name for name, _, _ in recorder.calls]
    assert names == [
        "fused_all_gather_matmul",
        "fused_matmul_reduce_scatter",
        "_low_contention_all_gather",
        "_low_contention_reduce_scatter",
        "fused_all_gather_scaled_matmul",
        "fused_scaled_matmul_reduce_scatter",
    ]
    _, args, kwargs = recorder.calls[0]
    assert args == (A, [B], 0, "tp") and kwargs == {"return_A": False}
    _, args, _ = recorder.calls[4]
    assert args[6:] == ([None], [None], [None], [False])  # torch's defaults filled in
    _, args, _ = recorder.calls[5]
    assert args[4:9] == ("sum", 0, 0, "tp", [4, 2])  # output shape derived from A and B


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
def test_demo_stage_small() -> None:
    import torch.distributed as dist
    from dt_symm_mem.demo import run_stage

    result = run_stage(small=True)
    assert result["ok"], result
    assert result["ranks"] == dist.get_world_size() == 2
    assert result["max_error"] <= result["tolerance"]
    assert result["time_s"] > 0 and result["baseline_time_s"] > 0
    assert result["bytes_communicated"] > 0
    keys = {"feature", "details"}
    assert keys <= set(result)


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
    real_attach = segment.attach
    before = set(segment.leftover_segments())

    def refuse(name: str, size: int) -> Any:
        raise PermissionError("simulated: cannot open the segment")

    if rank == 1:
        segment.attach = refuse
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x = torch.full((3,), float(rank))
            got = dt_symm_mem.low_contention_all_gather(x, group)
    finally:
        segment.attach = real_attach
    assert torch.equal(got, torch.tensor([0.0, 0, 0, 1, 1, 1]))
    reason = fallback_reason(group)
    assert reason is not None and "simulated" in reason
    assert sum("dt-symm-mem" in str(w.message) for w in caught) == 1
    dist.barrier()
    assert set(segment.leftover_segments()) <= before  # the creator unlinked it
