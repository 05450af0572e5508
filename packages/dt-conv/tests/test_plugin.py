"""The plugin is found through its entry point and owns both convolution ops."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest


def test_entry_point_names_the_plugin_module() -> None:
    eps = {ep.name: ep.value for ep in entry_points(group="dt.plugins")}
    assert eps.get("conv") == "dt_conv.plugin"


@pytest.mark.ranks(2)
def test_handlers_are_installed_by_autoload() -> None:
    import torch
    from torch.distributed.tensor import DTensor

    handlers = DTensor._op_dispatcher._custom_op_handlers
    for op in (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default):
        assert handlers[op].__module__ == "dt_conv.plugin"


def _circular_by_hand(t, left: int, right: int):  # type: ignore[no-untyped-def]
    """Circular padding of the last dim from slices, independent of torch's op."""
    import torch

    return torch.cat([t[..., t.shape[-1] - left :], t, t[..., :right]], dim=-1)


@pytest.mark.ranks(2)
def test_plain_tensors_keep_torchs_circular_padding() -> None:
    """The plugin's autograd kernel for `_pad_circular` must leave plain tensors alone."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 3, 12, dtype=torch.float64)
    y = F.pad(x, (2, 3), mode="circular")
    assert torch.equal(y, _circular_by_hand(x, 2, 3))
    (y * g).sum().backward()
    x2 = x.detach().clone().requires_grad_()
    (_circular_by_hand(x2, 2, 3) * g).sum().backward()
    assert torch.allclose(x.grad, x2.grad)

    conv = torch.nn.Conv2d(2, 2, 3, padding=1, padding_mode="circular").double()
    inp = torch.randn(1, 2, 6, 5, dtype=torch.float64)
    compiled = torch.compile(conv, backend="aot_eager", fullgraph=True)
    assert torch.allclose(compiled(inp), conv(inp))
