"""The handle on a group's shared-memory segment: what the algorithms hold and call.

Layout of a segment: a header of int64 flags (one 64-byte line each, so ranks never share
a cache line), then two slots x world_size per-rank data buffers. Ranks write only their
own flags and, by convention, their own buffers; peers read them. Synchronisation on
the hot path is by sequence numbers in the flags (write data, then the flag; readers spin
on the flag), never by the store or gloo. Setup and growth are collective and use the
process group (rare; `workspace`). Handles offer what the algorithms need of torch's
`_SymmetricMemory`: rank, world_size, get_buffer, barrier(channel), put/wait signal.

Op protocol (`begin_op`/`publish`/`wait_published`): op number `seq` writes slot seq % 2.
A rank announces `entered = seq` when it starts op `seq`; before writing slot seq % 2 it
waits until every peer has entered op seq - 1, i.e. finished op seq - 2 (the last reader
of that slot). So one flag write per op suffices and no trailing barrier is needed.

Chunk streams (`progress_word`/`consumed_word`, used by the streamed all-gather): within
one op a rank publishes a running count of chunks written into a small ring in its slot,
and each reader a running count of chunks it has copied out, both as (seq << 32) + count.

The segment's geometry (`_Layout`, `segment_bytes`) is segment_layout.py's.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from dt_symm_mem import segment
from dt_symm_mem.segment_layout import (
    CHANNELS,
    _Layout,
    segment_bytes,  # noqa: F401 - re-exported: workspace.py imports it from here
)
from dt_symm_mem.settings import settings

TIMEOUT_ENV = settings.env_var("timeout")
SPIN_S = 200e-6  # busy-wait at most this long before yielding the core
MIN_SPIN_S = 10e-6
YIELD_S = 2e-3  # then yield; after this, nap between checks
NAP_S = 50e-6


class SymmMemTimeoutError(TimeoutError):
    """A barrier or signal wait did not complete: a peer is dead or stuck."""


def default_timeout() -> float:
    return settings.current().timeout


def _pid_alive(pid: int) -> bool:
    """False when the process is gone or a zombie (a SIGKILLed child not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


class ShmSymmMemory:
    """Handle on one group's workspace segment (one per group per process)."""

    def __init__(
        self,
        group: Any,
        mm: mmap.mmap,
        name: str,
        buffer_bytes: int,
        timeout: float,
        mechanism: str = "named",
    ) -> None:
        self.group = group
        self.mechanism = mechanism  # "memfd" (anonymous) or "named" (/dev/shm)
        self.rank = group.rank()
        self.world_size = group.size()
        self.name = name  # the /dev/shm name (unlinked by now) or a memfd's description
        self.buffer_bytes = buffer_bytes
        self.timeout = timeout
        self._mm = mm
        self._layout = _Layout(self.world_size)
        self._flags = np.frombuffer(mm, dtype=np.int64, count=self._layout.words)
        self._bytes = torch.frombuffer(mm, dtype=torch.uint8)
        self._address = self._bytes.data_ptr()
        self._views: dict[tuple[Any, ...], torch.Tensor] = {}
        self._seq = 0
        self._spin_s = SPIN_S  # adapted: shorter when peers keep not answering in time
        self._barrier_seq = [0] * CHANNELS
        self._signals_sent = [0] * self.world_size
        self._signals_seen = [0] * self.world_size
        ident = self._layout.word(self._layout.ident + self.rank)
        self._flags[ident] = os.getpid()
        self._flags[ident + 1] = segment.pid_namespace()

    # --- buffers --------------------------------------------------------------------

    def _base(self, rank: int, slot: int) -> int:
        return self._layout.header_bytes + (slot * self.world_size + rank) * self.buffer_bytes

    def buffer_view(
        self, rank: int, byte_offset: int, shape: Any, dtype: torch.dtype, slot: int = 0
    ) -> torch.Tensor:
        """A tensor on `rank`'s buffer of `slot`, starting `byte_offset` bytes in (cached:
        making a view costs more than copying a small message)."""
        key = (rank, slot, byte_offset, tuple(shape), dtype)
        view = self._views.get(key)
        if view is not None:
            return view
        shape = torch.Size(shape)
        nbytes = shape.numel() * dtype.itemsize
        self._check_range(byte_offset, nbytes)
        start = self._base(rank, slot) + byte_offset
        view = self._bytes[start : start + nbytes].view(dtype).view(shape)
        if len(self._views) > 512:
            self._views.clear()
        self._views[key] = view
        return view

    def _check_range(self, byte_offset: int, nbytes: int) -> None:
        if byte_offset < 0 or byte_offset + nbytes > self.buffer_bytes:
            raise ValueError(
                f"dt-symm-mem: buffer view of {nbytes} bytes at {byte_offset} exceeds the "
                f"{self.buffer_bytes}-byte buffer"
            )

    def write_bytes(self, slot: int, byte_offset: int, src: torch.Tensor) -> None:
        """memcpy a contiguous CPU tensor into this rank's buffer (no tensor view needed).
        glibc's memcpy ends its non-temporal-store path with sfence, so the data is
        globally visible before the flag store that follows (x86 orders plain stores)."""
        if not src.is_contiguous() or src.device.type != "cpu":
            raise ValueError("dt-symm-mem: write_bytes needs a contiguous CPU tensor")
        nbytes = src.numel() * src.element_size()
        self._check_range(byte_offset, nbytes)
        address = self._address + self._base(self.rank, slot) + byte_offset
        ctypes.memmove(address, src.data_ptr(), nbytes)

    def read_bytes(
        self, rank: int, slot: int, byte_offset: int, dst_address: int, nbytes: int
    ) -> None:
        """memcpy `nbytes` from `rank`'s buffer to the memory at `dst_address` (the data
        pointer of a contiguous CPU tensor, possibly advanced)."""
        self._check_range(byte_offset, nbytes)
        ctypes.memmove(dst_address, self._address + self._base(rank, slot) + byte_offset, nbytes)

    def get_buffer(
        self,
        rank: int,
        shape: Any,
        dtype: torch.dtype,
        storage_offset: int = 0,
        slot: int = 0,
    ) -> torch.Tensor:
        """Like `_SymmetricMemory.get_buffer`: offset counted in elements of `dtype`."""
        es = dtype.itemsize
        return self.buffer_view(rank, storage_offset * es, shape, dtype, slot)

    # --- waiting --------------------------------------------------------------------

    def _peer_gone(self, peer: int) -> bool:
        ident = self._layout.word(self._layout.ident + peer)
        pid, ns = int(self._flags[ident]), int(self._flags[ident + 1])
        return pid > 0 and ns == segment.pid_namespace() and not _pid_alive(pid)

    def _wait_geq(self, index: int, target: int, what: str, peer: int) -> None:
        """Wait until flag word `index` >= `target` (set by `peer`)."""
        if self._flags[index] < target:
            self.wait_any(((index, target, peer),), what)

    def wait_any(self, conditions: Sequence[tuple[int, int, int]], what: str) -> None:
        """Spin (then yield, then nap) until some `(index, target, peer)` of `conditions`
        has flag word `index` >= `target`; fail when one of those peers is dead or at
        the deadline."""
        if not conditions:
            raise ValueError("dt-symm-mem: wait_any needs at least one condition")
        flags = self._flags

        def met() -> bool:
            return any(flags[index] >= target for index, target, _ in conditions)

        if met():
            return
        spins = 0
        start = time.monotonic()
        next_check = start + 0.25
        spin_s = self._spin_s
        while not met():
            spins += 1
            if spins & 15:
                continue
            now = time.monotonic()
            waited = now - start
            if waited < spin_s:
                continue  # a running peer answers within tens of us: keep the core
            if waited < YIELD_S:
                os.sched_yield()  # the peer may need this core (oversubscribed host)
            else:
                time.sleep(NAP_S)
            if now >= next_check:
                next_check = now + 0.25
                if met():
                    break
                self._fail_if_stuck(sorted({peer for _, _, peer in conditions}), what, now - start)
        # Spinning only pays when peers answer within the spin; otherwise it steals the
        # core a descheduled peer needs. Halve the spin after a long wait, regrow slowly.
        if time.monotonic() - start > spin_s:
            self._spin_s = max(MIN_SPIN_S, spin_s / 2)
        else:
            self._spin_s = min(SPIN_S, spin_s * 1.25)

    def _fail_if_stuck(self, peers: list[int], what: str, waited: float) -> None:
        for peer in peers:
            if self._peer_gone(peer):
                raise SymmMemTimeoutError(
                    f"dt-symm-mem: {what}: peer rank {peer} of group "
                    f"{self.group.group_name!r} has exited"
                )
        if waited > self.timeout:
            ranks = ", ".join(map(str, peers))
            raise SymmMemTimeoutError(
                f"dt-symm-mem: {what}: timed out after {self.timeout:.1f}s waiting for "
                f"rank {ranks} of group {self.group.group_name!r} (dead or stuck peer?); "
                f"set {TIMEOUT_ENV} to change the limit"
            )

    # --- torch-like synchronisation ---------------------------------------------------

    def barrier(self, channel: int = 0, timeout: float | None = None) -> None:
        """All ranks of the group reach this point (per-channel sequence numbers)."""
        if not 0 <= channel < CHANNELS:
            raise ValueError(f"dt-symm-mem: barrier channel must be in [0, {CHANNELS})")
        saved = self.timeout
        if timeout is not None:
            self.timeout = timeout
        try:
            self._barrier_seq[channel] += 1
            seq = self._barrier_seq[channel]
            line = self._layout.barrier + channel * self.world_size
            self._flags[self._layout.word(line + self.rank)] = seq
            for step in range(1, self.world_size):
                peer = (self.rank + step) % self.world_size
                self._wait_geq(
                    self._layout.word(line + peer), seq, f"barrier(channel={channel})", peer
                )
        finally:
            self.timeout = saved

    def put_signal(self, peer: int) -> None:
        """Tell `peer` that data it waits for is written (data first, then this flag)."""
        self._signals_sent[peer] += 1
        line = self._layout.signal + self.rank * self.world_size + peer
        self._flags[self._layout.word(line)] = self._signals_sent[peer]

    def wait_signal(self, peer: int, timeout: float | None = None) -> None:
        """Wait for the next `put_signal` from `peer` to this rank."""
        self._signals_seen[peer] += 1
        line = self._layout.signal + peer * self.world_size + self.rank
        saved = self.timeout
        if timeout is not None:
            self.timeout = timeout
        try:
            self._wait_geq(self._layout.word(line), self._signals_seen[peer], "wait_signal", peer)
        finally:
            self.timeout = saved

    # --- op protocol (double-buffered, one flag per published chunk) -------------------

    def begin_op(self) -> tuple[int, int]:
        """Start the next op: returns (seq, slot) once this rank's slot is free to write."""
        self._seq += 1
        seq = self._seq
        for step in range(1, self.world_size):
            peer = (self.rank + step) % self.world_size
            word = self._layout.word(self._layout.entered + peer)
            self._wait_geq(word, seq - 1, "waiting for the previous op", peer)
        self._flags[self._layout.word(self._layout.entered + self.rank)] = seq
        return seq, seq % 2

    def publish(self, key: int, seq: int) -> None:
        """Mark this rank's chunk `key` (0..world_size) of op `seq` as written."""
        line = self._layout.ready + self.rank * (self.world_size + 1) + key
        self._flags[self._layout.word(line)] = seq

    def wait_published(self, peer: int, key: int, seq: int) -> None:
        line = self._layout.ready + peer * (self.world_size + 1) + key
        self._wait_geq(self._layout.word(line), seq, "waiting for a peer's data", peer)

    # --- chunk streams: an op's data passes through a ring of chunk slots ---------------
    # Flag words hold (seq << 32) + count, so they only grow from op to op and a reader
    # never mistakes an earlier op's counts for this op's.

    @property
    def flags(self) -> np.ndarray:
        """The int64 flag words (for hot loops that poll stream counters directly)."""
        return self._flags

    def progress_word(self, rank: int) -> int:
        """Flag word counting the chunks `rank` has published in the current op."""
        return self._layout.word(self._layout.progress + rank)

    def consumed_word(self, reader: int, writer: int) -> int:
        """Flag word counting the chunks of `writer` that `reader` has copied out."""
        return self._layout.word(self._layout.consumed + reader * self.world_size + writer)

    def slot_address(self, rank: int, slot: int) -> int:
        """Address of `rank`'s buffer of `slot` in this process's mapping."""
        return self._address + self._base(rank, slot)
