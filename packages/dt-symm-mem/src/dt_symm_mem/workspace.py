"""A CPU symmetric-memory workspace: the ranks of a group on one host share one segment.

Layout of a segment: a header of int64 flags (one 64-byte line each, so ranks never share
a cache line), then two slots x world_size per-rank data buffers. Ranks write only their
own flags and, by convention, their own buffers; peers read them. Synchronisation on
the hot path is by sequence numbers in the flags (write data, then the flag; readers spin
on the flag), never by the store or gloo. Setup and growth are collective and use the
process group (rare). Handles offer what the algorithms need of torch's
`_SymmetricMemory`: rank, world_size, get_buffer, barrier(channel), put/wait signal.

Op protocol (`begin_op`/`publish`/`wait_published`): op number `seq` writes slot seq % 2.
A rank announces `entered = seq` when it starts op `seq`; before writing slot seq % 2 it
waits until every peer has entered op seq - 1, i.e. finished op seq - 2 (the last reader
of that slot). So one flag write per op suffices and no trailing barrier is needed.

Chunk streams (`progress_word`/`consumed_word`, used by the streamed all-gather): within
one op a rank publishes a running count of chunks written into a small ring in its slot,
and each reader a running count of chunks it has copied out, both as (seq << 32) + count.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import socket
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from dt_core.compat.process_groups import is_fake_group
from dt_core.kit import Unsupported

from dt_symm_mem import segment
from dt_symm_mem.settings import settings

TIMEOUT_ENV = settings.env_var("timeout")
DISABLE_ENV = settings.env_var("disable")
MIN_BUFFER_BYTES = 1 << 20
CHANNELS = 4
LINE_WORDS = 8  # int64 words per 64-byte line
SPIN_S = 200e-6  # busy-wait at most this long before yielding the core
MIN_SPIN_S = 10e-6
YIELD_S = 2e-3  # then yield; after this, nap between checks
NAP_S = 50e-6
_X86 = {"x86_64", "amd64", "i386", "i686"}


class SymmMemTimeoutError(TimeoutError):
    """A barrier or signal wait did not complete: a peer is dead or stuck."""


def default_timeout() -> float:
    return settings.current().timeout


def _round_size(nbytes: int, previous: int) -> int:
    size = max(MIN_BUFFER_BYTES, 2 * previous)
    while size < nbytes:
        size *= 2
    return size


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


class _Layout:
    """Flag indices (in int64 words) for a world of `ws` ranks."""

    def __init__(self, ws: int) -> None:
        self.ws = ws
        lines = 0
        self.entered = lines
        lines += ws
        self.ident = lines  # [pid, pid-namespace inode]
        lines += ws
        self.barrier = lines
        lines += CHANNELS * ws
        self.signal = lines
        lines += ws * ws
        self.ready = lines
        lines += ws * (ws + 1)
        self.progress = lines  # chunk streams: chunks a rank has published in an op
        lines += ws
        self.consumed = lines  # chunk streams: [reader][writer] chunks read in an op
        lines += ws * ws
        self.words = lines * LINE_WORDS
        self.header_bytes = -(-self.words * 8 // segment.PAGE) * segment.PAGE

    def word(self, line: int) -> int:
        return line * LINE_WORDS


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


@dataclass
class _GroupState:
    group: Any
    handle: ShmSymmMemory | None = None
    fallback_reason: str | None = None
    generation: int = 0
    # why anonymous (memfd) segments cannot be used by this group; None: try them
    memfd_problem: str | None = None


_states: dict[int, _GroupState] = {}  # id(group) -> state (the state keeps the group alive)


def _host_identity() -> tuple[str, str]:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return socket.gethostname(), boot


def _local_problem() -> str | None:
    if settings.current().disable:
        return f"{DISABLE_ENV}=1"
    if platform.machine().lower() not in _X86:
        return f"flag ordering is only implemented for x86 (this is {platform.machine()})"
    if not segment.memfd_supported() and not segment.shm_available():
        return f"no memfd_create and {segment.SHM_DIR} is not writable"
    return None


def _decide(group: Any) -> str | None:
    """Collectively decide whether the group can use shared memory (same answer on all)."""
    facts: list[Any] = [None] * group.size()
    dist.all_gather_object(facts, (_host_identity(), _local_problem()), group=group)
    problems = sorted({p for _, p in facts if p})
    if problems:
        return "; ".join(problems)
    if len({host for host, _ in facts}) > 1:
        return "the group spans several hosts"
    return None


# Test seam: called on the creating rank right after it made a segment, before any peer
# knows of it, as hook(kind, where) with kind "memfd" or "named" (the tests SIGKILL the
# creator here to show nothing is left behind). None in normal use.
after_create: Callable[[str, str], None] | None = None


def _segment_bytes(group: Any, buffer_bytes: int) -> int:
    return _Layout(group.size()).header_bytes + 2 * group.size() * buffer_bytes


def _created(kind: str, where: str) -> None:
    if after_create is not None:
        after_create(kind, where)


def _share_from_rank0(
    group: Any,
    create: Callable[[], tuple[Any, mmap.mmap]],
    open_peer: Callable[[Any], mmap.mmap],
    release: Callable[[Any, bool], None],
) -> tuple[mmap.mmap, Any]:
    """Collective: group rank 0 creates a segment (`create()`: its shareable handle and
    mapping), broadcasts the handle, the peers map it (`open_peer`), and every rank
    all-gathers how it went, so all reach the same result. `release(handle, aborted)` runs
    on every rank at the end; aborted is True when this rank raised mid-way (a peer died,
    maybe the creator), so any rank that knows the handle can clean up.
    Returns (mapping, handle); raises `Unsupported` with the common reason it failed.

    `create` and `open_peer` raise `Unsupported` saying why they failed; this catches it
    where it happens, as one rank's refusal is data here: every rank must learn it."""
    handle: Any = None
    mm: mmap.mmap | None = None
    error: str | None = None
    if group.rank() == 0:
        try:
            handle, mm = create()
        except Unsupported as exc:
            error = str(exc)
    aborted = True
    try:
        box: list[Any] = [(handle, error)]
        dist.broadcast_object_list(box, group_src=0, group=group)
        handle, error = box[0]
        if handle is not None and mm is None:
            try:
                mm = open_peer(handle)
            except Unsupported as exc:
                error = str(exc)
        results: list[Any] = [None] * group.size()
        dist.all_gather_object(results, error, group=group)
        aborted = False
    finally:
        release(handle, aborted)
    errors = sorted({e for e in results if e})
    if errors or mm is None or handle is None:
        if mm is not None:
            mm.close()
        raise Unsupported("; ".join(errors) or "no segment")
    return mm, handle


def _map_anonymous(group: Any, total: int) -> tuple[mmap.mmap, str]:
    """Group rank 0 makes a memfd; the peers open it through /proc while rank 0 holds the
    fd; rank 0 closes it once every rank has answered. Collective; returns the mapping and
    its description, or raises `Unsupported` with the (common) reason it failed."""
    fds: list[int] = []

    def create() -> tuple[segment.AnonymousSegment, mmap.mmap]:
        if not segment.memfd_supported():
            raise Unsupported("this host has no memfd_create or no /proc")
        try:
            fd, described, mm = segment.create_anonymous(total)
        except OSError as err:
            raise Unsupported(f"creating an anonymous {total}-byte segment failed: {err}") from err
        fds.append(fd)
        _created("memfd", described.proc_path)
        return described, mm

    def open_peer(described: segment.AnonymousSegment) -> mmap.mmap:
        try:
            return segment.open_anonymous(described, total)
        except (OSError, ValueError) as err:
            raise Unsupported(
                f"rank {group.rank()} cannot open the creator's memfd: {err}"
            ) from err

    def release(_described: Any, _aborted: bool) -> None:
        for fd in fds:
            os.close(fd)  # every rank mapped it (or failed, or died): the memory lives on

    mm, described = _share_from_rank0(group, create, open_peer, release)
    return mm, described.describe()


def _map_named(group: Any, total: int) -> tuple[mmap.mmap, str]:
    """Create (group rank 0), broadcast the name, attach, unlink: collective. Raises
    `Unsupported` with the (common) reason it failed."""

    def create() -> tuple[str, mmap.mmap]:
        try:
            name = segment.new_name()
            mm = segment.create(name, total)
        except OSError as err:
            raise Unsupported(f"creating a {total}-byte segment failed: {err}") from err
        _created("named", name)
        return name, mm

    def open_peer(name: str) -> mmap.mmap:
        try:
            return segment.attach(name, total)
        except (OSError, ValueError) as err:
            raise Unsupported(f"attaching to the segment failed: {err}") from err

    def release(name: str | None, aborted: bool) -> None:
        # Normally rank 0 unlinks once every rank has mapped it (or failed); when a peer
        # died mid-setup (maybe the creator), any rank that knows the name cleans up.
        if name is not None and (aborted or group.rank() == 0):
            segment.unlink(name)

    return _share_from_rank0(group, create, open_peer, release)


def _map_segment(state: _GroupState, buffer_bytes: int, timeout: float) -> ShmSymmMemory:
    """A fresh segment for the group: anonymous (memfd) unless some rank could not use
    it, then named in /dev/shm (and named from then on). Collective; every rank reaches
    the same decision because each step ends with an all-gather of every rank's result.
    Raises `Unsupported` when neither kind can be set up."""
    group = state.group
    total = _segment_bytes(group, buffer_bytes)
    if state.memfd_problem is None:
        try:
            mm, described = _map_anonymous(group, total)
        except Unsupported as exc:  # not a refusal yet: named segments may still work
            state.memfd_problem = str(exc)
        else:
            return ShmSymmMemory(group, mm, described, buffer_bytes, timeout, "memfd")
    try:
        mm, name = _map_named(group, total)
    except Unsupported as exc:
        raise Unsupported(
            f"{exc} (after anonymous segments failed: {state.memfd_problem})"
        ) from exc
    return ShmSymmMemory(group, mm, name, buffer_bytes, timeout, "named")


FAKE_GROUP_REASON = "a fake process group (torch's fake backend) has no peers to share memory with"


def _state(group: Any) -> _GroupState:
    key = id(group)
    state = _states.get(key)
    if state is None:
        state = _states[key] = _GroupState(group)
        if is_fake_group(group):
            # A dry run in one process: the peers exist only in name, so a segment would
            # wait for them forever. Ordinary collectives on the fake group return at once
            # with results of the right shapes, as torch's unfused graph does. No warning:
            # nothing is slower than the user asked for.
            state.fallback_reason = FAKE_GROUP_REASON
            return state
        reason = _decide(group)
        if reason is not None:
            state.fallback_reason = reason
            warnings.warn(
                f"dt-symm-mem: group {group.group_name!r} uses the process group's ordinary "
                f"collectives instead of shared memory: {reason}",
                RuntimeWarning,
                stacklevel=3,
            )
    return state


def get_workspace(group: Any, min_bytes: int) -> ShmSymmMemory | None:
    """The group's handle with per-rank buffers of at least `min_bytes`, or None when the
    group cannot use shared memory (then use ordinary collectives). Collective when it
    (re)creates the segment: every rank must ask for the same size."""
    state = _state(group)
    if state.fallback_reason is not None:
        return None
    handle = state.handle
    if handle is not None and handle.buffer_bytes >= min_bytes:
        return handle
    previous = handle.buffer_bytes if handle is not None else 0
    size = _round_size(min_bytes, previous)
    timeout = handle.timeout if handle is not None else default_timeout()
    try:
        result = _map_segment(state, size, timeout)
    except Unsupported as exc:
        # Every rank got the same all-gathered reason, so all fall back together.
        state.fallback_reason = f"setting up shared memory failed: {exc}"
        state.handle = None
        warnings.warn(
            f"dt-symm-mem: group {group.group_name!r} uses the process group's ordinary "
            f"collectives from now on: {state.fallback_reason}",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    # The old segment needs no care: we never write it again, and a peer still reading
    # our previous op's data holds its own mapping of those pages.
    state.handle = result
    state.generation += 1
    from dt_symm_mem.ops import counters  # ops imports this module

    counters.add("workspace_segments")  # segments this process mapped (tests, stats)
    return result


def fallback_reason(group: Any) -> str | None:
    """Why the group does not use shared memory (None when it does)."""
    return _state(group).fallback_reason


def reset() -> None:
    """Forget every workspace (tests); mappings close once unreferenced."""
    _states.clear()
