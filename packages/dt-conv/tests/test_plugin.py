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
    from dt_conv.handled_ops import HANDLED
    from dt_conv.handlers import HANDLERS
    from torch.distributed.tensor import DTensor

    assert len(set(HANDLED)) == len(HANDLED) == 47  # bicubic and the antialiased modes: 6
    assert set(HANDLERS) == set(HANDLED)  # every op installed has its function, and only those
    installed = DTensor._op_dispatcher._custom_op_handlers
    for name in HANDLED:
        assert installed[getattr(torch.ops.aten, name).default].__module__ == "dt_conv.plugin"
    assert HANDLERS["max_pool3d_with_indices_backward"].__name__ == "max_pool_with_indices_backward"


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


@pytest.mark.ranks(2)
def test_torch_compile_traces_sharded_layers_in_one_graph() -> None:
    """Circular pad, conv, tanh and max-pool compile into one graph (fullgraph) whose
    halo exchanges are functional collectives: values and gradients equal the unsharded
    run, and no collective is left unmatched (a barrier afterwards returns)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from dt_core.testing import cpu_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = cpu_mesh(2)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 2, 10, 9, dtype=torch.float64, generator=gen)
    w = torch.randn(3, 2, 3, 3, dtype=torch.float64, generator=gen)

    def layer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(F.pad(a, (1, 1, 1, 1), mode="circular"), b)
        return F.max_pool2d(torch.tanh(y), 2) * 3

    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    expected = layer(xr, wr)
    expected.square().sum().backward()

    xd = distribute_tensor(x, mesh, [Shard(2)]).requires_grad_(True)
    wd = distribute_tensor(w, mesh, [Replicate()]).requires_grad_(True)
    got = torch.compile(layer, backend="aot_eager", fullgraph=True)(xd, wd)
    got.square().sum().backward()
    assert got.placements == (Shard(2),)
    assert torch.allclose(got.full_tensor(), expected, rtol=0, atol=1e-12)
    assert torch.allclose(xd.grad.full_tensor(), xr.grad, rtol=0, atol=1e-12)
    assert torch.allclose(wd.grad.full_tensor(), wr.grad, rtol=0, atol=1e-12)
    dist.barrier()
