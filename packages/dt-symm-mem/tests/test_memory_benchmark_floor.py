"""The memory benchmark's floor (benchmarks/memory.py), against numbers worked out by hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

MiB = 2**20
BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "memory.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    """The benchmark module, loaded by path (benchmarks/ is no package)."""
    spec = importlib.util.spec_from_file_location("dt_symm_mem_memory_benchmark", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_workspace_share_is_the_x_shard_and_the_peers_chunks(bench: ModuleType) -> None:
    # M=1024 D=256 P=4: an x shard of 256 x 256 fp32 (256 KiB) + 3 chunks of it (768 KiB).
    assert bench.workspace_share_bytes(1024, 256, 4) == 256 * 1024 + 768 * 1024 == MiB
    # M=8192 D=1024: M*D*4 = 32 MiB whatever P (16 + 16 at P=2, 4 + 7 x 4 at P=8).
    for ranks in (2, 4, 8):
        assert bench.workspace_share_bytes(8192, 1024, ranks) == 32 * MiB
    # bf16: half the bytes.
    assert bench.workspace_share_bytes(1024, 256, 4, itemsize=2) == MiB // 2


def test_floor_is_one_process_over_p_plus_the_workspace_share(bench: ModuleType) -> None:
    # The full problem's one process: x 32 + W1 16 + W2 16 + h 128 + relu(h) 128 = 320 MiB.
    assert bench.floor_bytes(320 * MiB, 8192, 1024, 4) == 80 * MiB + 32 * MiB
    assert bench.floor_bytes(320 * MiB, 8192, 1024, 8) == 40 * MiB + 32 * MiB
    # The quick problem: 1 + 1 + 1 + 4 + 4 = 11 MiB; P=2: 5.5 + 1 MiB.
    assert bench.floor_bytes(11 * MiB, 1024, 256, 2) == 6.5 * MiB
