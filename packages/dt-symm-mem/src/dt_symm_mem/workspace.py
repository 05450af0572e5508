"""The shared-memory workspace of each process group: set up once per group, grown on demand.

The ranks of a group on one host share one segment (`segment`: anonymous memfd, or named
in /dev/shm as a fallback), and every rank holds a handle on it (`handle.ShmSymmMemory`).
Setting it up is collective and runs rarely: the group first decides together whether it
can share memory at all (one host, x86, not disabled, not a fake group), then group rank 0
creates each segment and the peers map it; each step ends with an all-gather, so all
ranks reach the same result, and a group that cannot gets the reason and uses ordinary
collectives. `get_workspace` grows the segment (a fresh one, twice the size) when an op
needs larger buffers.
"""

from __future__ import annotations

import mmap
import os
import platform
import socket
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from dt_core.compat.process_groups import is_fake_group
from dt_core.kit import Unsupported

from dt_symm_mem import segment
from dt_symm_mem.counters import counters
from dt_symm_mem.handle import ShmSymmMemory, default_timeout, segment_bytes
from dt_symm_mem.settings import settings

DISABLE_ENV = settings.env_var("disable")
MIN_BUFFER_BYTES = 1 << 20
_X86 = {"x86_64", "amd64", "i386", "i686"}


def _round_size(nbytes: int, previous: int) -> int:
    size = max(MIN_BUFFER_BYTES, 2 * previous)
    while size < nbytes:
        size *= 2
    return size


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
    total = segment_bytes(group.size(), buffer_bytes)
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
    counters.add("workspace_segments")  # segments this process mapped (tests, stats)
    return result


def fallback_reason(group: Any) -> str | None:
    """Why the group does not use shared memory (None when it does)."""
    return _state(group).fallback_reason


def reset() -> None:
    """Forget every workspace (tests); mappings close once unreferenced."""
    _states.clear()
