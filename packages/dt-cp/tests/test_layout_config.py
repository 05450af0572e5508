"""Layouts, settings, sharding helpers, fallbacks and the plugin's registration."""

from __future__ import annotations

import pytest
import torch
from dt_core.testing import cpu_mesh
from hypothesis import given, settings
from hypothesis import strategies as st


@given(
    length=st.integers(0, 40),
    parts=st.integers(1, 6),
    balancer=st.sampled_from(["none", "head_tail"]),
)
@settings(max_examples=60, deadline=None)
def test_layout_is_a_permutation_with_torch_shard_sizes(length, parts, balancer) -> None:
    from dt_cp.layout import SequenceLayout

    layout = SequenceLayout(length, parts, balancer)
    perm = layout.permutation()
    assert sorted(perm.tolist()) == list(range(length))
    chunks = torch.arange(length).chunk(parts) if length else []
    torch_sizes = [len(c) for c in chunks] + [0] * (parts - len(chunks))
    for rank in range(parts):
        assert len(layout.positions(rank)) == torch_sizes[rank]


def test_head_tail_balances_causal_work() -> None:
    from dt_cp.layout import SequenceLayout

    def work(layout, rank):  # keys each query row sees under a causal mask
        return int((layout.positions(rank) + 1).sum())

    plain = SequenceLayout(4096, 4, "none")
    balanced = SequenceLayout(4096, 4, "head_tail")
    ratio = lambda lay: max(work(lay, r) for r in range(4)) / min(work(lay, r) for r in range(4))  # noqa: E731
    assert ratio(plain) > 6
    assert ratio(balanced) < 1.01


def test_settings_precedence(monkeypatch) -> None:
    import dt_cp

    dt_cp.reset()
    monkeypatch.setenv("DT_CP_ALGORITHM", "allgather")
    assert dt_cp.current().algorithm == "allgather"
    dt_cp.configure(algorithm="ring")
    assert dt_cp.current().algorithm == "ring"
    with dt_cp.settings(algorithm="allgather", load_balancer="head_tail") as s:
        assert s == dt_cp.current()
        assert (s.algorithm, s.load_balancer) == ("allgather", "head_tail")
    assert dt_cp.current().algorithm == "ring"
    with dt_cp.settings(load_balancer="document", documents=[3, 4]) as s:
        assert (s.load_balancer, s.documents) == ("document", (3, 4))
        with dt_cp.settings(algorithm="allgather") as inner:
            assert inner.documents == (3, 4)  # kept unless given again
    dt_cp.reset()
    with pytest.raises(ValueError, match="algorithm"):
        dt_cp.configure(algorithm="fast")
    monkeypatch.setenv("DT_CP_LOAD_BALANCER", "document")
    monkeypatch.setenv("DT_CP_DOCUMENTS", "3,4")
    assert (dt_cp.current().load_balancer, dt_cp.current().documents) == ("document", (3, 4))
    monkeypatch.setenv("DT_CP_LOAD_BALANCER", "zigzag")
    with pytest.raises(ValueError, match="DT_CP_LOAD_BALANCER must be one of"):
        dt_cp.current()


def test_settings_are_listed_by_dt_plugins() -> None:
    import dt_cp.plugin  # noqa: F401  (the plugin module registers the store)
    from dt_core.kit import registered_settings

    rows = {row["name"]: row for row in registered_settings()["cp"].describe()}
    assert rows["algorithm"]["env"] == "DT_CP_ALGORITHM"
    assert rows["load_balancer"]["env"] == "DT_CP_LOAD_BALANCER"
    assert {"documents", "torch_cp", "torch_load_balancer"} <= set(rows)


def test_plugin_is_listed() -> None:
    import dt_core

    info = {p.name: p for p in dt_core.plugins()}["cp"]
    assert info.state == "active", info.reason
    assert "dt_cp::all_gather_seq" in info.ops
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in info.ops
    assert "hop flex_attention[DTensor]" in info.ops
    assert "hop flex_attention_backward[DTensor]" in info.ops


@pytest.mark.ranks(2)
def test_shard_roundtrip_and_fallback_warning() -> None:
    import warnings

    import dt_cp
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = cpu_mesh(2)
    t = torch.randn(2, 3, 9, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for balancer in ("none", "head_tail"):
        d = dt_cp.shard_sequence(t, mesh, 2, load_balancer=balancer)
        assert d.placements == (Shard(2),)
        assert torch.equal(dt_cp.unshard_sequence(d, 2, load_balancer=balancer), t)
    balanced = dt_cp.shard_sequence(t, mesh, -2, load_balancer="head_tail")
    assert not torch.equal(balanced.full_tensor(), t)  # really permuted

    # Mixed placements are unsupported: exact replicated fallback, one warning naming why.
    from dt_cp.plan import reset_warnings

    reset_warnings()
    q = distribute_tensor(t, mesh, [Shard(2)]).requires_grad_()
    k = distribute_tensor(t, mesh, [Replicate()]).requires_grad_()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = F.scaled_dot_product_attention(q, k, k, is_causal=True)
        y.sum().backward()
    from dt_core.kit import FallbackWarning

    messages = [str(w.message) for w in caught if "dt-cp" in str(w.message)]
    assert messages and all("placements differ" in m for m in messages), messages
    assert all(issubclass(w.category, FallbackWarning) for w in caught if "dt-cp" in str(w.message))
    assert all("falls back to replicated inputs" in m for m in messages), messages
    ref = t.clone().requires_grad_()
    want = F.scaled_dot_product_attention(ref, t, t, is_causal=True)
    want.sum().backward()
    assert y.placements == (Shard(2),)
    torch.testing.assert_close(y.full_tensor(), want, atol=1e-12, rtol=0)
    torch.testing.assert_close(q.grad.full_tensor(), ref.grad, atol=1e-12, rtol=0)


def test_plugin_module_stays_light() -> None:
    """The plugin module (and the settings it registers) load without DTensor."""
    import subprocess
    import sys

    code = (
        "import sys, dt_cp.plugin\n"
        "assert 'torch.distributed.tensor' not in sys.modules, 'DTensor imported'\n"
        "assert 'cp' in __import__('dt_core.kit', fromlist=['x']).registered_settings()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_flex_on_plain_tensors_applies_mask_mod() -> None:
    """Plain tensors go to torch's flex; a mask_mod must reach it (it once was dropped)."""
    import dt_cp
    from test_flex import dense_reference

    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 8, 4, dtype=torch.float64, generator=gen) for _ in range(3))

    def mask(b, h, i, j):
        return j <= i

    got = dt_cp.flex_attention(q, k, v, mask_mod=mask)
    torch.testing.assert_close(got, dense_reference(None, mask)(q, k, v), atol=1e-10, rtol=0)
    with pytest.raises(ValueError, match="not both"):
        block_mask = dt_cp.create_block_mask(mask, None, None, 8, 8)
        dt_cp.flex_attention(q, k, v, mask_mod=mask, block_mask=block_mask)


def test_head_tail_layout_is_planned_on_real_tensors_while_a_graph_is_traced() -> None:
    """A block compiled before any eager call plans torch's head-tail layout under
    Dynamo's fake tensors: the plan must not depend on (fake) tensor data."""
    from dt_cp.torch_cp import _balanced
    from torch._subclasses.fake_tensor import FakeTensorMode

    _balanced.cache_clear()
    with FakeTensorMode():
        layout = _balanced(16, 2)
    # head-tail on 2 ranks: rank 0 holds quarters 0 and 3, rank 1 quarters 1 and 2
    assert layout.explicit == (((0, 4), (12, 4)), ((4, 8),))
