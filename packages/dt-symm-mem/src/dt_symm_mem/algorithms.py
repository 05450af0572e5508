"""Micro-pipelined exchange patterns over a `ShmSymmMemory` workspace.

all_gather_consume: every rank publishes its shard(s) into its own buffer, consumes its
own shard first (peers copy meanwhile), then consumes each peer's shard as soon as its
flag says it is there, walking the ring from rank + 1 so ranks do not all read the same
peer at once.

produce_reduce_scatter: every rank produces the chunk each peer needs (directly into its
own buffer, in ring order, so the next destination can pull while the following chunk is
being produced), produces its own chunk last, then adds up the chunks addressed to it as
it reads them, holding one accumulator rather than every chunk.

Both work on any process-group size; multi-tensor shards (an fp8 shard plus its row-wise
scales) share one buffer at 64-byte aligned offsets. When the group cannot use shared
memory (several hosts, or disabled) both use the process group's ordinary collectives
(all_gather_single / all_to_all_single) with the same results.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence

import torch

from dt_symm_mem.collectives import all_gather_single, all_to_all_single
from dt_symm_mem.handle import ShmSymmMemory
from dt_symm_mem.workspace import get_workspace

ALIGN = 64
# Messages above STREAM_MIN_BYTES per rank stream through STREAM_SLOTS chunks of
# STREAM_CHUNK_BYTES per rank (measured on a 2-core host, see benchmarks/run.py): below
# it one whole-message copy costs less than the per-chunk Python steps.
STREAM_MIN_BYTES = 1 << 20
STREAM_CHUNK_BYTES = 512 << 10
STREAM_SLOTS = 2


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor."""
    return t.reshape(-1).view(torch.uint8)


def packed_offsets(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Byte offsets of consecutive pieces, each aligned to 64 bytes; and the total."""
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += -(-size // ALIGN) * ALIGN
    return offsets, total


def all_gather_consume(
    group: object,
    shards: Sequence[torch.Tensor],
    consumer: Callable[[list[torch.Tensor], int], None] | None,
    outs: Sequence[torch.Tensor | None] | None = None,
) -> None:
    """Gather `shards` (contiguous, same shapes on every rank) and call
    `consumer(pieces, src_rank)` (if any) for every rank's pieces, own rank first.
    `outs[i]`, when given, receives the gathered tensor i with rank r's piece at
    `outs[i][r]` (shape (world, *shard.shape), contiguous)."""
    offsets, total = packed_offsets([_nbytes(s) for s in shards])
    handle = get_workspace(group, total)
    if handle is None:
        _all_gather_consume_collective(group, shards, consumer, outs)
    else:
        _all_gather_consume(handle, shards, offsets, consumer, outs)


def all_gather_into(group: object, src: torch.Tensor, out: torch.Tensor) -> None:
    """Plain all-gather of a contiguous `src` into a contiguous `out` (world x src rows).
    Up to STREAM_MIN_BYTES: one memcpy in, one per peer out, own copy while peers write.
    Larger messages stream through a small ring of chunk slots (`_streamed_all_gather`)."""
    nbytes = src.numel() * src.element_size()
    streamed = nbytes > STREAM_MIN_BYTES
    handle = get_workspace(group, STREAM_CHUNK_BYTES * STREAM_SLOTS if streamed else nbytes)
    if handle is None:
        all_gather_single(_bytes_of(out), _bytes_of(src), group=group)
    elif streamed:
        _streamed_all_gather(handle, src.data_ptr(), out.data_ptr(), nbytes)
    else:
        _single_shot_all_gather(handle, src.data_ptr(), out.data_ptr(), nbytes)


def _single_shot_all_gather(handle: ShmSymmMemory, src: int, out: int, nbytes: int) -> None:
    rank, world = handle.rank, handle.world_size
    seq, slot = handle.begin_op()
    ctypes.memmove(handle.slot_address(rank, slot), src, nbytes)
    handle.publish(0, seq)
    ctypes.memmove(out + rank * nbytes, src, nbytes)
    for step in range(1, world):
        peer = (rank + step) % world
        handle.wait_published(peer, 0, seq)
        handle.read_bytes(peer, slot, 0, out + peer * nbytes, nbytes)


def _streamed_all_gather(handle: ShmSymmMemory, src: int, out: int, nbytes: int) -> None:
    """All-gather of `nbytes` per rank through a ring of STREAM_SLOTS chunks per rank.

    Why: a whole-message copy through shared memory moves every byte three times through
    DRAM (into the segment, out of it, plus the rank's own copy), which costs about 1.5
    memcpys of the output. Chunks small enough to stay in cache cut that to the output
    writes and one read of `src`: each chunk is copied into the ring and straight on into
    this rank's own rows while it is hot, and peers copy it out while it is still in the
    shared cache. A slot is reused once every peer has counted the chunk in it as
    consumed; a rank waiting for that keeps pulling whatever peers have published, so
    no rank can wait on one that is itself waiting.
    """
    rank, world = handle.rank, handle.world_size
    chunk, slots = STREAM_CHUNK_BYTES, STREAM_SLOTS
    seq, slot = handle.begin_op()
    key = seq << 32
    flags = handle.flags
    memmove = ctypes.memmove
    n = -(-nbytes // chunk)
    peers = [(rank + step) % world for step in range(1, world)]
    ring = handle.slot_address(rank, slot)
    own = out + rank * nbytes
    my_progress = handle.progress_word(rank)
    their_progress = [handle.progress_word(p) for p in peers]
    read_by_them = [handle.consumed_word(p, rank) for p in peers]
    read_by_me = [handle.consumed_word(rank, p) for p in peers]
    their_rings = [handle.slot_address(p, slot) for p in peers]
    dests = [out + p * nbytes for p in peers]
    pulled = [0] * len(peers)
    put = 0
    while True:
        moved = False
        blockers = []  # peers that have not yet consumed the chunk in the slot `put` needs
        if slots <= put < n:
            needed = key + put - slots + 1
            blockers = [
                (word, needed, p)
                for word, p in zip(read_by_them, peers, strict=True)
                if flags[word] < needed
            ]
        if put < n and not blockers:
            offset = put * chunk
            size = min(chunk, nbytes - offset)
            memmove(ring + (put % slots) * chunk, src + offset, size)
            put += 1
            flags[my_progress] = key + put
            memmove(own + offset, src + offset, size)
            moved = True
        for i in range(len(peers)):
            done = pulled[i]
            available = min(int(flags[their_progress[i]]) - key, n)
            if done >= available:
                continue
            while done < available:
                offset = done * chunk
                size = min(chunk, nbytes - offset)
                memmove(dests[i] + offset, their_rings[i] + (done % slots) * chunk, size)
                done += 1
                flags[read_by_me[i]] = key + done
            pulled[i] = done
            moved = True
        if moved:
            continue
        pending = [
            (their_progress[i], key + pulled[i] + 1, p)
            for i, p in enumerate(peers)
            if pulled[i] < n
        ]
        if put == n and not pending:
            return
        # Blockers found above may have consumed since: then wait_any returns at once.
        handle.wait_any(pending + blockers, "all-gather: waiting for a peer's chunk or free slot")


def _all_gather_consume_collective(
    group: object,
    shards: Sequence[torch.Tensor],
    consumer: Callable[[list[torch.Tensor], int], None] | None,
    outs: Sequence[torch.Tensor | None] | None,
) -> None:
    world, rank = group.size(), group.rank()  # type: ignore[attr-defined]  # a ProcessGroup
    gathered = []
    for i, shard in enumerate(shards):
        out = outs[i] if outs is not None else None
        if out is None or not out.is_contiguous():
            out = torch.empty((world, *shard.shape), dtype=shard.dtype)
        # Byte views: gloo has no float8 (or other exotic) dtypes, bytes are bytes.
        all_gather_single(_bytes_of(out), _bytes_of(shard.contiguous()), group=group)
        if outs is not None and outs[i] is not None and outs[i] is not out:
            outs[i].copy_(out)  # type: ignore[union-attr]  # outs[i] given: checked by the caller
        gathered.append(out)
    if consumer is None:
        return
    consumer(list(shards), rank)
    for step in range(1, world):
        peer = (rank + step) % world
        consumer([g[peer] for g in gathered], peer)


def _all_gather_consume(
    handle: ShmSymmMemory,
    shards: Sequence[torch.Tensor],
    offsets: list[int],
    consumer: Callable[[list[torch.Tensor], int], None] | None,
    outs: Sequence[torch.Tensor | None] | None,
) -> None:
    rank, world = handle.rank, handle.world_size
    seq, slot = handle.begin_op()
    for shard, offset in zip(shards, offsets, strict=True):
        handle.write_bytes(slot, offset, shard)
    handle.publish(0, seq)
    if consumer is not None:
        consumer(list(shards), rank)
    sizes = [_nbytes(s) for s in shards]
    bases = [o.data_ptr() if o is not None else 0 for o in outs or [None] * len(shards)]
    for step in range(1, world):
        peer = (rank + step) % world
        handle.wait_published(peer, 0, seq)
        pieces = []
        for i, (shard, offset) in enumerate(zip(shards, offsets, strict=True)):
            if bases[i]:
                handle.read_bytes(peer, slot, offset, bases[i] + peer * sizes[i], sizes[i])
                if consumer is not None:
                    pieces.append(outs[i][peer])  # type: ignore[index]  # given here
            elif consumer is not None:
                pieces.append(handle.buffer_view(peer, offset, shard.shape, shard.dtype, slot))
        if consumer is not None:
            consumer(pieces, peer)
    for i, shard in enumerate(shards):
        if bases[i]:
            ctypes.memmove(bases[i] + rank * sizes[i], shard.data_ptr(), sizes[i])


def _accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """Where a sum of `dtype` chunks is carried: float32 for floats narrower than it (one
    rounding at the end, as torch's own sum of 16-bit floats), int64 for integers and
    bools (torch's sum promotes them), the dtype itself otherwise."""
    if dtype.is_floating_point and dtype.itemsize < 4:
        return torch.float32
    if not dtype.is_floating_point and not dtype.is_complex:
        return torch.int64
    return dtype


def _finish(total: torch.Tensor, dtype: torch.dtype, reduce_op: str, world: int) -> torch.Tensor:
    """`total` (a sum over `world` chunks of `dtype`) as torch's sum / mean over them gives
    it: averaged for "avg", back in `dtype` unless torch's sum promotes it."""
    if reduce_op == "avg":
        total = total.div_(world)
    result_dtype = torch.int64 if total.dtype == torch.int64 else dtype
    return total if total.dtype == result_dtype else total.to(result_dtype)


def produce_reduce_scatter(
    group: object,
    chunk_shape: Sequence[int],
    dtype: torch.dtype,
    producer: Callable[[int, torch.Tensor], None],
    reduce_op: str,
) -> torch.Tensor:
    """`producer(dest, out)` writes this rank's chunk for `dest` into `out`. Returns the
    sum ("sum") or mean ("avg") over ranks of the chunks produced for this rank, in rank
    order. Each peer's chunk is added to one accumulator as it is read from shared
    memory: a rank never holds the P chunks at once (P x its share of the output)."""
    world = group.size()  # type: ignore[attr-defined]  # a ProcessGroup
    chunk_numel = torch.Size(chunk_shape).numel()
    es = dtype.itemsize
    handle = get_workspace(group, world * chunk_numel * es)
    acc_dtype = _accumulator_dtype(dtype)
    if handle is None:
        mine = torch.empty((world, *chunk_shape), dtype=dtype)
        for dest in range(world):
            producer(dest, mine[dest])
        stacked = torch.empty_like(mine)
        all_to_all_single(_bytes_of(stacked), _bytes_of(mine), group=group)
        return _finish(stacked.sum(0, dtype=acc_dtype), dtype, reduce_op, world)
    rank = handle.rank
    seq, slot = handle.begin_op()
    for step in range(1, world):
        dest = (rank + step) % world
        out = handle.buffer_view(rank, dest * chunk_numel * es, chunk_shape, dtype, slot)
        producer(dest, out)
        handle.publish(dest, seq)
    own = torch.empty(chunk_shape, dtype=dtype)
    producer(rank, own)

    def chunk_from(src: int) -> torch.Tensor:
        if src == rank:
            return own
        handle.wait_published(src, rank, seq)
        return handle.buffer_view(src, rank * chunk_numel * es, chunk_shape, dtype, slot)

    # In rank order, as torch's sum over a stack of the chunks.
    total = chunk_from(0).to(acc_dtype, copy=True)
    for src in range(1, world):
        total.add_(chunk_from(src))
    return _finish(total, dtype, reduce_op, world)
