"""The plan decides where a call runs, once (`plan.choose_path`), and every path has an
executor (`executors.EXECUTORS`)."""

from __future__ import annotations

import typing
import warnings

import pytest
import torch


def test_every_path_has_an_executor() -> None:
    from dt_cp.executors import EXECUTORS
    from dt_cp.plan import Path

    assert set(EXECUTORS) == set(typing.get_args(Path))


@pytest.mark.parametrize(
    ("algorithm", "parts", "path"),
    [
        ("auto", 2, "ring"),  # the measured default
        ("ring", 2, "ring"),
        ("allgather", 2, "allgather"),
        ("ring", 1, "local"),  # one rank holds the whole sequence
        ("ring", None, "local"),  # the sequence is not sharded
    ],
)
def test_eager_paths(algorithm: str, parts: int | None, path: str) -> None:
    from dt_cp.plan import choose_path

    assert choose_path(algorithm, torch.ones(1), parts) == path


def test_traced_and_simulated_paths_say_once_where_ring_was_asked_for() -> None:
    from dt_core.testing import simulated_ranks
    from dt_cp.plan import choose_path, reset_warnings
    from torch._subclasses.fake_tensor import FakeTensorMode

    reset_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with FakeTensorMode():
            fake = torch.ones(1)
            assert [choose_path(a, fake, 2) for a in ("auto", "ring", "ring")] == ["traced"] * 3
        with simulated_ranks(2):
            plain = torch.ones(1)
            paths = [choose_path(a, plain, p) for a, p in (("auto", 2), ("ring", 2), ("ring", 2))]
            assert paths == ["simulated"] * 3
            assert choose_path("ring", plain, None) == "simulated"  # even unsharded
    notes = [str(w.message) for w in caught if "dt-cp: the ring" in str(w.message)]
    assert len(notes) == 2, notes  # one for compile, one for LocalTensorMode
    assert "torch.compile" in notes[0] and "LocalTensorMode" in notes[1]


def test_plain_locals_under_local_tensor_mode_take_the_simulated_path() -> None:
    """A DTensor made with `from_local` of a plain tensor under the mode: every simulated
    rank holds that same shard. The mode decides the path, not the local's type."""
    import torch.nn.functional as F
    from dt_core.testing import rank_values, simulated_ranks
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, dtype=torch.float64) for _ in range(3))
    with simulated_ranks(2):
        mesh = init_device_mesh("cpu", (2,))
        qd, kd, vd = (DTensor.from_local(t, mesh, [Shard(2)]) for t in (q, k, v))
        got = rank_values(F.scaled_dot_product_attention(qd, kd, vd).full_tensor(), 2)
    whole = [torch.cat([t, t], 2) for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*whole)
    for rank in range(2):
        torch.testing.assert_close(got[rank], want)
