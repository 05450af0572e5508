"""Where each flag word and data buffer sits in a group's shared-memory segment.

Its own module because the segment's geometry (a header of int64 flags, one 64-byte line
each so ranks never share a cache line, then two slots x world_size per-rank data
buffers) is plain arithmetic, needed both to size a segment (workspace.py) and to address
it (handle.py).
"""

from __future__ import annotations

from dt_symm_mem import segment

CHANNELS = 4
LINE_WORDS = 8  # int64 words per 64-byte line


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


def segment_bytes(world_size: int, buffer_bytes: int) -> int:
    """The size of a segment for `world_size` ranks with buffers of `buffer_bytes`."""
    return _Layout(world_size).header_bytes + 2 * world_size * buffer_bytes
