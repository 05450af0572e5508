"""Index arithmetic for sharded spatial ops, free of torch so it is easy to check.

Row ranges are half-open `(start, end)` pairs in global coordinates of one tensor dim.
An op reads, for a block of output rows, a window of *virtual* input rows: rows inside
`[0, size)` are data; rows outside are padding, filled according to the padding mode
(zeros / a constant, or a copy of a data row for reflect, replicate and circular).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Range = tuple[int, int]
Fill = Literal["constant", "reflect", "replicate", "circular"]


def chunk_range(size: int, parts: int, index: int) -> Range:
    """Rows that chunk `index` of `parts` holds: torch.chunk's rule, as `Shard` uses it."""
    step = -(-size // parts) if parts else 0
    start = min(index * step, size)
    return start, min(start + step, size)


def conv_out_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """Output length of a zero-padded convolution along one dim."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def expand(param: Sequence[int] | int, n: int) -> list[int]:
    """aten accepts one value for all spatial dims; spell it out per dim."""
    values = [param] if isinstance(param, int) else list(param)
    return values * n if len(values) == 1 else values


@dataclass(frozen=True)
class Affine:
    """Output row `o` reads virtual rows `[o*stride + offset, o*stride + offset + extent)`.

    Convolution and pooling: stride, offset -padding, extent dilation*(kernel-1)+1.
    Padding: stride 1, offset -left, extent 1.
    """

    stride: int
    offset: int
    extent: int

    def __call__(self, o0: int, o1: int) -> Range:
        return o0 * self.stride + self.offset, (o1 - 1) * self.stride + self.offset + self.extent


@dataclass(frozen=True)
class Transposed:
    """Transposed convolution: output row `o` gathers input rows `i` with
    `o = i*stride - padding + j*dilation` for a tap `j`, i.e. `span = dilation*(kernel-1)`
    below it. The window also covers rows that make the local output start at or before
    the first owned row and end at or after the last (they add only zero contributions
    to owned rows, and keep the crop a plain slice).
    """

    stride: int
    padding: int
    span: int

    def __call__(self, o0: int, o1: int) -> Range:
        s, p, d = self.stride, self.padding, self.span
        lo = min(-(-(o0 + p - d) // s), (o0 + p) // s)
        hi = max((o1 - 1 + p) // s + 1, -(-(o1 + p - d - 1) // s) + 1)
        return lo, hi


@dataclass(frozen=True)
class Table:
    """Output row `o` reads virtual rows `[lo[o], hi[o])` (interpolation)."""

    lo: tuple[int, ...]
    hi: tuple[int, ...]

    def __call__(self, o0: int, o1: int) -> Range:
        return min(self.lo[o0:o1]), max(self.hi[o0:o1])


def source_row(v: int, size: int, fill: Fill) -> int | None:
    """The data row virtual row `v` copies, or None where it holds the fill value."""
    if 0 <= v < size:
        return v
    if fill == "constant":
        return None
    if fill == "replicate":
        return min(max(v, 0), size - 1)
    if fill == "circular":
        return v % size
    period = 2 * (size - 1)  # reflect without repeating the edge row
    if period == 0:
        return 0
    v %= period
    return v if v < size else period - v


@dataclass(frozen=True)
class DimSplit:
    """How one tensor dim is split over one mesh dim, for input and output of an op.

    Output rows are owned by the same chunk rule as input rows, so the output is a
    proper `Shard(dim)` DTensor. `needed(c)` is the virtual input window chunk `c` reads
    for its output rows; a chunk without output rows gets an empty window, so shapes
    stay defined everywhere.
    """

    dim: int
    mesh_dim: int
    parts: int
    size: int
    out_size: int
    reach: Affine | Transposed | Table
    fill: Fill = "constant"

    def owned_in(self, c: int) -> Range:
        return chunk_range(self.size, self.parts, c)

    def owned_out(self, c: int) -> Range:
        return chunk_range(self.out_size, self.parts, c)

    def needed(self, c: int) -> Range:
        """Empty (0, 0) when chunk `c` owns no output rows."""
        o0, o1 = self.owned_out(c)
        if o1 <= o0:
            return 0, 0
        return self.reach(o0, o1)

    def sources(self, c: int) -> list[int | None]:
        """For each row of chunk `c`'s window, the data row it copies (None: fill)."""
        lo, hi = self.needed(c)
        return [source_row(v, self.size, self.fill) for v in range(lo, hi)]


def conv_split(
    dim: int,
    mesh_dim: int,
    parts: int,
    size: int,
    kernel: int,
    stride: int,
    padding: int,
    dilation: int,
    out_size: int | None = None,
) -> DimSplit:
    """The split of a zero-padded convolution (or pooling) along one dim."""
    if out_size is None:
        out_size = conv_out_size(size, kernel, stride, padding, dilation)
    reach = Affine(stride, -padding, dilation * (kernel - 1) + 1)
    return DimSplit(dim, mesh_dim, parts, size, out_size, reach)
