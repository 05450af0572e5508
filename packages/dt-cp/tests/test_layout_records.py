"""A sequence's layout is checked where it is read: attention and `unshard_sequence` under
settings that disagree with what `shard_sequence` laid out raise `LayoutMismatchError`
naming both, and never compute in the wrong order (issue: a causal attention sharded
"head_tail" and attended without balancing was silently wrong)."""

from __future__ import annotations

import pytest
import torch
from dt_core.testing import cpu_mesh

S = 64  # the length of the report: 2 ranks, head-tail pieces of 16


def _qkv(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, S, 8, dtype=torch.float64, generator=gen) for _ in range(3)]


def _causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.ranks(2)
def test_a_layout_attention_does_not_expect_raises_naming_both() -> None:
    import dt_cp
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = cpu_mesh(2)
    q, k, v = _qkv()

    # sharded head-tail, attended without balancing: the report's silent wrong result
    dt_cp.forget_layouts()
    balanced = [dt_cp.shard_sequence(t, mesh, 2, load_balancer="head_tail") for t in (q, k, v)]
    with pytest.raises(dt_cp.LayoutMismatchError) as caught:
        _causal(*balanced)
    assert "load_balancer='none'" in str(caught.value)
    assert "load_balancer='head_tail'" in str(caught.value)
    # and unsharded in another order than its own
    with pytest.raises(dt_cp.LayoutMismatchError, match="unshard_sequence"):
        dt_cp.unshard_sequence(balanced[0], 2, load_balancer="none")

    # sharded by document, attended head-tail
    dt_cp.forget_layouts()
    docs = [20, 44]
    by_doc = [
        dt_cp.shard_sequence(t, mesh, 2, load_balancer="document", documents=docs)
        for t in (q, k, v)
    ]
    with dt_cp.settings(load_balancer="head_tail"), pytest.raises(dt_cp.LayoutMismatchError) as c:
        _causal(*by_doc)
    assert "documents=[20, 44]" in str(c.value) and "'head_tail'" in str(c.value)
    # other document lengths are another layout too
    with dt_cp.settings(load_balancer="document", documents=[32, 32]):
        with pytest.raises(dt_cp.LayoutMismatchError, match=r"documents=\[32, 32\]"):
            _causal(*by_doc)

    # plainly sharded (natural order), attended under a balancer
    dt_cp.forget_layouts()
    plain = [distribute_tensor(t, mesh, [Shard(2)]) for t in (q, k, v)]
    with dt_cp.settings(load_balancer="head_tail"), pytest.raises(dt_cp.LayoutMismatchError) as c:
        _causal(*plain)
    assert "no dt_cp.shard_sequence call" in str(c.value)
    assert "AssertionError" not in type(c.value).__name__


@pytest.mark.ranks(2)
def test_the_check_reaches_tensors_derived_from_the_sharded_one() -> None:
    """The record is per mesh, mesh dim and length, so projections, views and the
    gradients' path see it: the check holds where q, k, v are computed from a sharded
    input, not sharded themselves."""
    import dt_cp
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, distribute_tensor

    mesh = cpu_mesh(2)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, S, 16, dtype=torch.float64, generator=gen)
    w = torch.randn(48, 16, dtype=torch.float64, generator=gen)

    def attend(xs: torch.Tensor, wd: torch.Tensor) -> torch.Tensor:
        q, k, v = F.linear(xs, wd).view(1, S, 3, 2, 8).permute(2, 0, 3, 1, 4).unbind(0)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    dt_cp.forget_layouts()
    xs = dt_cp.shard_sequence(x, mesh, 1, load_balancer="head_tail").requires_grad_()
    wd = distribute_tensor(w, mesh, [Replicate()]).requires_grad_()
    with pytest.raises(dt_cp.LayoutMismatchError, match="'head_tail'"):
        attend(xs, wd)

    # under the matching settings: exact, values and gradients, against one process
    with dt_cp.settings(load_balancer="head_tail"):
        out = attend(xs, wd)
        out.sum().backward()
        got = dt_cp.unshard_sequence(out, 2)
        grad_x = dt_cp.unshard_sequence(xs.grad, 1)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    want = attend(xr, wr)
    want.sum().backward()
    # float64; sums over the sequence run in another order on 2 ranks
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(grad_x, xr.grad, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(wd.grad.full_tensor(), wr.grad, atol=1e-10, rtol=1e-10)


@pytest.mark.ranks(2)
def test_forgetting_the_layouts_lets_plain_sharding_run_as_before() -> None:
    """A plainly sharded sequence of a length shard_sequence balanced earlier is refused
    (the record cannot tell the tensors apart); forget_layouts() drops the record."""
    import dt_cp
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = cpu_mesh(2)
    q, k, v = _qkv(seed=1)
    dt_cp.forget_layouts()
    dt_cp.shard_sequence(q, mesh, 2, load_balancer="head_tail")
    plain = [distribute_tensor(t, mesh, [Shard(2)]) for t in (q, k, v)]
    with pytest.raises(dt_cp.LayoutMismatchError, match="forget_layouts"):
        _causal(*plain)
    dt_cp.forget_layouts()
    got = _causal(*plain)
    assert got.placements == (Shard(2),)
    torch.testing.assert_close(got.full_tensor(), _causal(q, k, v), atol=1e-12, rtol=0)


def test_layouts_in_the_same_order_agree() -> None:
    """On one rank every balancer is the natural order; a document balancer with one
    document is head-tail."""
    from dt_cp.layout import SequenceLayout
    from dt_cp.records import same_order

    assert same_order(SequenceLayout(16, 1, "head_tail"), SequenceLayout(16, 1))
    assert same_order(SequenceLayout(16, 2, "document", (16,)), SequenceLayout(16, 2, "head_tail"))
    assert not same_order(SequenceLayout(16, 2, "head_tail"), SequenceLayout(16, 2))
    assert not same_order(SequenceLayout(16, 2), SequenceLayout(17, 2))


@pytest.mark.ranks(2, timeout=600)
def test_a_compiled_attention_checks_its_traced_layout_at_every_call() -> None:
    """torch.compile does not see dt-cp's settings: a graph traced under "head_tail" ran
    unchanged on sequences laid out by document or not at all (wrong by about 1). The
    traced gather carries its layout and refuses a call under other settings."""
    import dt_cp
    import torch._dynamo
    import torch.nn.functional as F

    torch._dynamo.reset()
    mesh = cpu_mesh(2)
    q, k, v = _qkv(seed=2)
    want = _causal(q, k, v)

    def attend(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(a, b, c, is_causal=True)

    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)
    dt_cp.forget_layouts()
    with dt_cp.settings(load_balancer="head_tail"):
        traced = [dt_cp.shard_sequence(t, mesh, 2) for t in (q, k, v)]
        got = dt_cp.unshard_sequence(compiled(*traced), 2)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    for balancer, docs in (("document", [20, 44]), ("none", None)):
        dt_cp.forget_layouts()
        with dt_cp.settings(load_balancer=balancer, documents=docs):
            other = [dt_cp.shard_sequence(t, mesh, 2) for t in (q, k, v)]
            with pytest.raises(dt_cp.LayoutMismatchError, match="traced with load_balancer"):
                compiled(*other)
    # another length recompiles with the length a symbol (dynamic shapes): exact; then a
    # plain layout at a third length either compiles anew (exact) or meets the traced
    # check, never a result in the wrong order
    q2, k2, v2 = (t[:, :, :40] for t in (q, k, v))
    with dt_cp.settings(load_balancer="head_tail"):
        balanced = [dt_cp.shard_sequence(t, mesh, 2) for t in (q2, k2, v2)]
        got = dt_cp.unshard_sequence(compiled(*balanced), 2)
    torch.testing.assert_close(got, _causal(q2, k2, v2), atol=1e-12, rtol=0)
    q3, k3, v3 = (t[:, :, :48] for t in (q, k, v))
    try:
        out = compiled(*(dt_cp.shard_sequence(t, mesh, 2) for t in (q3, k3, v3)))
    except dt_cp.LayoutMismatchError as error:
        assert "traced with load_balancer='head_tail'" in str(error)
    else:
        torch.testing.assert_close(out.full_tensor(), _causal(q3, k3, v3), atol=1e-12, rtol=0)
    # traced again for the new layout: exact
    torch._dynamo.reset()
    dt_cp.forget_layouts()
    with dt_cp.settings(load_balancer="document", documents=[20, 44]):
        by_doc = [dt_cp.shard_sequence(t, mesh, 2) for t in (q, k, v)]
        got = dt_cp.unshard_sequence(compiled(*by_doc), 2)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
