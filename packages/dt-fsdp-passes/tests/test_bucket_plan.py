"""How collectives are grouped into buckets (plan_buckets) and which block each belongs to.

Pure planning, no process group: the properties every mode must keep (order, whole
blocks, compatible neighbours only), and the bound the default mode exists for: no bucket
gathers more than the largest block, so peak memory stays within FSDP2's per-block unit.
"""

from __future__ import annotations

import pytest
import torch
from dt_fsdp_passes.bucketing import Bucket, Collective, _module_key, plan_buckets
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx

KIB = 1024


def _collective(key: str | None, nbytes: int, group: str = "g0", dtype=torch.float32) -> Collective:
    graph = fx.Graph()
    node = graph.placeholder("x")  # planning never looks at the nodes
    return Collective(node, node, node, group, 2, dtype, None, nbytes, key)


@st.composite
def _sequences(draw) -> list[Collective]:
    """Blocks in execution order, each a run of collectives with the block's key; some
    blocks (or single collectives) on another group or dtype; some without a key."""
    out: list[Collective] = []
    for index in range(draw(st.integers(0, 8))):
        key = draw(st.sampled_from([f"layers.{index}", None]))
        group = draw(st.sampled_from(["g0", "g0", "g1"]))
        dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.bfloat16]))
        for _ in range(draw(st.integers(1, 4))):
            out.append(_collective(key, draw(st.integers(1, 64)) * KIB, group, dtype))
    return out


def _compatible(a: Collective, b: Collective) -> bool:
    return (a.group_name, a.dtype) == (b.group_name, b.dtype)


def _blocks(seq: list[Collective]) -> list[list[Collective]]:
    """Runs of one key on one group and dtype (a keyless collective is a block alone)."""
    runs: list[list[Collective]] = []
    for c in seq:
        last = runs[-1][-1] if runs else None
        if last is not None and c.module_key is not None and c.module_key == last.module_key:
            if _compatible(last, c):
                runs[-1].append(c)
                continue
        runs.append([c])
    return runs


def _check_common(seq: list[Collective], buckets: list[Bucket]) -> None:
    assert [m for b in buckets for m in b.members] == seq  # order kept, nothing lost
    for bucket in buckets:
        assert all(_compatible(bucket.members[0], m) for m in bucket.members)
        assert bucket.kind == "all_gather"


@settings(max_examples=200, deadline=None)
@given(_sequences())
def test_auto_buckets_are_whole_blocks_within_the_largest_block(seq) -> None:
    buckets = plan_buckets(seq, "all_gather", "auto", cap_bytes=1.0)  # cap: not used by auto
    _check_common(seq, buckets)
    blocks = _blocks(seq)
    largest = max((sum(c.wire_bytes for c in b) for b in blocks), default=0)
    bucket_of = {id(m): i for i, b in enumerate(buckets) for m in b.members}
    for block in blocks:  # never split a block
        assert len({bucket_of[id(c)] for c in block}) == 1
    for bucket in buckets:  # the memory bound
        assert bucket.wire_bytes <= largest
    for a, b in zip(buckets, buckets[1:]):  # greedy: neighbours that could merge did
        head = next(block for block in blocks if block[0] is b.members[0])
        fits = a.wire_bytes + sum(c.wire_bytes for c in head) <= largest
        assert not (fits and _compatible(a.members[-1], b.members[0]))


@settings(max_examples=100, deadline=None)
@given(_sequences(), st.integers(1, 256))
def test_size_buckets_stay_under_the_cap_unless_alone(seq, cap_kib) -> None:
    buckets = plan_buckets(seq, "all_gather", "size", cap_bytes=cap_kib * KIB)
    _check_common(seq, buckets)
    for bucket in buckets:
        assert len(bucket.members) == 1 or bucket.wire_bytes <= cap_kib * KIB


@settings(max_examples=100, deadline=None)
@given(_sequences())
def test_module_buckets_are_exactly_the_blocks(seq) -> None:
    buckets = plan_buckets(seq, "all_gather", "module", cap_bytes=1.0)
    _check_common(seq, buckets)
    assert [b.members for b in buckets] == _blocks(seq)


def test_auto_merges_small_neighbours_up_to_the_largest_block() -> None:
    # embed 40 KiB, two layers of 64, norm 1 and head 32: norm joins head (33 <= 64), the
    # layers stay alone, embed cannot take layer 0 (104 > 64).
    sizes = {"embed": [40], "layers.0": [32, 32], "layers.1": [32, 32], "norm": [1], "head": [32]}
    seq = [_collective(key, n * KIB) for key, ns in sizes.items() for n in ns]
    buckets = plan_buckets(seq, "all_gather", "auto", cap_bytes=1.0)
    keys = [sorted({str(m.module_key) for m in b.members}) for b in buckets]
    assert keys == [["embed"], ["layers.0"], ["layers.1"], ["head", "norm"]]


def _node_with_stack(path: str, backward: bool = False) -> fx.Node:
    node = fx.Graph().placeholder("x")
    key = "fwd_nn_module_stack" if backward else "nn_module_stack"
    node.meta[key] = {"root": ("L['self']", object), "leaf": (path, object)}
    return node


@pytest.mark.parametrize(
    ("path", "block"),
    [
        ("L['self'].layers.3.attn.q", "layers.3"),
        ("L['self'].encoder.layers.3.attn.q", "encoder.layers.3"),
        ("L['self']._orig_mod.blocks.0.1", "blocks.0"),
        ("L['self'].head", "head"),
        ("L['self'].encoder.norm", "encoder"),
        ("L['self']", "<root>"),
    ],
)
def test_module_key_is_the_block_down_to_the_first_list_index(path, block) -> None:
    assert _module_key(_node_with_stack(path)) == block
    assert _module_key(_node_with_stack(path, backward=True)) == block
    assert _module_key(fx.Graph().placeholder("x")) is None
