"""One shared-memory segment: created exclusively, owner-only, with an unguessable name.

We use os.open on /dev/shm instead of `multiprocessing.shared_memory`, whose resource
tracker registers segments (noisy warnings, and it may unlink a segment while peers
still need its name). The creator unlinks the name as soon as every rank has mapped it,
so the memory lives only as long as some rank maps it and nothing is left behind in
/dev/shm, even when a rank is killed later.
"""

from __future__ import annotations

import mmap
import os
import secrets
import stat

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
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise PermissionError(f"dt-symm-mem: segment {name} has wrong owner or mode")
        if info.st_size < size:
            raise ValueError(f"dt-symm-mem: segment {name} is {info.st_size} bytes, need {size}")
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def unlink(name: str) -> None:
    """Remove the name (the memory stays while mapped); missing is fine."""
    try:
        os.unlink(_path(name))
    except FileNotFoundError:
        pass


def leftover_segments() -> list[str]:
    """Our segment names currently in /dev/shm (for tests and diagnostics)."""
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(NAME_PREFIX))
    except FileNotFoundError:
        return []
