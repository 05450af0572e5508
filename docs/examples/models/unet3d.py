"""Train MONAI's 3-D UNet on a volume split across ranks along its depth.

    torchrun --nproc-per-node 2 unet3d.py            # 32^3 volume, CPU ranks (gloo)
    torchrun --nproc-per-node 4 unet3d.py --size 128

Only the input is sharded: each rank holds 1/P of the depth of every activation. The
parameters are replicated; dt-conv exchanges halos for the convolutions and combines the
batch-norm statistics of all ranks, so each step equals one process's step.
"""

import argparse
import os

import torch
import torch.distributed as dist
from monai.networks.nets import UNet
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_module, distribute_tensor


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=32, help="edge of the cubic volume")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = "cuda" if backend == "nccl" else "cpu"
    mesh = init_device_mesh(device, (int(os.environ["WORLD_SIZE"]),))
    if device == "cuda":
        torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())

    torch.manual_seed(0)  # the same weights on every rank
    model = UNet(
        spatial_dims=3,
        in_channels=1,
        out_channels=2,
        channels=(8, 16, 32),
        strides=(2, 2),
        num_res_units=1,
        norm="batch",
    ).to(device)
    distribute_module(model, mesh)  # parameters and buffers replicated
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    for step in range(args.steps):
        torch.manual_seed(step)  # the same batch on every rank; each keeps its slab
        volume = torch.randn(2, 1, args.size, args.size, args.size, device=device)
        target = torch.cat([volume < 0, volume >= 0], dim=1).float()  # two classes
        x = distribute_tensor(volume, mesh, [Shard(2)])  # depth split across ranks
        y = distribute_tensor(target, mesh, [Shard(2)])
        logits = model(x)  # stays Shard(2): no rank holds the whole activation
        loss = (logits.softmax(dim=1) - y).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        value = loss.full_tensor().item()  # a collective: every rank takes part
        if dist.get_rank() == 0:
            print(f"step {step}: loss {value:.4f}, logits {logits.placements}")
    first_norm = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm3d))
    running_mean = first_norm.running_mean.full_tensor()  # the same on every rank
    if dist.get_rank() == 0:
        print("running mean of the first norm:", running_mean.tolist())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
