"""The index arithmetic alone, on one process: windows reproduce the full convolution."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from dt_conv.geometry import DimSplit, chunk_range, conv_out_size
from hypothesis import given, settings
from hypothesis import strategies as st


@given(st.integers(0, 40), st.integers(1, 8))
def test_chunk_range_is_torch_chunk(size: int, parts: int) -> None:
    chunks = torch.arange(size).chunk(parts)
    for c in range(parts):
        start, end = chunk_range(size, parts, c)
        expected = chunks[c].tolist() if c < len(chunks) else []
        assert list(range(start, end)) == expected


@settings(max_examples=300, deadline=None)
@given(
    size=st.integers(1, 30),
    parts=st.integers(1, 6),
    kernel=st.integers(1, 6),
    stride=st.integers(1, 4),
    padding=st.integers(0, 4),
    dilation=st.integers(1, 3),
)
def test_windows_reproduce_the_full_conv(
    size: int, parts: int, kernel: int, stride: int, padding: int, dilation: int
) -> None:
    if conv_out_size(size, kernel, stride, padding, dilation) < 1:
        return
    split = DimSplit(2, 0, parts, size, kernel, stride, padding, dilation)
    x = torch.randn(1, 1, size, dtype=torch.float64)
    w = torch.randn(1, 1, kernel, dtype=torch.float64)
    full = F.conv1d(x, w, stride=stride, padding=padding, dilation=dilation)
    assert full.shape[-1] == split.out_size
    for c in range(parts):
        o0, o1 = split.owned_out(c)
        lo, hi = split.needed(c)
        if o1 == o0:
            assert (lo, hi) == (0, 0)
            continue
        padded = F.pad(x, (padding, padding))
        window = padded[..., lo + padding : hi + padding]
        assert window.shape[-1] == hi - lo  # the window never reaches past the padding
        local = F.conv1d(window, w, stride=stride, dilation=dilation)
        assert torch.equal(local, full[..., o0:o1])
