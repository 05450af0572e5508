"""dt_core.dtensors: wrapping local shards without a shape all-gather; warn-once."""

from __future__ import annotations

import warnings

import pytest
import torch
from dt_core.dtensors import as_dtensor, contiguous_strides, forget_warnings, warn_once


def test_contiguous_strides_match_torch() -> None:
    for shape in [(2, 3, 4), (5,), (3, 0, 2), (1, 1)]:
        assert contiguous_strides(shape) == torch.empty(shape).stride()


def test_warn_once_per_key_and_forget_by_prefix() -> None:
    forget_warnings("test-helpers:")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert warn_once("test-helpers: a", "first")
        assert not warn_once("test-helpers: a", "again")
        assert warn_once("test-helpers: b", "other")
        forget_warnings("test-helpers: a")
        assert warn_once("test-helpers: a", "after forgetting")
    assert [str(w.message) for w in caught] == ["first", "other", "after forgetting"]


@pytest.mark.ranks(2)
def test_as_dtensor_wraps_uneven_shards_with_the_given_global_shape() -> None:
    import torch.distributed as dist
    from dt_core.testing import cpu_mesh
    from torch.distributed.tensor import Shard

    full = torch.arange(15.0).reshape(5, 3)
    local = full.chunk(2)[dist.get_rank()]
    dt = as_dtensor(local, cpu_mesh(2), [Shard(0)], full.shape)
    assert dt.shape == full.shape and dt.stride() == full.stride()
    assert torch.equal(dt.full_tensor(), full)
