"""One shared-memory segment, made in one of two ways (every rank of a group uses the same).

Anonymous (Linux, preferred): the creator makes a memfd (`os.memfd_create`), which has no
name anywhere, sizes it, seals its size and makes it owner-only; peers open it through
`/proc/<creator pid>/fd/<fd>` (the kernel allows that only to processes that may
ptrace-read the creator: same user) and check it is the very file the creator announced
(device and inode), owner-only and large enough. The creator closes its fd once every
rank has mapped it. Nothing can ever be left behind in /dev/shm, whenever a rank dies.

Named (fallback, e.g. peers in different pid namespaces or /proc restricted): os.open
on /dev/shm with O_CREAT|O_EXCL, mode 0600 and 128 random bits in the name, instead of
`multiprocessing.shared_memory`, whose resource tracker registers segments (noisy
warnings, and it may unlink a segment while peers still need its name). The creator
unlinks the name as soon as every rank has mapped it.
"""

from __future__ import annotations

import mmap
import os
import secrets
import stat
from dataclasses import dataclass

try:
    import fcntl
except ImportError:  # not POSIX: no sealing (and no memfd either)
    fcntl = None  # type: ignore[assignment]  # not on this platform: checked before use

SHM_DIR = "/dev/shm"
NAME_PREFIX = "dt-symm-mem-"
PAGE = 4096


def shm_available() -> bool:
    """Whether POSIX shared memory is usable on this host."""
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK | os.X_OK)


def new_name() -> str:
    """128 random bits: nobody can guess (and pre-create or open) the segment."""
    return NAME_PREFIX + secrets.token_hex(16)


def _path(name: str) -> str:
    if not name.startswith(NAME_PREFIX) or "/" in name:
        raise ValueError(f"dt-symm-mem: not a segment name of ours: {name!r}")
    return os.path.join(SHM_DIR, name)


def create(name: str, size: int) -> mmap.mmap:
    """Create and map a fresh segment; fails if the name exists (O_EXCL, no symlinks)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(_path(name), flags, 0o600)
    try:
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.unlink(_path(name))
        raise
    finally:
        os.close(fd)


def attach(name: str, size: int) -> mmap.mmap:
    """Map a segment a peer created; refuse one that is not ours (owner, mode, size)."""
    fd = os.open(_path(name), os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        _check_owner_and_size(os.fstat(fd), size, name)
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def unlink(name: str) -> None:
    """Remove the name (the memory stays while mapped); missing is fine."""
    try:
        os.unlink(_path(name))
    except FileNotFoundError:
        pass


# --- anonymous segments (memfd) -----------------------------------------------------


@dataclass(frozen=True)
class AnonymousSegment:
    """What a peer needs to open the creator's memfd, and to check it got that file."""

    pid: int
    pid_namespace: int
    fd: int
    device: int
    inode: int

    @property
    def proc_path(self) -> str:
        return f"/proc/{self.pid}/fd/{self.fd}"

    def describe(self) -> str:
        return f"memfd:{self.pid}:{self.fd}:{self.inode}"


def memfd_supported() -> bool:
    """Whether this process can make anonymous segments (Linux with memfd_create)."""
    return hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


def pid_namespace() -> int:
    """Inode of this process's pid namespace (-1 if unknown): peers in another pid
    namespace cannot reach the creator's /proc entry."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return -1


def create_anonymous(size: int) -> tuple[int, AnonymousSegment, mmap.mmap]:
    """Make, size, seal and map a memfd; returns (fd, description, mapping). The caller
    keeps fd open until every peer has opened it, then closes it."""
    flags = getattr(os, "MFD_CLOEXEC", 0) | getattr(os, "MFD_ALLOW_SEALING", 0)
    fd = os.memfd_create(NAME_PREFIX.rstrip("-"), flags)
    try:
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, size)
        seals = getattr(fcntl, "F_SEAL_SHRINK", 0) | getattr(fcntl, "F_SEAL_GROW", 0)
        if seals and hasattr(fcntl, "F_ADD_SEALS"):
            # nobody (no rank, no other process of ours) can shrink it under a peer's mapping
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals | getattr(fcntl, "F_SEAL_SEAL", 0))
        info = os.fstat(fd)
        mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise
    described = AnonymousSegment(os.getpid(), pid_namespace(), fd, info.st_dev, info.st_ino)
    return fd, described, mapping


def open_anonymous(seg: AnonymousSegment, size: int) -> mmap.mmap:
    """Map a peer's memfd through /proc; refuse anything but that file, owner-only, of at
    least `size` bytes."""
    if seg.pid_namespace != pid_namespace() or seg.pid_namespace == -1:
        raise PermissionError("dt-symm-mem: the creating rank is in another pid namespace")
    fd = os.open(seg.proc_path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != (seg.device, seg.inode):
            raise PermissionError(f"dt-symm-mem: {seg.proc_path} is not the announced segment")
        _check_owner_and_size(info, size, seg.describe())
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def _check_owner_and_size(info: os.stat_result, size: int, what: str) -> None:
    if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise PermissionError(f"dt-symm-mem: segment {what} has wrong owner or mode")
    if info.st_size < size:
        raise ValueError(f"dt-symm-mem: segment {what} is {info.st_size} bytes, need {size}")


def leftover_segments() -> list[str]:
    """Our segment names currently in /dev/shm (for tests and diagnostics)."""
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(NAME_PREFIX))
    except FileNotFoundError:
        return []
