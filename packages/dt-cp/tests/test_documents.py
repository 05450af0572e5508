"""Per-document load balancing of packed sequences (load_balancer="document").

Layout properties (a permutation with torch's Shard sizes, every rank a fair share of
every document), the per-rank causal work under a document mask counted from a dense
mask built here (not by dt-cp), and exact attention against one process on 2 and 4 ranks.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cp_cases import compare, run_all, sdpa
from dt_core.testing import cpu_mesh
from hypothesis import given, settings
from hypothesis import strategies as st
from test_flex import dense_reference


def doc_ids(lengths: tuple[int, ...]) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths, dtype=int))


def document_causal(lengths: tuple[int, ...]):
    doc = doc_ids(lengths)

    def mask_mod(b, h, q, kv):
        return (doc[q] == doc[kv]) & (kv <= q)

    return mask_mod


def visible_pairs(lengths: tuple[int, ...], positions: torch.Tensor) -> int:
    """(query, key) pairs a document + causal mask lets `positions` see, from a dense mask."""
    doc = doc_ids(lengths)
    n = len(doc)
    q = torch.arange(n).view(-1, 1)
    k = torch.arange(n).view(1, -1)
    dense = (doc.view(-1, 1) == doc.view(1, -1)) & (k <= q)
    return int(dense[positions].sum())


def work_ratio(lengths: tuple[int, ...], parts: int, balancer: str, per_row: bool = False) -> float:
    """max/min over ranks of visible pairs (per held row: Shard's sizes can be unequal)."""
    from dt_cp.layout import SequenceLayout

    docs = lengths if balancer == "document" else None
    layout = SequenceLayout(sum(lengths), parts, balancer, docs)
    work = []
    for r in range(parts):
        mine = layout.positions(r)
        work.append(visible_pairs(lengths, mine) / (len(mine) if per_row else 1))
    return max(work) / min(work)


@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=6),
    parts=st.integers(1, 5),
)
@settings(max_examples=60, deadline=None)
def test_document_layout_is_a_fair_permutation(lengths, parts) -> None:
    from dt_cp.layout import SequenceLayout, shard_sizes

    lengths = tuple(lengths)
    total = sum(lengths)
    layout = SequenceLayout(total, parts, "document", lengths)
    assert sorted(layout.permutation().tolist()) == list(range(total))
    sizes = shard_sizes(total, parts)
    doc = doc_ids(lengths)
    for rank in range(parts):
        mine = layout.positions(rank)
        assert len(mine) == sizes[rank]
        for d, n in enumerate(lengths):  # a fair share of every document
            share = int((doc[mine] == d).sum())
            assert abs(share - n * sizes[rank] / max(total, 1)) < 2


@pytest.mark.parametrize("parts", [2, 4])
def test_document_balancer_evens_document_causal_work(parts) -> None:
    lengths = (3001, 700, 1499, 800)  # uneven documents, uneven total per rank
    assert work_ratio(lengths, parts, "document") < 1.01
    assert work_ratio(lengths, parts, "head_tail") > 1.3  # position-wise balance misses
    assert work_ratio(lengths, parts, "none") > 1.3


@given(
    lengths=st.lists(st.integers(64, 400), min_size=1, max_size=5),
    parts=st.sampled_from([2, 4]),
)
@settings(max_examples=15, deadline=None)
def test_document_balance_holds_for_random_documents(lengths, parts) -> None:
    # Not exactly 1: each rank's share of a document is rounded to whole rows (head and
    # tail piece), which shifts its work by up to about two rows in a share of
    # min(lengths) / parts rows (worst seen over the domain: 1.55 rows, lengths=[68], P=4).
    bound = 1 + 2 * parts / min(lengths)
    assert work_ratio(tuple(lengths), parts, "document", per_row=True) < bound


def test_document_balancer_needs_matching_lengths() -> None:
    from dt_cp.layout import SequenceLayout

    with pytest.raises(ValueError, match="document lengths"):
        SequenceLayout(10, 2, "document")
    with pytest.raises(ValueError, match="sum to the sequence length 10"):
        SequenceLayout(10, 2, "document", (4, 5))


def document_cases(world: int) -> None:
    import dt_cp

    mesh = cpu_mesh(world)
    cases = []
    for lengths in ((9, 2, 7, 5), (5, 11), (0, 13, 1, 6)):
        s = sum(lengths)
        mask_mod = document_causal(lengths)
        for algorithm in ("ring", "allgather"):
            name = f"{lengths} {algorithm}"

            def flex(algorithm=algorithm, name=name, mask_mod=mask_mod, s=s, lengths=lengths):
                # Small blocks, so the BlockMask's sparsity really skips range pairs.
                bm = dt_cp.create_block_mask(mask_mod, None, None, s, s, BLOCK_SIZE=4)

                def attend(q, k, v):
                    return dt_cp.flex_attention(q, k, v, block_mask=bm, enable_gqa=True)

                with dt_cp.settings(algorithm=algorithm):
                    return compare(
                        "flex " + name,
                        attend,
                        dense_reference(None, mask_mod, gqa=True),
                        mesh,
                        (1, 4, s, 8),
                        kv_heads=2,
                        balancer="document",
                        documents=lengths,
                    )

            def causal(algorithm=algorithm, name=name, s=s, lengths=lengths, mask_mod=mask_mod):
                idx = torch.arange(s)
                dense = mask_mod(0, 0, idx.view(-1, 1), idx.view(1, -1))
                with dt_cp.settings(algorithm=algorithm):
                    return compare(
                        "sdpa causal " + name,
                        sdpa(is_causal=True),
                        sdpa(is_causal=True),
                        mesh,
                        (2, 2, s, 8),
                        balancer="document",
                        documents=lengths,
                    ) or compare(
                        "sdpa document mask " + name,
                        sdpa(attn_mask=dense),
                        lambda q, k, v: F.scaled_dot_product_attention(
                            q, k, v, attn_mask=dense
                        ).nan_to_num(0.0),
                        mesh,
                        (1, 2, s, 8),
                        balancer="document",
                        documents=lengths,
                    )

            cases += [("flex", flex), ("sdpa", causal)]

    def roundtrip():
        t = torch.randn(
            1, 2, 23, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
        )
        lengths = (9, 2, 7, 5)
        d = dt_cp.shard_sequence(t, mesh, 2, load_balancer="document", documents=lengths)
        back = dt_cp.unshard_sequence(d, 2, load_balancer="document", documents=lengths)
        return None if torch.equal(back, t) else "document shard/unshard roundtrip"

    cases.append(("roundtrip", roundtrip))
    run_all(cases)


@pytest.mark.ranks(2, 4)
def test_documents(world_size: int) -> None:
    document_cases(world_size)
