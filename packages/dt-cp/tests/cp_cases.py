"""Shared checking code: one attention case sharded vs the same on one process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F


def make_qkv(shape: tuple, kv_heads: int, seed: int, dtype=torch.float64) -> list[torch.Tensor]:
    b, h, s, e = shape
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, s, e, generator=gen, dtype=dtype)
    k = torch.randn(b, kv_heads, s, e, generator=gen, dtype=dtype)
    v = torch.randn(b, kv_heads, s, e, generator=gen, dtype=dtype)
    g = torch.randn(b, h, s, e, generator=gen, dtype=dtype)
    return [q, k, v, g]


def compare(
    name: str,
    attend: Callable[..., torch.Tensor],
    reference: Callable[..., torch.Tensor],
    mesh: Any,
    shape: tuple,
    kv_heads: int | None = None,
    seed: int = 0,
    balancer: str = "none",
    atol: float = 1e-10,
    documents: tuple[int, ...] | None = None,
) -> str | None:
    """Run `attend` on sharded DTensors and `reference` on full tensors; describe mismatch."""
    import dt_cp
    from torch.distributed.tensor import Shard

    q, k, v, g = make_qkv(shape, kv_heads or shape[1], seed)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    y_ref = reference(*ref)
    (y_ref * g).sum().backward()
    with dt_cp.settings(load_balancer=balancer, documents=documents):
        qd, kd, vd = (dt_cp.shard_sequence(t, mesh, 2).requires_grad_() for t in (q, k, v))
        y = attend(qd, kd, vd)
        if tuple(y.placements) != (Shard(2),):
            return f"{name}: output placements {y.placements}"
        gd = dt_cp.shard_sequence(g, mesh, 2)
        (y * gd).sum().backward()
        got = [dt_cp.unshard_sequence(t, 2) for t in (y, qd.grad, kd.grad, vd.grad)]
    want = [y_ref.detach(), ref[0].grad, ref[1].grad, ref[2].grad]
    for label, a, b in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        if a.shape != b.shape:
            return f"{name}: {label} shape {tuple(a.shape)} != {tuple(b.shape)}"
        err = (a - b).abs().max().item() if a.numel() else 0.0
        if not err <= atol:
            return f"{name}: {label} max error {err:.3g}"
    return None


def sdpa(**kw: Any) -> Callable[..., torch.Tensor]:
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw)


def run_all(cases: list[tuple[str, Callable[[], str | None]]]) -> None:
    """Every case must pass without any dt-cp fallback warning."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        failures = [f for _, fn in cases if (f := fn()) is not None]
    fell_back = sorted({str(w.message) for w in caught if "dt-cp" in str(w.message)})
    assert not fell_back, fell_back
    assert not failures, f"{len(failures)}/{len(cases)} cases wrong:\n" + "\n".join(failures)
