"""The index arithmetic alone, on one process: windows reproduce the full convolution."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from dt_conv.engine.geometry import Affine, DimSplit, chunk_range, conv_out_size, conv_split
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
    split = conv_split(2, 0, parts, size, kernel, stride, padding, dilation)
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
        # the same windows: equal up to the kernel's summation order (an ulp at most)
        torch.testing.assert_close(local, full[..., o0:o1], rtol=1e-13, atol=1e-15)


def simulate_windows(split: DimSplit, x: torch.Tensor, fill_value: float) -> list[torch.Tensor]:
    """Assemble every chunk's window on one process from the exchange plans alone."""
    from dt_conv.engine.halo.plan import FILL, OWN, exchange_plan

    locals_ = [x[..., slice(*split.owned_in(c))] for c in range(split.parts)]
    windows = []
    for me in range(split.parts):
        plan = exchange_plan(split, me)
        buffers = []
        for peer, count in plan.recvs:  # what the peer's plan says it sends to me
            rows = dict(exchange_plan(split, peer).sends)[me]
            assert len(rows) == count
            buffers.append(locals_[peer][..., list(rows)])
        pieces = []
        for seg in plan.segments:
            if seg.source == FILL:
                pieces.append(torch.full((*x.shape[:-1], seg.length), fill_value))
                continue
            src = locals_[me] if seg.source == OWN else buffers[seg.source]
            idx = [seg.start + seg.step * i for i in range(seg.length)]
            pieces.append(src[..., idx])
        windows.append(torch.cat(pieces, -1) if pieces else x[..., :0])
        assert windows[-1].shape[-1] == plan.window_rows
    return windows


@settings(max_examples=300, deadline=None)
@given(
    size=st.integers(1, 20),
    parts=st.integers(1, 5),
    left=st.integers(-3, 6),
    right=st.integers(-3, 6),
    mode=st.sampled_from(["constant", "reflect", "replicate", "circular"]),
)
def test_padding_windows_reproduce_f_pad(
    size: int, parts: int, left: int, right: int, mode: str
) -> None:
    if size + left + right < 1 or size + min(left, 0) + min(right, 0) < 0:
        return  # torch rejects crops longer than the input
    if mode == "reflect" and max(left, right) >= size:
        return  # torch's own limit
    if mode == "circular" and (max(left, right) > size or min(left, right) < 0):
        return
    if mode != "constant" and min(left, right) < 0:
        return
    x = torch.arange(float(size)).reshape(1, 1, size)
    full = (
        F.pad(x, (left, right), mode=mode, value=-7.0)
        if mode == "constant"
        else F.pad(x, (left, right), mode=mode)
    )
    split = DimSplit(2, 0, parts, size, size + left + right, Affine(1, -left, 1), mode)
    for c, window in enumerate(simulate_windows(split, x, -7.0)):
        o0, o1 = split.owned_out(c)
        assert torch.equal(window, full[..., o0:o1]), (c, window, full[..., o0:o1])
