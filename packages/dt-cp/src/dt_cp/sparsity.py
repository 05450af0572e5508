"""Which (query range, key range) pairs a BlockMask leaves entirely masked.

torch's flex attention computes only the blocks a BlockMask lists (partial or full) and
treats every other block as masked. dt-cp's range-pair kernels apply the same rule and
skip pairs that touch no listed block (with document masks, most cross-document pairs),
so each rank's work follows the mask — which is what document load balancing evens out.
The mask_mod still decides every element of the pairs that run.
"""

from __future__ import annotations

from typing import Any

import torch


def _listed(num: torch.Tensor, indices: torch.Tensor, kv_blocks: int) -> torch.Tensor:
    """(q blocks, kv blocks) bool: listed for any batch row or head."""
    num = num.reshape(-1, num.shape[-1]).to("cpu", torch.long)
    indices = indices.reshape(-1, *indices.shape[-2:]).to("cpu", torch.long)
    valid = torch.arange(indices.shape[-1]) < num.unsqueeze(-1)
    target = torch.where(valid, indices.clamp(0, kv_blocks - 1), kv_blocks)
    dense = torch.zeros(*indices.shape[:-1], kv_blocks + 1, dtype=torch.bool)
    dense.scatter_(-1, target, True)
    return dense[..., :kv_blocks].any(0)


class BlockVisibility:
    """`visibility(q0, qn, k0, kn)`: does the global range pair touch a listed block?"""

    def __init__(
        self,
        kv_len: int,
        kv_num_blocks: torch.Tensor,
        kv_indices: torch.Tensor,
        full_kv_num_blocks: torch.Tensor | None,
        full_kv_indices: torch.Tensor | None,
        q_block: int,
        kv_block: int,
    ) -> None:
        kv_blocks = max(1, -(-kv_len // kv_block))
        listed = _listed(kv_num_blocks, kv_indices, kv_blocks)
        if full_kv_num_blocks is not None and full_kv_indices is not None:
            listed |= _listed(full_kv_num_blocks, full_kv_indices, kv_blocks)
        counts = torch.zeros(listed.shape[0] + 1, kv_blocks + 1, dtype=torch.long)
        counts[1:, 1:] = listed.long().cumsum(0).cumsum(1)
        self._counts = counts
        self._q_block, self._kv_block = q_block, kv_block

    @classmethod
    def from_tuple(cls, block_mask: tuple) -> BlockVisibility:
        """From `BlockMask.as_tuple()` (what torch's flex_attention operator receives)."""
        kv_num, kv_indices, full_num, full_indices = block_mask[2:6]
        return cls(
            block_mask[1],
            kv_num,
            kv_indices,
            full_num,
            full_indices,
            block_mask[-3],
            block_mask[-2],
        )

    @classmethod
    def from_block_mask(cls, block_mask: Any) -> BlockVisibility:
        return cls.from_tuple(block_mask.as_tuple())

    def __call__(self, q0: int, qn: int, k0: int, kn: int) -> bool:
        if qn <= 0 or kn <= 0:
            return False
        rows = self._counts.shape[0] - 1
        cols = self._counts.shape[1] - 1
        a, b = min(q0 // self._q_block, rows), min((q0 + qn - 1) // self._q_block + 1, rows)
        c, d = min(k0 // self._kv_block, cols), min((k0 + kn - 1) // self._kv_block + 1, cols)
        t = self._counts
        return bool(t[b, d] - t[a, d] - t[b, c] + t[a, c] > 0)
