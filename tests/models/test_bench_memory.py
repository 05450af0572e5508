"""tools/bench_unet_memory.py's floor: the halo it adds is the widest convolution input
plane of MONAI's UNet, counted by hand here from the model's layout."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))


def test_the_widest_convolution_plane_is_the_top_up_sampling_input() -> None:
    from bench_unet_memory import halo_bytes, widest_conv_plane

    # At a 128^3 volume the first convolution halves every edge; the top up-sampling
    # (a transposed convolution) reads 16 + 16 channels (the skip and the level below)
    # at 64^3: 32 x 64 x 64 fp32 planes, wider than any other input plane.
    assert widest_conv_plane(128) == 32 * 64 * 64 * 4
    assert widest_conv_plane(64) == 32 * 32 * 32 * 4
    # A plane from and to each neighbour, forward and adjoint; an end rank has one.
    assert halo_bytes(128, 2) == 4 * 1 * 32 * 64 * 64 * 4
    assert halo_bytes(128, 8) == 4 * 2 * 32 * 64 * 64 * 4
