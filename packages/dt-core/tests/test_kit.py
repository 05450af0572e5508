"""The handler kit: schema binding, the replicated fallback, settings and counters."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import warnings
from typing import Literal

import pytest
import torch
from dt_core.kit import (
    Counters,
    FallbackWarning,
    SettingsStore,
    Unsupported,
    bind_arguments,
    bind_positional,
    forget_fallback_warnings,
    registered_settings,
    replicated_fallback,
    reset_stats,
    reshard_like,
    stats,
    warn_fallback,
)
from dt_core.testing import cpu_mesh


def test_binding_follows_the_schema_whatever_the_spelling() -> None:
    op = torch.ops.aten.convolution.default
    x, w = torch.ones(1), torch.ones(1)
    positional = bind_arguments(op, (x, w, None, [1], [0], [1], False, [0], 1), {})
    spelled = bind_arguments(
        op, (x, w), dict(bias=None, stride=[1], padding=[0], dilation=[1], transposed=False,
                         output_padding=[0], groups=1)
    )  # fmt: skip
    assert positional == spelled
    assert list(positional) == [a.name for a in op._schema.arguments]
    defaults = bind_arguments(torch.ops.aten.sum.dim_IntList, (x, [0]), {})
    assert defaults["keepdim"] is False and defaults["dtype"] is None
    assert bind_positional(torch.ops.aten.sum.dim_IntList, (x, [0]), {})[2] is False


@dataclasses.dataclass(frozen=True)
class _Knobs:
    mode: Literal["ring", "allgather"] = "ring"
    chunk: int = 512
    fast: bool = True
    sizes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.chunk <= 0:
            raise ValueError("chunk must be positive")


def test_settings_precedence_scoped_configure_environment_default(monkeypatch) -> None:
    store = SettingsStore("kit-test", _Knobs)
    assert registered_settings()["kit-test"] is store
    assert store.env_var("chunk") == "DT_KIT_TEST_CHUNK"
    assert store.current() == _Knobs()
    monkeypatch.setenv("DT_KIT_TEST_CHUNK", "64")
    monkeypatch.setenv("DT_KIT_TEST_FAST", "0")
    monkeypatch.setenv("DT_KIT_TEST_SIZES", "3,4,5")
    assert store.current() == _Knobs(chunk=64, fast=False, sizes=(3, 4, 5))
    store.configure(chunk=128)
    assert store.current().chunk == 128 and store.current().fast is False
    with store.scoped(mode="allgather") as inside:
        assert inside.mode == "allgather" and store.current().chunk == 128
    assert store.current().mode == "ring"
    sources = {row["name"]: row["source"] for row in store.describe()}
    assert sources == {
        "mode": "default",
        "chunk": "configure()",
        "fast": "environment",
        "sizes": "environment",
    }
    store.reset()
    assert store.current().chunk == 64


def test_settings_reject_bad_values_naming_them(monkeypatch) -> None:
    store = SettingsStore("kit-bad", _Knobs)
    monkeypatch.setenv("DT_KIT_BAD_MODE", "spiral")
    with pytest.raises(ValueError, match="DT_KIT_BAD_MODE must be one of"):
        store.current()
    monkeypatch.delenv("DT_KIT_BAD_MODE")
    with pytest.raises(ValueError, match="mode must be one of"):
        store.configure(mode="spiral")
    with pytest.raises(ValueError, match="chunk must be positive"):
        store.configure(chunk=-1)
    with pytest.raises(TypeError, match="unknown settings"):
        store.configure(chunks=3)
    assert store.current() == _Knobs()  # failed calls changed nothing


def test_settings_aliases_are_read_and_lose_to_the_new_name(monkeypatch) -> None:
    store = SettingsStore("kit-alias", _Knobs, aliases={"chunk": "OLD_CHUNK", "mode": "OLD_MODE"})
    monkeypatch.setenv("OLD_CHUNK", "16")
    monkeypatch.setenv("OLD_MODE", "AllGather")  # choices match whatever the case
    assert store.current() == _Knobs(chunk=16, mode="allgather")
    monkeypatch.setenv("DT_KIT_ALIAS_CHUNK", "32")
    assert store.current().chunk == 32
    rows = {row["name"]: row for row in store.describe()}
    assert rows["chunk"]["alias"] == "OLD_CHUNK" and rows["fast"]["alias"] is None
    assert rows["mode"]["source"] == "environment"
    monkeypatch.delenv("DT_KIT_ALIAS_CHUNK")
    monkeypatch.setenv("OLD_CHUNK", "-4")  # the dataclass refuses it: the variable is named
    with pytest.raises(ValueError, match="chunk must be positive.*OLD_CHUNK='-4'"):
        store.current()
    monkeypatch.setenv("OLD_CHUNK", "many")
    with pytest.raises(ValueError, match="OLD_CHUNK must be int"):
        store.current()
    with pytest.raises(TypeError, match="unknown fields"):
        SettingsStore("kit-alias-bad", _Knobs, aliases={"chunks": "OLD"})


def test_settings_none_keeps_or_sets_as_the_store_says(monkeypatch) -> None:
    keeps = SettingsStore("kit-none-keeps", _Knobs)
    keeps.configure(sizes=(1, 2), chunk=8)
    assert keeps.configure(sizes=None, chunk=None) == _Knobs(sizes=(1, 2), chunk=8)
    with keeps.scoped(sizes=None) as inside:
        assert inside.sizes == (1, 2)
    sets = SettingsStore("kit-none-sets", _Knobs, none_is_value=True)
    sets.configure(sizes=(1, 2))
    assert sets.configure(sizes=None).sizes is None
    with pytest.raises(ValueError, match="mode must be one of"):
        sets.configure(mode=None)  # only Optional fields take None
    sets.configure(sizes=(3,))
    with sets.scoped(sizes=None) as inside:
        assert inside.sizes is None
    assert sets.current().sizes == (3,)
    monkeypatch.setenv("DT_KIT_NONE_KEEPS_SIZES", "none")  # the environment's spelling
    keeps.reset()
    assert keeps.current().sizes is None
    monkeypatch.setenv("DT_KIT_NONE_KEEPS_SIZES", "")
    assert keeps.current().sizes is None


def test_reconfigure_forgets_earlier_configure_calls_unless_it_fails() -> None:
    store = SettingsStore("kit-reconfigure", _Knobs)
    store.configure(chunk=8, fast=False)
    assert store.reconfigure(mode="allgather") == _Knobs(mode="allgather")
    with pytest.raises(ValueError, match="chunk must be positive"):
        store.reconfigure(chunk=0)
    assert store.current() == _Knobs(mode="allgather")  # the failed call changed nothing
    assert store.reconfigure() == _Knobs()


def test_counters_and_their_exit_report(tmp_path) -> None:
    counters = Counters("kit-count")
    reset_stats()
    counters.add("bytes_sent", 100)
    counters.add("bytes_sent", 28)
    before = counters.snapshot()
    counters.add("fallbacks")
    assert stats()["kit-count"] == {"bytes_sent": 128, "fallbacks": 1}
    assert counters.changes(before) == {"fallbacks": 1}
    reset_stats()
    assert "kit-count" not in stats()
    report = tmp_path / "stats.jsonl"
    code = "from dt_core.kit import Counters; c = Counters('probe'); c.add('calls', 3)"
    env = dict(os.environ, DT_PLUGINS_STATS=str(report), DT_PLUGINS_AUTOLOAD="0")
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    assert [r["stats"] for r in rows] == [{"probe": {"calls": 3}}]


def test_fallback_warns_once_per_op_and_reason() -> None:
    forget_fallback_warnings("kit")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert warn_fallback("kit", "aten.foo", "odd stride")
        assert not warn_fallback("kit", "aten.foo", "odd stride")
        assert warn_fallback("kit", "aten.foo", "uneven groups")
    assert [w.category for w in caught] == [FallbackWarning, FallbackWarning]
    assert "dt-kit: aten.foo falls back to replicated inputs (odd stride)" in str(caught[0].message)


def test_unsupported_carries_its_reason_and_is_exported() -> None:
    import dt_core
    import dt_core.kit
    from dt_core.errors import DtPluginError

    with pytest.raises(Unsupported) as refused:
        raise Unsupported("input dim 1 changes size")
    assert str(refused.value) == refused.value.reason == "input dim 1 changes size"
    assert isinstance(refused.value, DtPluginError)
    assert dt_core.Unsupported is Unsupported and "Unsupported" in dt_core.__all__
    assert "Unsupported" in dt_core.kit.__all__


@pytest.mark.ranks(2)
def test_replicated_fallback_is_exact_and_keeps_layouts() -> None:
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    mesh = cpu_mesh(2)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 3, generator=gen), torch.randn(3, 4, generator=gen)
    da = distribute_tensor(a, mesh, [Shard(0)])
    db = distribute_tensor(b, mesh, [Replicate()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = replicated_fallback("kit", "test", torch.ops.aten.mm.default, (da, db), like=[da])
    assert out.placements == (Shard(0),)
    assert torch.allclose(out.full_tensor(), a @ b)
    assert any(w.category is FallbackWarning for w in caught)
    # Several outputs: each laid out like its model, the rest replicated; Partial -> Replicate.
    pair = replicated_fallback(
        "kit", "test", torch.ops.aten.sort.default, (da,), {"dim": 0}, like=[da]
    )
    values, indices = pair
    assert values.placements == (Shard(0),) and indices.placements == (Replicate(),)
    assert torch.equal(values.full_tensor(), a.sort(dim=0).values)
    fake_partial = torch.distributed.tensor.DTensor.from_local(
        torch.zeros(5, 3), mesh, [Partial()], run_check=False
    )
    out = replicated_fallback("kit", "test", torch.ops.aten.neg.default, (da,), like=[fake_partial])
    assert out.placements == (Replicate(),)
    assert torch.equal(out.full_tensor(), -a)


def _redistributes_to(mesh: object, placements: list) -> bool:
    """Whether this torch's redistribute takes a replicated tensor to `placements`."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    try:
        distribute_tensor(torch.zeros(8, 6), mesh, [Replicate()]).redistribute(mesh, placements)
    except ValueError:
        return False
    return True


@pytest.mark.ranks(2)
def test_reshard_like_keeps_strided_shards_plain_tensors_and_fitting_shards() -> None:
    """Each layout `reshard_like` gives a full value holds exactly that value's rows, as
    read off the value on one process (rank r of 2 owns chunk r of each split)."""
    import torch.distributed as dist
    from dt_core.compat.placements import strided_shard
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    mesh, rank = cpu_mesh(2), dist.get_rank()
    full = torch.randn(8, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(4))

    # FSDP's strided shard over a dim split in 2 first: each rank holds its quarter of
    # either half (rows 0-1 and 4-5 on rank 0, rows 2-3 and 6-7 on rank 1)
    # (torch 2.11 cannot redistribute to this layout: there it stays replicated)
    strided = [strided_shard(0, 2)]
    like = DTensor.from_local(torch.zeros(4, 6), mesh, strided, shape=(8, 6), stride=(6, 1))
    out = reshard_like(full, mesh, like)
    if _redistributes_to(mesh, strided):
        assert tuple(out.placements) == tuple(strided)
        assert torch.equal(
            out.to_local(),
            torch.cat([full[2 * rank : 2 * rank + 2], full[4 + 2 * rank : 6 + 2 * rank]]),
        )
    else:
        assert tuple(out.placements) == (Replicate(),) and torch.equal(out.to_local(), full)
    assert torch.equal(out.full_tensor(), full)

    # a plain model: the full value itself (a plain tensor's gradient); none: replicated
    assert reshard_like(full, mesh, torch.zeros(1)) is full
    replicated_out = reshard_like(full, mesh, None)
    assert isinstance(replicated_out, DTensor) and replicated_out.placements == (Replicate(),)
    assert torch.equal(replicated_out.to_local(), full)

    # another rank than the model: its shards where the result has their dim, else replicated
    wide = distribute_tensor(torch.zeros(8, 6, 3), mesh, [Shard(1)])
    out = reshard_like(full, mesh, wide)
    assert out.placements == (Shard(1),) and torch.equal(
        out.to_local(), full[:, 3 * rank : 3 * rank + 3]
    )
    deep = distribute_tensor(torch.zeros(8, 6, 3), mesh, [Shard(2)])
    out = reshard_like(full, mesh, deep)
    assert out.placements == (Replicate(),) and torch.equal(out.to_local(), full)
    assert reshard_like(None, mesh, deep) is None and reshard_like(3, mesh, deep) == 3


def test_stats_run_sums_counters_over_processes() -> None:
    from dt_core.kit.report import run_with_stats, stats_table

    code = (
        "import subprocess, sys\n"
        "from dt_core.kit import Counters\n"
        "Counters('probe').add('calls', 2)\n"
        "subprocess.run([sys.executable, '-c', "
        "\"from dt_core.kit import Counters; Counters('probe').add('calls', 5)\"], check=True)\n"
    )
    exit_code, totals, processes = run_with_stats([sys.executable, "-c", code])
    assert exit_code == 0 and processes == 2
    assert totals == {"probe": {"calls": 7}}
    assert stats_table(totals, processes).splitlines()[-1].split() == ["probe", "calls", "7"]


def test_settings_table_lists_every_store(monkeypatch) -> None:
    from dt_core.kit.report import settings_table

    SettingsStore("kit-table", _Knobs)
    monkeypatch.setenv("DT_KIT_TABLE_CHUNK", "32")
    row = next(r.split() for r in settings_table().splitlines() if "DT_KIT_TABLE_CHUNK" in r)
    assert row == ["kit-table", "chunk", "32", "environment", "DT_KIT_TABLE_CHUNK"]
    monkeypatch.setenv("DT_KIT_TABLE_MODE", "spiral")
    assert "invalid: DT_KIT_TABLE_MODE must be one of" in settings_table()
    monkeypatch.delenv("DT_KIT_TABLE_MODE")
    SettingsStore("kit-table-renamed", _Knobs, aliases={"chunk": "KIT_OLD_CHUNK"})
    assert "  KIT_OLD_CHUNK -> DT_KIT_TABLE_RENAMED_CHUNK" in settings_table().splitlines()
