"""dt_core.testing.memory, what the memory benchmarks count with: the peak over allocation
events (by address, frees of earlier blocks ignored), the live-tensor count (each storage
once), a profiled step's peak, the 1/P fit, the largest size within a budget, the rows."""

from __future__ import annotations

import os

import pytest
import torch
from dt_core.testing.memory import (
    MiB,
    fit_inverse_p,
    largest_fitting,
    live_tensor_bytes,
    measured_report,
    peak_from_events,
    scaling_report,
    step_peak_bytes,
)

# the benchmarks' memory counting (glibc, threads): checked at the window's oldest and
# newest torch (.ci/run leaves it out between them)
pytestmark = pytest.mark.window_ends


def test_peak_counts_only_blocks_allocated_among_the_events() -> None:
    events = [
        (3.0, -10, "a"),  # a's free, listed out of order: sorted by time first
        (1.0, 10, "a"),
        (2.0, 20, "b"),
        (4.0, 5, "c"),
        (5.0, -99, "earlier"),  # a block allocated before the events: ignored
        (6.0, -20, "b"),
    ]
    assert peak_from_events(events) == 30
    # b's free was not seen (freed on another thread), then its address was reused
    unseen = [(1.0, 20, "b"), (2.0, 10, "a"), (3.0, 20, "b"), (4.0, -10, "a")]
    assert peak_from_events(unseen) == 30
    assert peak_from_events([]) == 0


def test_live_tensor_bytes_counts_each_storage_once() -> None:
    before = live_tensor_bytes()
    block = torch.empty(MiB, dtype=torch.uint8)
    views = [block[: MiB // 2], block.view(2, -1)]
    during = live_tensor_bytes()
    del block, views
    assert during - before == MiB
    assert live_tensor_bytes() == before


def test_a_profiled_step_s_peak_is_what_it_held_at_once() -> None:
    def step() -> None:
        a = torch.ones(MiB, dtype=torch.uint8)
        b = torch.ones(2 * MiB, dtype=torch.uint8)
        del a, b
        c = torch.ones(MiB, dtype=torch.uint8)
        del c

    assert 3 * MiB <= step_peak_bytes(step) < 3 * MiB + 64 * 1024


def test_fit_inverse_p_recovers_a_and_b() -> None:
    a, b = fit_inverse_p([1, 2, 4, 8], [100 / p + 7 for p in (1, 2, 4, 8)])
    assert a == pytest.approx(100) and b == pytest.approx(7)
    with pytest.raises(ValueError):
        fit_inverse_p([2, 2], [1.0, 1.0])


def test_largest_fitting_stays_within_the_budget() -> None:
    # 576 MiB at edge 1024, memory like edge^2: 1024 * sqrt(1024 / 576) = 1365.3 -> 1344
    assert largest_fitting(1024, 576 * MiB, 1024 * MiB, 2, 64) == 1344
    # linear: exactly twice the budget fits exactly twice the size
    assert largest_fitting(16384, 512 * MiB, 1024 * MiB, 1, 1024) == 32768
    assert largest_fitting(1024, 576 * MiB, MiB, 2, 64) == 0
    for budget in (100, 333, 1000, 4096):
        size = largest_fitting(1000, 250.0, budget, 2, 8)
        assert 250.0 * (size / 1000) ** 2 <= budget < 250.0 * ((size + 8) / 1000) ** 2


def test_scaling_report_rows_and_plot() -> None:
    rows, series = scaling_report(
        "dt-x",
        "a problem",
        400 * MiB,
        {2: 210 * MiB, 4: 120 * MiB},
        {2: 205 * MiB, 4: 100 * MiB},
        floor_note="floor: local work",
        others={"theirs": {4: 300 * MiB}},
        fits={"size": 100, "what": "edge", "unit": "px", "exponent": 2, "multiple": 10}
        | {"budget": 1600 * MiB},
    )
    by_name = {r["name"]: r for r in rows}
    assert by_name["per-rank peak memory, P=4"]["ratio"] == pytest.approx(0.3)
    assert by_name["per-rank peak vs the floor, P=4"]["ratio"] == pytest.approx(1.2)
    assert by_name["theirs per-rank peak, P=4"]["ratio"] == pytest.approx(0.75)
    fits = by_name["largest edge within 1600 MiB per rank, P=4"]
    assert (fits["value"], fits["baseline_value"]) == (360, 200)  # 100*sqrt(1600/120)=365
    (plot,) = series
    assert plot["x"] == [1, 2, 4]
    assert plot["lines"]["one process / P"] == [400, 200, 100]
    assert plot["lines"]["floor"] == [400, 205, 100]
    assert plot["reference_lines"] == ["one process / P", "floor"]  # drawn dashed


def _free_on_another_thread_then_allocate_again() -> dict[str, int]:
    import threading

    from dt_core.testing.memory import measure_step

    def step() -> None:
        held = [torch.ones(32 * MiB, dtype=torch.uint8)]
        worker = threading.Thread(target=held.clear)  # the last reference dies there
        worker.start()
        worker.join()
        again = torch.ones(32 * MiB, dtype=torch.uint8)
        del again

    step()
    return measure_step(step)


def test_the_resident_rise_sees_a_free_on_another_thread() -> None:
    from dt_core.testing.memory import measure_one_process

    measured = measure_one_process(_free_on_another_thread_then_allocate_again)
    # Never more than one 32 MiB block at once; the profiler may count two (it sees only
    # this thread's frees), the resident set with blocks mapped alone sees one.
    assert 30 * MiB <= measured["rise"] < 36 * MiB  # pages of a few KiB come and go
    assert measured["peak"] == measured["held"] + measured["rise"]
    assert measured["alloc_rise"] >= 32 * MiB


def test_measure_step_refuses_a_process_without_blocks_mapped_alone(monkeypatch) -> None:
    from dt_core.testing.memory import MMAP_THRESHOLD_ENV, measure_step

    monkeypatch.delenv(MMAP_THRESHOLD_ENV, raising=False)
    with pytest.raises(RuntimeError, match="large_blocks_mapped_alone"):
        measure_step(lambda: None)


def test_glibc_defaults_are_measured_on_request_only(monkeypatch) -> None:
    from dt_core.testing.memory import (
        ALLOCATOR_ENV,
        MMAP_THRESHOLD_ENV,
        glibc_defaults,
        large_blocks_mapped_alone,
        measure_one_process,
    )

    monkeypatch.setenv(MMAP_THRESHOLD_ENV, "4096")
    with glibc_defaults():
        assert MMAP_THRESHOLD_ENV not in os.environ  # ranks start with glibc's own settings
        assert os.environ[ALLOCATOR_ENV] == "glibc-defaults"
        with large_blocks_mapped_alone():
            assert ALLOCATOR_ENV not in os.environ
    assert os.environ[MMAP_THRESHOLD_ENV] == "4096"  # put back as it was
    assert ALLOCATOR_ENV not in os.environ
    measured = measure_one_process(_free_on_another_thread_then_allocate_again, mapped_alone=False)
    assert measured["rise"] >= 30 * MiB  # one 32 MiB block is written whatever glibc keeps
    assert measured["peak"] == measured["held"] + measured["rise"]


def test_measured_report_takes_the_peaks_and_appends_the_allocation_view() -> None:
    def measured(peak: int, alloc_rise: int) -> dict[str, int]:
        return {"held": 10 * MiB, "rise": peak - 10 * MiB, "peak": peak, "alloc_rise": alloc_rise}

    rows, _ = measured_report(
        "dt-x",
        "a problem",
        measured(400 * MiB, 400 * MiB),
        {2: measured(210 * MiB, 220 * MiB), 4: measured(120 * MiB, 111 * MiB)},
        {2: 205 * MiB, 4: 100 * MiB},
        floor_note="floor: local work",
        fits={"size": 100, "what": "edge", "unit": "px", "exponent": 2, "multiple": 10},
    )
    by_name = {r["name"]: r for r in rows}
    assert by_name["per-rank peak memory, P=2"]["value"] == pytest.approx(210)
    floor = by_name["per-rank peak vs the floor, P=4"]
    assert floor["ratio"] == pytest.approx(1.2)
    # held + the profiler's rise: 10 + 220 at P=2, 10 + 111 at P=4, 10 + 400 alone
    assert floor["notes"] == (
        "floor: local work; torch's allocation view (held + profiler rise), MiB: P=2 230.0, "
        "P=4 121.0 (one process 410.0); it counts buffers freed on gloo's threads as held"
    )
    # the budget is 1 GiB when left out: 100 * sqrt(1024 / 400) = 160 px alone
    assert by_name["largest edge within 1024 MiB per rank, P=4"]["baseline_value"] == 160
