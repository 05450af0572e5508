"""torch's own flex_attention on sequence-sharded DTensors, through dt-cp's HOP rules.

No opt-in call: the plugin contributes the rules through dt-core's `dt_hop_rules` hook.
Forward and backward through torch's front end (on CPU, where torch itself refuses
backward for plain tensors) and through the operator itself, against a dense float64
reference.
"""

from __future__ import annotations

import math

import pytest
import torch
from dt_core.testing import cpu_mesh


def dense(q, k, v, score_mod, mask_mod):
    b, h, s, e = q.shape
    scores = q @ k.transpose(-1, -2) / math.sqrt(e)
    idx = [
        torch.arange(n).view(*([1] * i), n, *([1] * (3 - i))) for i, n in enumerate((b, h, s, s))
    ]
    scores = score_mod(scores, *idx) + 0 * scores
    scores = scores.masked_fill(~torch.broadcast_to(mask_mod(*idx), scores.shape), float("-inf"))
    return torch.softmax(scores, -1) @ v


@pytest.mark.ranks(2)
def test_torch_flex_attention_on_dtensors() -> None:
    import dt_cp
    from dt_cp.compat.attention import flex_attention_hops
    from torch.nn.attention.flex_attention import flex_attention

    mesh = cpu_mesh(2)
    hop, _ = flex_attention_hops()
    gen = torch.Generator().manual_seed(0)
    s = 13
    q, k, v, g = (torch.randn(1, 2, s, 8, generator=gen, dtype=torch.float64) for _ in "qkvg")

    # No captured tensors: torch traces mods with DTensor index values, and indexing a
    # captured plain tensor with those fails in torch (dt_cp.flex_attention has no such limit).
    def score_mod(score, b, h, qi, ki):
        return score - 0.1 * (h + 1) * (qi - ki)

    def mask_mod(b, h, qi, ki):
        return (ki <= qi) & (qi - ki < 6)

    block_mask = dt_cp.create_block_mask(mask_mod, None, None, s, s)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    want = dense(*ref, score_mod, mask_mod)
    (want * g).sum().backward()
    for algorithm, balancer in (("ring", "head_tail"), ("allgather", "none")):
        with dt_cp.settings(algorithm=algorithm, load_balancer=balancer):
            qd, kd, vd, gd = (dt_cp.shard_sequence(t, mesh, 2) for t in (q, k, v, g))
            # torch's front end, no gradients
            out = flex_attention(qd, kd, vd, score_mod=score_mod, block_mask=block_mask)
            torch.testing.assert_close(
                dt_cp.unshard_sequence(out, 2), want.detach(), atol=1e-10, rtol=0
            )
            # torch's front end with gradients, then the operator itself
            for call in ("front end", "operator"):
                leaves = [t.detach().requires_grad_() for t in (qd, kd, vd)]
                if call == "front end":
                    out2 = flex_attention(*leaves, score_mod=score_mod, block_mask=block_mask)
                else:
                    args = (score_mod, block_mask.as_tuple(), 1 / math.sqrt(8), {})
                    out2, _, _ = hop(*leaves, *args)
                (out2 * gd).sum().backward()
                torch.testing.assert_close(
                    dt_cp.unshard_sequence(out2, 2), want.detach(), atol=1e-10, rtol=0
                )
                for got, r in zip(leaves, ref, strict=True):
                    torch.testing.assert_close(
                        dt_cp.unshard_sequence(got.grad, 2), r.grad, atol=1e-10, rtol=0
                    )
    # Plain CPU tensors that need gradients: torch's own refusal is untouched.
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_attention(*(t.clone().requires_grad_() for t in (q, k, v)), block_mask=block_mask)


@pytest.mark.ranks(2)
def test_deprecated_install_flex_rule_changes_nothing_while_dt_core_is_active() -> None:
    """dt-core installed the rules; the deprecated calls warn and leave them (and torch's
    flex check's patch) exactly as they are: there is no second install path."""
    import dt_cp
    import torch.nn.attention.flex_attention as front_end
    from dt_cp.compat.attention import flex_attention_hops
    from dt_cp.flex_hop import hop_backward, hop_forward
    from torch.distributed.tensor import DTensor

    hop, hop_b = flex_attention_hops()
    plugin_rules = (hop.python_key_table[DTensor], hop_b.python_key_table[DTensor])
    device_check = front_end._validate_device
    assert plugin_rules != (hop_forward, hop_backward)  # dt-core's wrappers, not the bare rules
    with pytest.warns(DeprecationWarning, match="no longer needed"):
        dt_cp.install_flex_rule()
    assert (hop.python_key_table[DTensor], hop_b.python_key_table[DTensor]) == plugin_rules
    dt_cp.remove_flex_rule()
    assert (hop.python_key_table[DTensor], hop_b.python_key_table[DTensor]) == plugin_rules
    assert front_end._validate_device is device_check


@pytest.mark.ranks(2)
def test_torch_flex_attention_with_captured_tensors_under_implicit_replication() -> None:
    """A document mask indexing a captured plain tensor, document-balanced, via torch's
    front end: torch traces the mod with DTensor indices, which `implicit_replication`
    (public torch API) lets index the plain tensor."""
    import dt_cp
    from torch.distributed.tensor.experimental import implicit_replication
    from torch.nn.attention.flex_attention import flex_attention

    # Ranks are reused across tests: after torch's front end has compiled for other shapes
    # it compiles with dynamic shapes, and then indexing the captured tensor with DTensor
    # indices fails inside torch (symbolic sizes); start from a clean compile cache.
    torch.compiler.reset()
    mesh = cpu_mesh(2)
    lengths = (5, 2, 7)
    s = sum(lengths)
    doc = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))

    def mask_mod(b, h, qi, ki):
        return (doc[qi] == doc[ki]) & (ki <= qi)

    def zero(score, b, h, qi, ki):
        return score

    gen = torch.Generator().manual_seed(1)
    q, k, v, g = (torch.randn(1, 2, s, 8, generator=gen, dtype=torch.float64) for _ in "qkvg")
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    want = dense(*ref, zero, mask_mod)
    (want * g).sum().backward()
    block_mask = dt_cp.create_block_mask(mask_mod, None, None, s, s, BLOCK_SIZE=4)
    with dt_cp.settings(load_balancer="document", documents=lengths):
        leaves = [dt_cp.shard_sequence(t, mesh, 2).requires_grad_() for t in (q, k, v)]
        with implicit_replication():
            out = flex_attention(*leaves, block_mask=block_mask)
        (out * dt_cp.shard_sequence(g, mesh, 2)).sum().backward()
        torch.testing.assert_close(
            dt_cp.unshard_sequence(out, 2), want.detach(), atol=1e-10, rtol=0
        )
        for got, r in zip(leaves, ref, strict=True):
            torch.testing.assert_close(
                dt_cp.unshard_sequence(got.grad, 2), r.grad, atol=1e-10, rtol=0
            )


def test_deprecated_install_flex_rule_goes_through_dt_core_only() -> None:
    """With autoload off nothing is installed; the deprecated call warns and activates
    dt-core (the one install path: the HOP rules and the flex check's patch come from
    there), and `remove_flex_rule()` deactivates what it activated, torch's check back."""
    import os

    from dt_core.testing.scripts import run_python

    out = run_python(
        """
        import warnings
        import torch
        import dt_core, dt_cp
        import torch.nn.attention.flex_attention as front_end
        from torch._higher_order_ops.flex_attention import flex_attention_backward
        from torch.distributed.tensor import DTensor

        original = front_end._validate_device
        print("BEFORE", dt_core.is_active(), DTensor in flex_attention_backward.python_key_table)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dt_cp.install_flex_rule()
        print("WARNED", [w.category.__name__ for w in caught])
        rule = DTensor in flex_attention_backward.python_key_table
        print("AFTER", dt_core.is_active(), rule, front_end._validate_device is not original)
        dt_cp.remove_flex_rule()
        rule = DTensor in flex_attention_backward.python_key_table
        print("REMOVED", dt_core.is_active(), rule, front_end._validate_device is original)
        """,
        env={**os.environ, "DT_PLUGINS_AUTOLOAD": "0"},
    )
    assert "BEFORE False False" in out, out
    assert "WARNED ['DeprecationWarning']" in out, out
    assert "AFTER True True True" in out, out
    assert "REMOVED False False True" in out, out
