"""Index arithmetic for sharded convolution, free of torch so it is easy to check.

Row ranges are half-open `(start, end)` pairs in global coordinates of one tensor dim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Range = tuple[int, int]


def chunk_range(size: int, parts: int, index: int) -> Range:
    """Rows that chunk `index` of `parts` holds: torch.chunk's rule, as `Shard` uses it."""
    step = -(-size // parts) if parts else 0
    start = min(index * step, size)
    return start, min(start + step, size)


def intersect(a: Range, b: Range) -> Range:
    """Overlap of two ranges (empty ranges come back as (x, x))."""
    start = max(a[0], b[0])
    return start, max(start, min(a[1], b[1]))


def conv_out_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """Output length of a zero-padded convolution along one dim."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def expand(param: Sequence[int] | int, n: int) -> list[int]:
    """aten accepts one value for all spatial dims; spell it out per dim."""
    values = [param] if isinstance(param, int) else list(param)
    return values * n if len(values) == 1 else values


@dataclass(frozen=True)
class DimSplit:
    """How one spatial tensor dim is split over one mesh dim, for input and output.

    Output rows are owned by the same chunk rule as input rows, so the output is a
    proper `Shard(dim)` DTensor. `needed(c)` is the input window (possibly reaching into
    the zero padding, i.e. below 0 or past `size`) chunk `c` reads for its output rows.
    A chunk without output rows gets an empty window, so shapes stay defined everywhere.
    """

    dim: int
    mesh_dim: int
    parts: int
    size: int
    kernel: int
    stride: int
    padding: int
    dilation: int

    @property
    def out_size(self) -> int:
        return conv_out_size(self.size, self.kernel, self.stride, self.padding, self.dilation)

    def owned_in(self, c: int) -> Range:
        return chunk_range(self.size, self.parts, c)

    def owned_out(self, c: int) -> Range:
        return chunk_range(self.out_size, self.parts, c)

    def needed(self, c: int) -> Range:
        """Empty (0, 0) when chunk `c` owns no output rows."""
        o0, o1 = self.owned_out(c)
        if o1 <= o0:
            return 0, 0
        start = o0 * self.stride - self.padding
        end = (o1 - 1) * self.stride - self.padding + self.dilation * (self.kernel - 1) + 1
        return start, end

    def needed_data(self, c: int) -> Range:
        """The part of `needed(c)` that is real data (not zero padding)."""
        return intersect(self.needed(c), (0, self.size))
