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
