"""What `shard_sequence` laid out, so attention and `unshard_sequence` can check theirs.

A load-balanced sequence is an ordinary `Shard(seq_dim)` DTensor whose positions are
permuted; nothing in the DTensor says so, and nothing could travel with it: torch's
sharding strategies build fresh `Shard` placements for every op's output, so a marked
placement or an attribute is gone after the first projection. Causal attention needs the
order, and reads it from the settings in force. So `shard_sequence` records the layout it
chose under a key attention can see again on any tensor derived from the sharded one: the
mesh's value (device type, shape and ranks), the mesh dim that shards the sequence, and
the sequence length. By value, not by the mesh object: torch's sharding propagation
caches its output specs by value, so an op's output can carry an equal mesh object from
an earlier call; the records keep their meshes alive (at most `MAX_RECORDS` of them).
Attention and `unshard_sequence` compare the layout they are about to use with the
record and raise `LayoutMismatchError` naming both:

- a recorded layout that differs from the one in force (sharded "head_tail", attended
  without balancing; sharded "document", attended "head_tail"; other document lengths);
- no record, while the settings ask for a balanced order (a plainly sharded tensor
  attended under `dt_cp.settings(load_balancer="head_tail")`).

The newest record per key wins, so a training loop that shards every batch with new
document lengths is checked against its own batch. `dt_cp.forget_layouts()` (or
`dt_core.forget()`, which dt-core's test harness calls after every test) drops them all:
for a program that, after balancing a sequence, attends a plainly sharded one of the
same length on the same ranks, which the record would refuse. A record is a check, not
a source of truth: the layout in force still comes from the settings (or torch's
context-parallel state, which dt-cp checks separately), and a mismatch is an error,
never a guess.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from typing import Any

from dt_core.remembered import on_forget

from .config import LOAD_BALANCERS, current
from .layout import Range, SequenceLayout

# Distinct (mesh, mesh dim, length) keys kept; the oldest is dropped past this.
MAX_RECORDS = 256

# Keyed by the mesh itself, which hashes and compares by value (as torch's caches use it,
# also while a graph is traced, where its rank tensor cannot be read).
_records: OrderedDict[tuple[Any, int, int], SequenceLayout] = OrderedDict()


class LayoutMismatchError(ValueError):
    """The sequence layout attention (or `unshard_sequence`) would use is not the one
    `shard_sequence` laid the tensor out with: the result would be silently wrong."""


def record(mesh: Any, mesh_dim: int, layout: SequenceLayout) -> None:
    """Remember that `shard_sequence` laid a sequence of `layout.length` out on `mesh`'s
    dim `mesh_dim` in `layout`."""
    key = (mesh, mesh_dim, layout.length)
    _records.pop(key, None)
    _records[key] = layout
    while len(_records) > MAX_RECORDS:
        _records.popitem(last=False)


def recorded(mesh: Any, mesh_dim: int, length: int) -> SequenceLayout | None:
    """The newest layout `shard_sequence` recorded for this key, or None."""
    return _records.get((mesh, mesh_dim, length))


@on_forget
def forget_layouts() -> None:
    """Forget every layout `shard_sequence` recorded: for a program that, after sharding
    with a balancer, attends plainly sharded sequences of the same length on the same
    ranks (which the record would refuse). `dt_core.forget()` calls it too."""
    _records.clear()


def check(mesh: Any, mesh_dim: int, layout: SequenceLayout, what: str) -> None:
    """Raise `LayoutMismatchError` if `layout`, which `what` is about to use for a
    sequence sharded on `mesh`'s dim `mesh_dim`, is not what `shard_sequence` recorded,
    or is balanced where nothing was recorded. A length a graph is traced with as a
    symbol (dynamic shapes) is not looked up: its first, static trace was; every call of
    the graph checks the settings (`check_traced`)."""
    if not isinstance(layout.length, int):
        return
    seen = recorded(mesh, mesh_dim, layout.length)
    if seen is None:
        if _is_natural(layout):
            return
        raise LayoutMismatchError(
            f"dt-cp: {what} would read a sequence of length {layout.length} in the "
            f"{describe(layout)} order, but no dt_cp.shard_sequence call laid a sequence "
            "of that length out on this mesh dim: a plainly sharded tensor "
            "(distribute_tensor) is in natural order. Shard it with "
            f"dt_cp.shard_sequence(..., load_balancer={layout.balancer!r}), or run "
            "without load balancing."
        )
    if same_order(seen, layout):
        return
    raise LayoutMismatchError(
        f"dt-cp: {what} would read a sequence of length {layout.length} in the "
        f"{describe(layout)} order, but dt_cp.shard_sequence laid it out in the "
        f"{describe(seen)} order. Run attention under dt_cp.settings(...) matching the "
        "shard_sequence call (or pass that call's load_balancer and documents to "
        "unshard_sequence). If this tensor was sharded otherwise (distribute_tensor "
        "after the shard_sequence call), dt_cp.forget_layouts() drops the record."
    )


def describe(layout: SequenceLayout) -> str:
    """A layout as its settings name it, for error messages."""
    if layout.balancer == "document":
        return f"load_balancer='document' (documents={list(layout.documents or ())})"
    return f"load_balancer={layout.balancer!r}"


def same_order(a: SequenceLayout, b: SequenceLayout) -> bool:
    """Whether two layouts put the same global positions on every rank, in order (on one
    rank every balancer is the natural order, for instance)."""
    if a.length != b.length or a.parts != b.parts:
        return False
    return all(_merged(a.ranges(r)) == _merged(b.ranges(r)) for r in range(a.parts))


def _is_natural(layout: SequenceLayout) -> bool:
    natural = SequenceLayout(layout.length, layout.parts)
    return same_order(layout, natural)


def _merged(ranges: list[Range]) -> list[Range]:
    """Ranges with adjacent ones joined and empty ones dropped."""
    out: list[Range] = []
    for start, length in ranges:
        if length == 0:
            continue
        if out and out[-1][0] + out[-1][1] == start:
            out[-1] = (out[-1][0], out[-1][1] + length)
        else:
            out.append((start, length))
    return out


# --- compiled graphs: the layout a graph was traced with, checked at every call ----------
#
# torch.compile does not see dt-cp's settings: a graph traced under one layout would run
# unchanged on tensors laid out another way. So the traced all-gather
# (`dt_cp::all_gather_seq`) carries the balancer and document lengths it was traced with,
# and its kernel checks them against the settings each time the graph runs, for the
# length and rank count the call's shard sizes give. (The record was checked when the
# graph was traced; the graph carries no mesh to look a newer record up by.)


def encode(layout: SequenceLayout) -> str:
    """`layout`'s balancer and documents as the string a traced graph carries (the length
    may be a symbol there); empty for layouts chosen outside dt-cp's settings (torch's
    context-parallel state), which are not checked here."""
    if layout.balancer not in LOAD_BALANCERS:
        return ""
    docs = ",".join(str(int(n)) for n in layout.documents or ())
    return f"{layout.balancer};{docs}"


def _decode(encoded: str, length: int, parts: int) -> SequenceLayout:
    balancer, docs = encoded.split(";")
    documents = tuple(int(n) for n in docs.split(",")) if docs else None
    return SequenceLayout(length, parts, balancer, documents)


def check_traced(encoded: str, sizes: list[int]) -> None:
    """Raise `LayoutMismatchError` if a compiled attention traced with `encoded`'s layout
    runs, on shards of `sizes`, under settings that lay the sequence out otherwise."""
    if not encoded:
        return
    settings = current()
    length, parts = sum(sizes), len(sizes)
    if _settings_agree(encoded, length, parts, settings.load_balancer, settings.documents):
        return
    raise LayoutMismatchError(
        f"dt-cp: this compiled attention was traced with "
        f"{describe(_decode(encoded, length, parts))}, but runs under "
        f"load_balancer={settings.load_balancer!r}"
        + (f" (documents={list(settings.documents)})" if settings.documents else "")
        + ". torch.compile does not see dt-cp's settings, so the graph would read the "
        "sequence in the traced order: compile the function again for this layout "
        "(torch._dynamo.reset(), or one compiled function per layout)."
    )


@functools.lru_cache(maxsize=256)
def _settings_agree(
    encoded: str, length: int, parts: int, balancer: str, documents: tuple[int, ...] | None
) -> bool:
    traced = _decode(encoded, length, parts)
    if balancer == "document" and (documents is None or sum(documents) != length):
        return False
    now = SequenceLayout(length, parts, balancer, documents if balancer == "document" else None)
    return same_order(traced, now)
