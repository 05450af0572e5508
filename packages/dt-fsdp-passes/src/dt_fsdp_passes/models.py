"""Tiny models and a train-and-compare loop shared by the demo, the benchmark and the tests."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


class MLP(nn.Module):
    def __init__(self, width: int, depth: int, bias: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width, bias=bias) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


class BlockMLP(nn.Module):
    """The MLP's linears grouped `per_block` to a block (`blocks.<i>`): a module owning
    several parameters, which is what per-module bucketing merges."""

    def __init__(self, width: int, depth: int, per_block: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(per_block)))
            for _ in range(depth // per_block)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            assert isinstance(block, nn.Sequential)  # built so in __init__; narrows for mypy
            for layer in block:
                x = torch.relu(layer(x))
        return x


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.down(torch.relu(self.up(self.norm2(x))))


class ParallelAttention(nn.Module):
    """Bias-free causal self-attention (torchtitan style) ready for TP and CP: heads split
    over tp (Colwise wq/wk/wv, Rowwise wo: pass `tp`, the tp size) and the sequence over
    cp (pass `cp_mesh`: q/k/v become DTensors sharded on the sequence dim, which dt-cp's
    attention handles). Without either it is the plain one-process module."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.dim, self.heads = dim, heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def attention(self, x: torch.Tensor, cp_mesh: Any = None, tp: int = 1) -> torch.Tensor:
        from torch.distributed.tensor import DTensor, Shard

        b, s, _ = x.shape
        q, k, v = (
            w(x).reshape(b, s, self.heads // tp, self.dim // self.heads).transpose(1, 2)
            for w in (self.wq, self.wk, self.wv)
        )
        if cp_mesh is not None:
            q, k, v = (DTensor.from_local(t, cp_mesh, [Shard(2)]) for t in (q, k, v))
        o = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        if isinstance(o, DTensor):  # the context-parallel path (cp_mesh given)
            o = o.to_local()
        return self.wo(o.transpose(1, 2).reshape(b, s, self.dim // tp))

    def forward(self, x: torch.Tensor, cp_mesh: Any = None, tp: int = 1) -> torch.Tensor:
        return self.attention(x, cp_mesh, tp)


class ParallelBlock(ParallelAttention):
    """ParallelAttention and an MLP (Colwise fc1, Rowwise fc2), each with a residual."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__(dim, heads)
        self.fc1 = nn.Linear(dim, 2 * dim, bias=False)
        self.fc2 = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cp_mesh: Any = None, tp: int = 1) -> torch.Tensor:
        x = x + self.attention(x, cp_mesh, tp)
        return x + self.fc2(torch.relu(self.fc1(x)))


class Transformer(nn.Module):
    def __init__(self, vocab: int = 11, dim: int = 8, heads: int = 2, depth: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


def cross_entropy(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


def train_and_compare(
    reference: nn.Module,
    sharded: nn.Module,
    run: Callable[[Any], torch.Tensor],
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    optimizer: Callable[[Any], torch.optim.Optimizer],
) -> dict[str, float]:
    """Train the unsharded reference on whole batches and the sharded model on this rank's
    slice; returns the largest loss and parameter differences (fp32 math on both)."""
    from dt_fsdp_passes import gathered_state

    rank, world = dist.get_rank(), dist.get_world_size()
    opt_ref, opt = optimizer(reference.parameters()), optimizer(sharded.parameters())
    loss_error = 0.0
    for x, y in batches:
        ref_loss = loss_fn(reference(x), y)
        ref_loss.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        loss = loss_fn(run(x.chunk(world)[rank]), y.chunk(world)[rank])
        loss.backward()
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        loss_error = max(loss_error, abs(mean.item() / world - ref_loss.item()))
    state = gathered_state(sharded)
    param_error = max(
        (state[name] - p.detach()).abs().max().item() for name, p in reference.named_parameters()
    )
    return {"loss": loss_error, "params": param_error}


def twin(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)
