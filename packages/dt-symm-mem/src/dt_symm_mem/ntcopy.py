"""Copies that bypass the cache, for outputs written once and larger than the cache.

Why: an ordinary store first reads the destination line into the cache (read for
ownership), so copying into a large all-gather output moves two bytes through DRAM for
every byte written. Non-temporal stores write the line without reading it. glibc's
memcpy switches to them only above 3/4 of the shared cache (192 MiB on this project's
2-core host), and torch and numpy never do, so dt-symm-mem brings a 76-byte SSE2 loop:
unaligned loads, `movntdq` stores, `sfence`. It is compiled by gcc from
`native/nt_copy_bulk.c` and embedded here as bytes, so nothing needs a compiler at
install or run time (`tools/build_nt_copy.py` rebuilds and checks them).

The loop is mapped into a private page that is made read+execute only after it is
written, and checked against a plain copy once. Anything unexpected (not x86-64 Linux,
a kernel that refuses executable mappings, a wrong result, `DT_SYMM_MEM_NT_COPY=0`)
leaves `copy` as ctypes.memmove, which gives the same bytes, only slower.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import sys
from collections.abc import Callable

DISABLE_ENV = "DT_SYMM_MEM_NT_COPY"
BULK_ALIGN = 16  # movntdq needs 16-byte aligned destinations
BULK_STEP = 64  # the loop moves 64 bytes per iteration
MIN_BYTES = 4096  # below this the split into head, bulk and tail is not worth a call

# gcc -O2 -mno-avx -fno-asynchronous-unwind-tables -fcf-protection=none, .text only:
#   shr $4,%rdx; je done; xor %eax,%eax; nopl
#   loop: movdqu (%rsi),%xmm3; add $4,%rax; add $64,%rsi; add $64,%rdi;
#         movdqu -48/-32/-16(%rsi),%xmm2/1/0; movntdq %xmm3..0,-64..-16(%rdi);
#         cmp %rdx,%rax; jb loop
#   done: sfence; ret
_BULK_X86_64 = bytes.fromhex(
    "48c1ea04744231c00f1f840000000000f30f6f1e4883c0044883c6404883c740"
    "f30f6f56d0f30f6f4ee0f30f6f46f0660fe75fc0660fe757d0660fe74fe0660f"
    "e747f04839d072c80faef8c3"
)

_BulkFn = Callable[[int, int, int], None]
_bulk: _BulkFn | None = None
_loaded = False
unavailable_reason: str | None = None  # why `copy` is plain memmove here (None: it is not)


def _map_code(code: bytes) -> _BulkFn:
    """`code` in a fresh private page, made executable after it is written (never W+X)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    size = mmap.PAGESIZE
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    address = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap of a code page failed")
    ctypes.memmove(address, code, len(code))
    if libc.mprotect(address, size, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
        raise OSError(ctypes.get_errno(), "mprotect(PROT_READ | PROT_EXEC) refused")
    prototype = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    return prototype(address)


def _self_test(bulk: _BulkFn) -> bool:
    """The loop copies exactly what it is given, and nothing next to it."""
    source = bytes((i * 37 + 11) % 251 for i in range(4 * BULK_STEP + 7))
    target = ctypes.create_string_buffer(len(source) + 2 * BULK_ALIGN)
    start = -ctypes.addressof(target) % BULK_ALIGN + BULK_ALIGN
    src = ctypes.create_string_buffer(source, len(source))
    bulk(ctypes.addressof(target) + start, ctypes.addressof(src) + 3, 3 * BULK_STEP)
    copied = target.raw[start : start + 3 * BULK_STEP]
    untouched = target.raw[:start] + target.raw[start + 3 * BULK_STEP :]
    return copied == source[3 : 3 + 3 * BULK_STEP] and not any(untouched)


def _load() -> _BulkFn | None:
    global _bulk, _loaded, unavailable_reason
    _loaded = True
    if os.environ.get(DISABLE_ENV, "1") == "0":
        unavailable_reason = f"disabled by {DISABLE_ENV}=0"
    elif sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        unavailable_reason = f"no embedded loop for {sys.platform}/{platform.machine()}"
    elif ctypes.sizeof(ctypes.c_void_p) != 8:
        unavailable_reason = "not a 64-bit process"
    else:
        try:
            bulk = _map_code(_BULK_X86_64)
        except OSError as exc:
            unavailable_reason = f"cannot map the copy loop: {exc}"
        else:
            if _self_test(bulk):
                _bulk = bulk
            else:
                unavailable_reason = "the copy loop failed its self-test"
    return _bulk


def available() -> bool:
    """Whether `copy` uses non-temporal stores in this process (loads the loop once)."""
    return (_bulk if _loaded else _load()) is not None


def copy(dst: int, src: int, nbytes: int) -> None:
    """memmove(dst, src, nbytes) for non-overlapping ranges, with non-temporal stores for
    the 16-byte aligned, 64-byte multiple middle when the loop is available."""
    bulk = _bulk if _loaded else _load()
    if bulk is None or nbytes < MIN_BYTES:
        ctypes.memmove(dst, src, nbytes)
        return
    head = -dst % BULK_ALIGN
    middle = (nbytes - head) // BULK_STEP * BULK_STEP
    if head:
        ctypes.memmove(dst, src, head)
    bulk(dst + head, src + head, middle)
    tail = nbytes - head - middle
    if tail:
        ctypes.memmove(dst + head + middle, src + head + middle, tail)


def reset() -> None:
    """Forget the loaded loop so the next copy loads it again (tests)."""
    global _bulk, _loaded, unavailable_reason
    _bulk, _loaded, unavailable_reason = None, False, None
