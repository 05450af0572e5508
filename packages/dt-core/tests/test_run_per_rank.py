"""`compat.local_tensor.run_per_rank`: per-rank Python under torch's LocalTensorMode."""

from __future__ import annotations

import torch
from dt_core.compat import local_tensor as compat
from dt_core.testing import rank_values, simulated_ranks


def test_each_rank_sees_its_own_values_and_results_combine() -> None:
    def rows(t: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
        assert type(t) is torch.Tensor and type(n) is int  # plain values inside
        return t[:n] * 10, n + 1

    with simulated_ranks(3) as mode:
        t = mode.rank_map(lambda r: torch.arange(4.0) + r)
        n = torch.distributed.device_mesh.init_device_mesh("cpu", (3,)).get_local_rank(0)
        out, m = compat.run_per_rank(rows, t, n)  # rank r keeps r rows
        same = compat.run_per_rank(lambda: 7)
    for r, got in enumerate(rank_values(out, 3)):
        assert torch.equal(got, (torch.arange(4.0) + r)[:r] * 10)
        assert compat.int_on_rank(m, r) == r + 1
    assert same == 7  # equal on every rank: a plain int


def test_without_a_mode_it_is_a_plain_call() -> None:
    assert compat.run_per_rank(lambda a, b: a + b, 2, 3) == 5
