"""The shared-memory workspace: growth, cleanup of /dev/shm, dead and stuck peers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

# shared-memory segments and their cleanup: checked at the window's oldest and newest torch
# (.ci/run leaves it out between them)
pytestmark = pytest.mark.window_ends

HERE = Path(__file__).parent


@pytest.mark.ranks(2)
def test_workspace_grows_on_demand_and_leaves_nothing_in_dev_shm() -> None:
    import dt_symm_mem
    import torch.distributed as dist
    from dt_symm_mem import ops, segment
    from dt_symm_mem.workspace import MIN_BUFFER_BYTES, get_workspace

    group = dist.new_group([0, 1])  # a fresh group: a fresh workspace
    rank = dist.get_rank()
    created = ops.counters.get("workspace_segments")
    names, sizes = [], []
    # A reduce-scatter of 2n floats moves n floats to each rank through the buffers.
    # (Large all-gathers stream through a fixed ring and never grow them.)
    for numel in (16, 1000, MIN_BUFFER_BYTES // 4 + 2, 3 * MIN_BUFFER_BYTES // 4, 8):
        x = torch.arange(numel, dtype=torch.float32) + 1000 * rank
        got = dt_symm_mem.low_contention_reduce_scatter(x, "sum", group)
        half = numel // 2
        assert torch.equal(got, 2 * x[rank * half : (rank + 1) * half] + 1000 * (1 - 2 * rank))
        handle = get_workspace(group, 0)
        assert handle.buffer_bytes >= 4 * numel
        names.append(handle.name)
        sizes.append(handle.buffer_bytes)
    assert sizes[0] == MIN_BUFFER_BYTES and sizes[-1] > sizes[0]
    assert len(set(names)) == 3, names  # 1 MiB, then grown twice (2 MiB -> 4 MiB)
    assert ops.counters.get("workspace_segments") - created == 3  # each one counted
    assert handle.mechanism == "memfd"  # Linux with /proc: anonymous segments
    assert sizes == sorted(sizes)
    # Every segment was unlinked once all ranks had mapped it.
    assert not set(names) & set(segment.leftover_segments())
    path = Path(segment.SHM_DIR)
    for name in names:
        assert not (path / name).exists()


@pytest.mark.ranks(2)
def test_stuck_peer_barrier_times_out_with_a_clear_error() -> None:
    import time

    import torch.distributed as dist
    from dt_symm_mem.handle import SymmMemTimeoutError
    from dt_symm_mem.workspace import get_workspace

    handle = get_workspace(dist.group.WORLD, 0)
    channel = 3
    if dist.get_rank() == 0:
        start = time.monotonic()
        with pytest.raises(SymmMemTimeoutError, match=r"timed out after 1\.0s.*rank 1"):
            handle.barrier(channel, timeout=1.0)
        assert time.monotonic() - start < 5
    else:
        time.sleep(2.0)  # stuck, but alive
        handle.barrier(channel)  # the barrier rank 0 gave up on (its flag is set)
    handle.barrier(channel)  # both in step again
    handle.put_signal(1 - handle.rank)
    handle.wait_signal(1 - handle.rank)


SCENARIOS = ["normal:memfd", "normal:named", "kill:memfd", "kill:named", "kill-creator:memfd"]


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run every kill/exit scenario once (one subprocess, a forked 2-rank world each);
    also records which of our names were in /dev/shm before."""
    from dt_symm_mem import segment

    root = tmp_path_factory.mktemp("symm-worlds")
    before = set(segment.leftover_segments())
    env = dict(os.environ, DT_SYMM_MEM_TIMEOUT="60")
    subprocess.run(
        [sys.executable, str(HERE / "symm_kill_world.py"), str(root), *SCENARIOS],
        check=True,
        timeout=400,
        env=env,
    )
    results: dict[str, Any] = {"before": before}
    for scenario in SCENARIOS:
        outdir = root / scenario.replace(":", "-")
        codes = json.loads((outdir / "exitcodes.json").read_text())
        reports = [
            json.loads(p.read_text()) if (p := outdir / f"rank{r}.json").exists() else {}
            for r in range(2)
        ]
        results[scenario] = (reports, codes)
    return results


def _new_leftovers(before: set[str]) -> set[str]:
    """Our names that appeared in /dev/shm since `before` and stay (a concurrent test
    run's segment lives for microseconds only: look twice)."""
    import time

    from dt_symm_mem import segment

    new = set(segment.leftover_segments()) - before
    if new:
        time.sleep(0.5)
        new &= set(segment.leftover_segments())
    return new


@pytest.mark.parametrize("segments", ["memfd", "named"])
def test_nothing_left_in_dev_shm_after_normal_exit(segments: str, worlds: dict) -> None:
    from dt_symm_mem import segment

    before = worlds["before"]
    reports, codes = worlds[f"normal:{segments}"]
    assert codes == [0, 0]
    assert all(r["ok"] for r in reports)
    assert [r["mechanism"] for r in reports] == [segments, segments]
    assert reports[0]["name"] == reports[1]["name"]
    assert reports[0]["name"] not in segment.leftover_segments()
    assert not _new_leftovers(before)


@pytest.mark.parametrize("segments", ["memfd", "named"])
def test_sigkilled_rank_leaves_nothing_and_peer_fails_fast(segments: str, worlds: dict) -> None:
    from dt_symm_mem import segment

    before = worlds["before"]
    reports, codes = worlds[f"kill:{segments}"]
    assert codes == [0, -9]
    assert reports[0]["mechanism"] == segments
    name = reports[0]["name"]
    assert name.startswith(segment.NAME_PREFIX if segments == "named" else "memfd:")
    assert name not in segment.leftover_segments()
    assert not _new_leftovers(before)
    error = reports[0]["error"]
    assert error is not None and "SymmMemTimeoutError" in error and "rank 1" in error
    assert "exited" in error
    assert reports[0]["seconds"] < 30  # detected long before the 60 s deadline
    error = reports[0]["barrier_error"]  # a barrier with the dead peer fails the same way
    assert error is not None and "SymmMemTimeoutError" in error and "barrier" in error
    assert "rank 1" in error and "exited" in error and reports[0]["barrier_seconds"] < 30


def test_creator_killed_right_after_creating_leaves_nothing(worlds: dict) -> None:
    """The creator dies after making the segment and before any peer has heard of it (the
    window the named path cannot close): an anonymous segment has no name to leave."""
    reports, codes = worlds["kill-creator:memfd"]
    before = worlds["before"]
    assert codes == [-9, 0]
    assert reports[0]["kind"] == "memfd"
    assert reports[0]["target"].startswith("/memfd:"), reports[0]  # not a /dev/shm file
    assert not _new_leftovers(before)
    assert reports[1]["error"] is not None  # the survivor's setup failed instead of hanging
    assert reports[1]["seconds"] < 60


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=6))
def test_packed_offsets_are_aligned_and_disjoint(sizes: list[int]) -> None:
    from dt_symm_mem.algorithms import ALIGN, packed_offsets

    offsets, total = packed_offsets(sizes)
    assert all(o % ALIGN == 0 for o in offsets)
    ends = [o + s for o, s in zip(offsets, sizes, strict=True)]
    assert all(e <= n for e, n in zip(ends, [*offsets[1:], total], strict=True))
    assert total >= sum(sizes)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 1 << 30), st.integers(0, 1 << 28))
def test_growth_sizes_cover_the_request_and_at_least_double(need: int, previous: int) -> None:
    from dt_symm_mem.workspace import MIN_BUFFER_BYTES, _round_size

    size = _round_size(need, previous)
    assert size >= need and size >= MIN_BUFFER_BYTES and size >= 2 * previous


def test_segments_are_exclusive_and_owner_only() -> None:
    import stat

    from dt_symm_mem import segment

    name = segment.new_name()
    mapping = segment.create(name, 4096)
    try:
        info = os.stat(Path(segment.SHM_DIR) / name)
        assert stat.S_IMODE(info.st_mode) == 0o600
        with pytest.raises(FileExistsError):
            segment.create(name, 4096)
        peer = segment.attach(name, 4096)
        mapping[0:4] = b"abcd"
        assert peer[0:4] == b"abcd"
        peer.close()
    finally:
        segment.unlink(name)
        mapping.close()
    assert name not in segment.leftover_segments()
    with pytest.raises(ValueError, match="not a segment name"):
        segment.attach("../etc/passwd", 10)


def test_anonymous_segments_are_owner_only_sealed_and_checked() -> None:
    import dataclasses
    import stat

    from dt_symm_mem import segment

    before = set(segment.leftover_segments())
    fd, seg, mapping = segment.create_anonymous(8192)
    try:
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
        assert os.readlink(seg.proc_path).startswith("/memfd:")  # no name in any directory
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 4096)  # sealed: nobody can shrink it under a peer's mapping
        peer = segment.open_anonymous(seg, 8192)
        mapping[0:4] = b"abcd"
        assert peer[0:4] == b"abcd"
        peer.close()
        with pytest.raises(PermissionError, match="not the announced segment"):
            segment.open_anonymous(dataclasses.replace(seg, inode=seg.inode + 1), 8192)
        with pytest.raises(ValueError, match="need 16384"):
            segment.open_anonymous(seg, 16384)
        other_ns = dataclasses.replace(seg, pid_namespace=seg.pid_namespace + 1)
        with pytest.raises(PermissionError, match="another pid namespace"):
            segment.open_anonymous(other_ns, 8192)
    finally:
        os.close(fd)
        mapping.close()
    assert set(segment.leftover_segments()) <= before
