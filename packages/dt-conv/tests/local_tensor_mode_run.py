"""Run by test_compile.py in a fresh process: torch's LocalTensorMode on a fake group."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.testing._internal.distributed.fake_pg import FakeStore

dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
from torch.distributed._local_tensor import LocalTensorMode  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import Replicate, Shard, distribute_tensor  # noqa: E402


def layer(a, b):
    y = F.conv2d(F.pad(a, (1, 1, 1, 1), mode="reflect"), b)
    y = F.max_pool2d(torch.tanh(y), 2)
    y = F.interpolate(y, scale_factor=2, mode="bilinear")
    return F.avg_pool2d(F.pad(y, (1, 1, 1, 1), mode="circular"), 2)


gen = torch.Generator().manual_seed(0)
x = torch.randn(1, 2, 10, 9, dtype=torch.float64, generator=gen)
w = torch.randn(3, 2, 3, 3, dtype=torch.float64, generator=gen)
xr = x.clone().requires_grad_(True)
ref = layer(xr, w)
ref.square().sum().backward()
with LocalTensorMode(2):
    mesh = init_device_mesh("cpu", (2,))
    xd = distribute_tensor(x, mesh, [Shard(2)]).requires_grad_(True)
    out = layer(xd, distribute_tensor(w, mesh, [Replicate()]))
    out.square().sum().backward()
    full, grad = out.full_tensor(), xd.grad.full_tensor()
for r in (0, 1):
    assert torch.allclose(full._local_tensors[r], ref), r
    assert torch.allclose(grad._local_tensors[r], xr.grad), r
print("LOCAL_TENSOR_MODE_EXACT", tuple(out.placements))
