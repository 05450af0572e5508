"""Tests of the multi-rank harness: shared worlds, the `ranks` marker, failure reports.

In-process tests share the 2- and 4-rank worlds; failure and xdist behaviour is checked in
a few inner pytest runs (pytester, subprocess), as that is where the report must show.
"""

from __future__ import annotations

import os
import pickle
import re
import threading

import pytest
import torch
import torch.distributed as dist
from dt_core.testing import RankFailure, cpu_mesh, run_on_ranks
from dt_core.testing.scripts import run_python

# what this module checks does not differ between torch releases (.ci/run: one axis only)
pytestmark = pytest.mark.ci_once


def _rank_values(rank: int) -> torch.Tensor:
    return torch.arange(5, dtype=torch.float64) * (rank + 1) + rank


def _all_reduce_rank_values() -> tuple[int, torch.Tensor]:
    t = _rank_values(dist.get_rank())
    dist.all_reduce(t)
    return dist.get_rank(), t


@pytest.mark.parametrize("n", [2, 4])
def test_all_reduce_sums_over_ranks(dist_world, n):
    results = dist_world(n).run(_all_reduce_rank_values)
    expected = torch.stack([_rank_values(r) for r in range(n)]).sum(0)
    assert [rank for rank, _ in results] == list(range(n))
    for _, total in results:
        torch.testing.assert_close(total, expected)


def test_world_is_reused_between_runs(dist_world):
    world = dist_world(2)
    pids = world.run(os.getpid)
    assert pids == world.pids
    assert os.getpid() not in pids
    assert dist_world(2) is world
    assert run_on_ranks(os.getpid, world_size=2) == pids


def test_args_kwargs_and_rank_state(dist_world):
    def body(base, *, scale):
        return base + scale * dist.get_rank(), torch.get_num_threads()

    assert dist_world(2).run(body, 10, scale=3) == [(10, 1), (13, 1)]


@pytest.mark.ranks(2, 4)
@pytest.mark.parametrize("scale", [1.0, 3.0])
def test_marker_with_several_sizes_runs_once_per_size(scale, world_size):
    assert dist.get_world_size() == world_size
    assert scale in (1.0, 3.0)


def test_marker_sizes_become_test_ids(pytester):
    pytester.makepyfile(
        test_sizes="""
import pytest
import torch.distributed as dist

@pytest.mark.ranks(2, 4)
def test_size(world_size):
    assert dist.get_world_size() == world_size

@pytest.mark.ranks(2)
def test_one_size(world_size):
    assert world_size == dist.get_world_size() == 2
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*test_size?2ranks?*PASSED*", "*test_size?4ranks?*PASSED*"])


@pytest.mark.ranks(2)
@pytest.mark.parametrize("scale", [1.0, 3.0])
def test_marker_runs_body_on_every_rank(scale, tmp_path):
    assert dist.is_initialized() and dist.get_world_size() == 2
    rank = dist.get_rank()
    (tmp_path / f"rank{rank}").write_text(str(scale))
    t = torch.full((3,), scale * (rank + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), scale * 3))
    dist.barrier()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]


def _distribute_round_trip() -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = cpu_mesh((2, 2), ("dp", "tp"))
    assert cpu_mesh((2, 2), ("dp", "tp")) is mesh
    assert mesh.shape == (2, 2)
    torch.manual_seed(0)
    full = torch.randn(4, 6)
    dtensor = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    local_shape = tuple(dtensor.to_local().shape)
    return dtensor.full_tensor(), (dtensor * 2 + 1).full_tensor(), local_shape


def test_cpu_mesh_2x2_dtensor(dist_world):
    torch.manual_seed(0)
    full = torch.randn(4, 6)
    for gathered, computed, local_shape in dist_world(4).run(_distribute_round_trip):
        assert local_shape == (2, 3)
        torch.testing.assert_close(gathered, full)
        torch.testing.assert_close(computed, full * 2 + 1)


def test_rank_errors_are_reported_and_world_kept(dist_world):
    world = dist_world(2)

    def raise_on_rank_1():
        if dist.get_rank() == 1:
            raise ValueError("bad value on rank 1")
        return "fine"

    with pytest.raises(RankFailure) as info:
        world.run(raise_on_rank_1)
    report = str(info.value)
    assert "rank 1: ValueError: bad value on rank 1" in report
    assert "in raise_on_rank_1" in report
    assert "rank 0" not in report
    assert info.value.errors.keys() == {1}
    assert not isinstance(info.value, AssertionError)
    assert str(pickle.loads(pickle.dumps(info.value))) == report

    with pytest.raises(RankFailure, match="rank 0: TypeError: result could not be pickled"):
        world.run(threading.Lock)
    # Every rank answered, so the world is still usable as it was.
    assert world.alive and dist_world(2) is world
    assert world.run(dist.get_rank) == [0, 1]


def test_plugin_import_does_not_import_torch():
    # The pytest plugin loads in every pytest run; the helpers import torch when used.
    code = (
        "import sys, dt_core.testing, dt_core.testing.compiled, dt_core.testing.pytest_plugin;"
        " print('torch' in sys.modules)"
    )
    assert run_python(code).strip() == "False"


# --- inner pytest runs: what a failing, stuck, dying or parallel test looks like ----------

FAILING_TESTS = """
import os
import time

import pytest
import torch
import torch.distributed as dist

PIDS = []


def _all_reduce_ones():
    t = torch.ones(2)
    dist.all_reduce(t)
    return t.tolist()


def test_start(dist_world):
    PIDS.append(dist_world(2).pids)


@pytest.mark.ranks(2)
def test_rank1_asserts():
    value = 10 * dist.get_rank()
    assert value == 0, f"rank-local value is {value}"


def test_world_kept_after_assertion(dist_world):
    assert dist_world(2).pids == PIDS[-1]


@pytest.mark.ranks(2, timeout=5)
def test_rank1_stuck():
    if dist.get_rank() == 1:
        time.sleep(600)
    else:  # blocked in a collective rank 1 never joins
        dist.all_reduce(torch.ones(2))


def _check_fresh_working_world(dist_world):
    world = dist_world(2)
    assert world.pids != PIDS[-1]  # new processes replaced the failed world's
    PIDS.append(world.pids)
    assert world.run(_all_reduce_ones) == [[2.0, 2.0]] * 2


def test_fresh_world_after_stuck(dist_world):
    _check_fresh_working_world(dist_world)


@pytest.mark.ranks(2)
def test_rank1_dies():
    if dist.get_rank() == 1:
        os._exit(3)


def test_fresh_world_after_death(dist_world):
    _check_fresh_working_world(dist_world)


@pytest.mark.ranks(2)
def test_rank0_collective_alone():
    if dist.get_rank() == 0:  # issued, never waited for: rank 1 never joins it
        dist.all_reduce(torch.ones(2), async_op=True)


def test_fresh_world_after_out_of_step(dist_world):
    _check_fresh_working_world(dist_world)


@pytest.mark.ranks(2)
def test_skipped_on_every_rank():
    pytest.skip("not on this backend")
"""


def _report_sections(output: str) -> dict[str, str]:
    """pytest's failure report split into {test name: its section}."""
    parts = re.split(r"^_{3,} (\S+) _{3,}$", output, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_failures_are_reported_and_bounded(pytester):
    pytester.makepyfile(test_failing=FAILING_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    output = result.stdout.str()
    result.assert_outcomes(passed=6, failed=3, skipped=1)
    # the stuck test's rank sleeps 600 s: the run ends long before, however loaded the
    # machine (its spawns alone took 50-65 s on 2 busy cores)
    assert result.duration < 300, "a stuck rank must fail within its timeout, not hang"
    assert "During handling" not in output  # the report is not repeated as a chained error
    sections = _report_sections(output)
    assert set(sections) == {"test_rank1_asserts", "test_rank1_stuck", "test_rank1_dies"}

    asserts = sections["test_rank1_asserts"]
    assert "rank 1: AssertionError: rank-local value is 10" in asserts
    assert "assert 10 == 0" in asserts  # pytest's assertion rewriting reached the rank
    assert re.search(r'test_failing\.py", line \d+, in test_rank1_asserts', asserts)
    assert "rank 0:" not in asserts

    stuck = sections["test_rank1_stuck"]
    assert "rank 0: stuck, no answer within 5 s" in stuck
    assert "rank 1: stuck, no answer within 5 s" in stuck
    # where the stuck ranks were: their stacks, down to the test body's line
    assert len(re.findall(r'test_failing\.py", line \d+ in test_rank1_stuck', stuck)) == 2
    # and how far each got: rank 0 issued the all-reduce, rank 1 nothing
    issued = re.findall(r"operations issued in this task, per process group: '0': (\d+)", stuck)
    assert issued == ["1", "0"], stuck
    assert "the stuck ranks have issued different numbers of operations on ['0']" in stuck
    # and rank 0's last operation, as torch's flight recorder kept it: the all-reduce
    assert re.search(r"#\d+ on group '0': gloo:all_reduce \[\[2\]\]\n", stuck), stuck

    # a collective issued on rank 0 only: the world is replaced (the next test then gets
    # fresh ranks), with a warning naming each rank's count
    assert "WorldReplacedWarning" in output
    counts = re.search(r"process group '0': rank 0: (\d+), rank 1: (\d+)", output)
    assert counts, output
    assert int(counts[1]) == int(counts[2]) + 1  # the world's earlier tasks counted on both

    assert "rank 1: died with exit code 3" in sections["test_rank1_dies"]


PARALLEL_TESTS = """
import pytest
import torch
import torch.distributed as dist


@pytest.mark.ranks(2)
def test_marker():
    t = torch.tensor([dist.get_rank() + 1])
    dist.all_reduce(t)
    assert t.item() == 3


def test_fixture(dist_world):
    assert dist_world(2).run(dist.get_rank) == [0, 1]
"""


def test_runs_under_xdist(pytester):
    pytester.makepyfile(test_par_a=PARALLEL_TESTS, test_par_b=PARALLEL_TESTS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile", "-v"
    )
    result.assert_outcomes(passed=4)
    output = result.stdout.str()
    assert "[gw0]" in output and "[gw1]" in output  # two workers, each with its own world


def _remember() -> str | None:
    """A plugin's record kept in a rank process: `dt_core.forget` must drop it."""
    import dt_core

    def drop() -> None:
        os.environ.pop("DT_TEST_REMEMBERED", None)

    dt_core.on_forget(drop)
    before = os.environ.get("DT_TEST_REMEMBERED")
    os.environ["DT_TEST_REMEMBERED"] = "yes"
    return before


def test_records_from_one_task_are_forgotten_before_the_next(dist_world):
    """What a plugin recorded in one task (dt-cp's sequence layouts, say) must not decide
    the next task's result: the ranks call `dt_core.forget()` after every task."""
    world = dist_world(2)
    world.run(_remember)
    assert world.run(_remember) == [None, None]


def test_forget_runs_each_registered_forgetter_once() -> None:
    import dt_core

    calls: list[str] = []

    def drop() -> None:
        calls.append("dropped")

    dt_core.on_forget(drop)
    dt_core.on_forget(drop)
    dt_core.forget()
    assert calls == ["dropped"]
