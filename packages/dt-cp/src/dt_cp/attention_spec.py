"""What a block kernel computes and the tensors that travel with it.

Its own module because both leaf kernels (fused_cpu_kernel.py, math_kernel.py), the
block driver (blocks.py) and every path above them share these types; apart, the kernels
need not import the driver that picks them. A spec is in global coordinates: masks see
global positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

Position = tuple[int, int, int, int]  # (q0, qn, k0, kn): a range pair in global positions

NEG_INF = float("-inf")


@dataclass(frozen=True)
class AttentionSpec:
    """What to compute, in global coordinates (masks see global positions)."""

    scale: float
    causal: bool = False
    attn_mask: torch.Tensor | None = None  # additive float or bool, broadcast to (B,H,L,S)
    score_mod: Callable[..., torch.Tensor] | None = None
    mask_mod: Callable[..., torch.Tensor] | None = None
    native: bool = False  # use torch's fused CPU kernel (no score_mod / mask_mod)
    score_mod_vjp: Callable[..., torch.Tensor] | None = None  # (raw, b, h, q, kv, grad)
    batch_offset: int = 0  # global index of the first local batch row (score/mask mods)
    head_offset: int = 0  # global index of the first local head
    # (q0, qn, k0, kn) -> whether a BlockMask lists any block of the pair (None: all run)
    visible: Callable[[int, int, int, int], bool] | None = None


class KV(NamedTuple):
    """A block's keys and values (sequence on dim 2), or their gradients: they travel,
    slice and accumulate together."""

    k: torch.Tensor
    v: torch.Tensor

    def rows(self, lo: int, hi: int) -> KV:
        return KV(self.k[:, :, lo:hi], self.v[:, :, lo:hi])


class Saved(NamedTuple):
    """The query side of backward: the incoming gradient, the queries, and the forward's
    final (merged) output and log-sum-exp, which make each block's gradient exact alone."""

    dout: torch.Tensor
    q: torch.Tensor
    out: torch.Tensor
    lse: torch.Tensor

    def rows(self, lo: int, hi: int) -> Saved:
        return Saved(*(t[:, :, lo:hi] for t in self))


class Grads(NamedTuple):
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor


def mask_slice(spec: AttentionSpec, q0: int, qn: int, k0: int, kn: int) -> torch.Tensor | None:
    """The user's attn_mask for this pair of global ranges (or None)."""
    m = spec.attn_mask
    if m is None:
        return None
    return m[..., q0 : q0 + qn, k0 : k0 + kn]


def causal_mask(q0: int, qn: int, k0: int, kn: int, device: torch.device | str) -> torch.Tensor:
    qi = torch.arange(q0, q0 + qn, device=device)[:, None]
    kj = torch.arange(k0, k0 + kn, device=device)[None, :]
    return kj <= qi
