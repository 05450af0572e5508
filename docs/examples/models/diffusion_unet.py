"""One denoising training step after another for a diffusers UNet, the image split across
ranks along its height.

    torchrun --nproc-per-node 2 diffusion_unet.py            # 64x64 images, CPU ranks
    torchrun --nproc-per-node 4 diffusion_unet.py --size 512

Only the noisy image is sharded. Group norm combines statistics over all ranks (dt-conv),
the attention blocks see the image as a sequence of tokens sharded like its rows, and
attend over every rank's tokens through a ring (dt-cp). The timesteps stay plain tensors:
the model builds their embedding with plain torch ops, so forward and backward run
under `implicit_replication` (DTensor then takes those tensors as replicated).
"""

import argparse
import os

import torch
import torch.distributed as dist
from diffusers import DDPMScheduler, UNet2DModel
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.experimental import implicit_replication


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=64, help="edge of the square image")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    torch.manual_seed(0)  # the same weights on every rank
    model = UNet2DModel(
        sample_size=args.size,
        in_channels=3,
        out_channels=3,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
    )
    distribute_module(model, mesh)  # parameters replicated
    scheduler = DDPMScheduler(num_train_timesteps=1000)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    for step in range(args.steps):
        torch.manual_seed(step)  # the same batch and noise on every rank
        images = torch.randn(2, 3, args.size, args.size)
        noise = torch.randn_like(images)
        timesteps = torch.randint(0, 1000, (2,))
        noisy = scheduler.add_noise(images, noise, timesteps)
        x = distribute_tensor(noisy, mesh, [Shard(2)])  # rows split across ranks
        target = distribute_tensor(noise, mesh, [Shard(2)])
        with implicit_replication():
            predicted = model(x, timesteps).sample  # stays Shard(2)
            loss = (predicted - target).pow(2).mean()
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        value = loss.full_tensor().item()  # a collective: every rank takes part
        if dist.get_rank() == 0:
            print(f"step {step}: loss {value:.4f}, prediction {predicted.placements}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
