"""Llama-style blocks wired the way torchtitan wires them, on 4 gloo ranks (2 x 2 meshes,
compiled) and 8 (2 x 2 x 2, eager), every plugin installed: FSDP2 (`fully_shard` per
block, then the root), tensor parallelism through `parallelize_module` with sequence
parallelism, context parallelism through torch's
`_ContextParallel` wrapper with `_context_parallel_shard` and its head-tail balancer,
each block compiled on its own with `_micro_pipeline_tp` on, AdamW.

Every run trains for STEPS steps and compares each step's loss and the final parameters
with one process training the same model on the whole batch.
"""

from __future__ import annotations

import pytest

STEPS = 3
TOL = 2e-5  # fp32: sharded reductions sum in another order
DIM, HEADS, HIDDEN, BATCH, SEQ = 16, 4, 32, 4, 16


def _llama(layers: int = 2):
    """RMSNorm -> attention (q/k/v/o, causal SDPA in its own module) -> RMSNorm -> SwiGLU,
    residual around each, bias-free linears: torchtitan's llama block, small."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class SDPA(nn.Module):  # the module torch's CP wrapper attaches to
        def forward(self, q, k, v):  # type: ignore[no-untyped-def]
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
            self.sdpa = SDPA()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s = x.shape[:2]
            # -1 heads: under TP each rank holds its share of the heads
            q, k, v = (
                w(x).view(b, s, -1, DIM // HEADS).transpose(1, 2)
                for w in (self.wq, self.wk, self.wv)
            )
            return self.wo(self.sdpa(q, k, v).transpose(1, 2).reshape(b, s, -1))

    class FeedForward(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
            self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
            self.w3 = nn.Linear(DIM, HIDDEN, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention_norm = nn.RMSNorm(DIM)
            self.attention = Attention()
            self.ffn_norm = nn.RMSNorm(DIM)
            self.feed_forward = FeedForward()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x + self.attention(self.attention_norm(x))
            return h + self.feed_forward(self.ffn_norm(h))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleDict({str(i): Block() for i in range(layers)})

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers.values():
                x = layer(x)
            return x

    torch.manual_seed(0)
    return Model()


def _tp_plan():
    """torchtitan's plan for a llama block (sequence parallel norms, colwise q/k/v/w1/w3,
    rowwise o/w2 back to sequence shards)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return {
        "attention_norm": SequenceParallel(),
        "attention": gather,
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": gather,
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": ColwiseParallel(),
    }


def _batches():
    import torch

    gen = torch.Generator().manual_seed(1)
    return [
        (torch.randn(BATCH, SEQ, DIM, generator=gen), torch.randn(BATCH, SEQ, DIM, generator=gen))
        for _ in range(STEPS)
    ]


def _reference_losses(model) -> list[float]:
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in _batches():
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def _train(model, local_batch, scale: float) -> list[float]:
    """AdamW steps on this rank's share; each rank's loss is its squared-error sum times
    `scale`, chosen so the ranks' gradients (summed by TP, averaged by FSDP) are the
    whole batch's mean-loss gradient. Returns the whole-batch loss of each step."""
    import torch
    import torch.distributed as dist

    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in _batches():
        xl, yl = local_batch(x, y)
        opt.zero_grad()
        total = ((model(xl.requires_grad_()) - yl) ** 2).sum()
        (total * scale).backward()
        opt.step()
        value = total.detach() / (BATCH * SEQ * DIM)
        dist.all_reduce(value)
        losses.append(float(value))
    return losses


def _max_param_error(reference, model) -> float:
    import torch
    from torch.distributed.tensor import DTensor

    errors = []
    for (name, want), got in zip(reference.named_parameters(), model.parameters(), strict=True):
        full = got.full_tensor() if isinstance(got, DTensor) else got
        errors.append(float((want.detach() - full.detach()).abs().max()))
        assert full.shape == want.shape, name
    return max(errors) if errors else float(torch.inf)


def _compile_blocks(model) -> None:
    import torch

    for name, block in list(model.layers.items()):
        model.layers[name] = torch.compile(block, fullgraph=True)


@pytest.mark.compile_heavy
@pytest.mark.ranks(4, timeout=900)
def test_fsdp2_x_sequence_parallel_tp_compiled_per_block_fuses_every_tp_collective() -> None:
    """dp x tp = 2 x 2. Every TP all-gather and reduce-scatter in the compiled blocks is a
    fused symm_mem op, the input-gradient sums of q/k/v and w1/w3 included."""
    import torch
    from dt_core.testing import cpu_mesh
    from dt_core.testing.compiled import collective_counts, run_and_get_code
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    torch.set_num_threads(1)
    torch._dynamo.reset()
    mesh = cpu_mesh((2, 2), ("dp", "tp"))
    reference = _llama()
    model = _llama()
    tp_mesh, dp_mesh = mesh["tp"], mesh["dp"]
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, _tp_plan())
    _compile_blocks(model)
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    dp, tp = dp_mesh.get_local_rank(), tp_mesh.get_local_rank()

    def local_batch(x, y):  # batch split over dp, sequence over tp (torchtitan's SP input)
        return tuple(t.chunk(2)[dp].chunk(2, dim=1)[tp].contiguous() for t in (x, y))

    with torch._inductor.config.patch(_micro_pipeline_tp=True):
        x0, _ = local_batch(*_batches()[0])
        _, codes = run_and_get_code(lambda: model(x0.requires_grad_()).sum().backward())
        losses = _train(model, local_batch, scale=2 / (BATCH * SEQ * DIM))
    want = _reference_losses(reference)
    assert max(abs(a - b) for a, b in zip(losses, want, strict=True)) < TOL, (losses, want)
    assert _max_param_error(reference, model) < TOL
    names = (
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
        "fused_all_gather_matmul",
        "fused_matmul_reduce_scatter",
        "fused_matmuls_reduce_scatter",
    )
    counts = [collective_counts(code, names) for code in codes]
    # One forward and one backward program: the second block reuses the first block's
    # compiled code (the meshes are sliced once, as torchtitan does; a mesh sliced per
    # block is another object, and Dynamo's guard on it compiles each block anew). In
    # each: the attention and FFN input gathers fused with their matmuls, and two
    # reduce-scatters fused: o and w2 forward (one matmul each), the summed q+k+v and
    # w1+w3 input gradients backward (dt-symm-mem's summed op). No TP collective is
    # left on its own.
    forward = {
        "all_gather_into_tensor": 0,
        "reduce_scatter_tensor": 0,
        "fused_all_gather_matmul": 2,
        "fused_matmul_reduce_scatter": 2,
        "fused_matmuls_reduce_scatter": 0,
    }
    backward = {**forward, "fused_matmul_reduce_scatter": 0, "fused_matmuls_reduce_scatter": 2}
    assert counts == [forward, backward], counts


def _torch_cp_globals_restorer():  # type: ignore[no-untyped-def]
    """torch's CP APIs set module globals (`_context_parallel_shard` switches the dispatch
    mode and load balancing for the process); the rank worlds are shared by later tests,
    so this test puts them back as it found them."""
    from torch.distributed.tensor.experimental._context_parallel import _attention

    mode = _attention._dispatch_mode
    balance = _attention._cp_options.enable_load_balance
    rotate = _attention._cp_options.rotate_method

    def restore() -> None:
        _attention._dispatch_mode = mode
        _attention._cp_options.enable_load_balance = balance
        _attention._cp_options.rotate_method = rotate

    return restore


def _train_under_torch_cp(model, reference, local_batch, restore) -> None:  # type: ignore[no-untyped-def]
    """Train with torch's CP dispatcher on (FSDP over 4 ranks: the loss scale), compare
    with one process, check dt-cp's kernels ran, and put torch's CP globals back."""
    from dt_core.kit import stats
    from torch.distributed.tensor.experimental._attention import (
        _disable_context_parallel_dispatcher,
        _enable_context_parallel_dispatcher,
    )

    before = stats().get("cp", {}).get("score_elements", 0)
    _enable_context_parallel_dispatcher()
    try:
        losses = _train(model, local_batch, scale=4 / (BATCH * SEQ * DIM))
    finally:
        _disable_context_parallel_dispatcher()
        restore()
    want = _reference_losses(reference)
    assert max(abs(a - b) for a, b in zip(losses, want, strict=True)) < TOL, (losses, want)
    assert _max_param_error(reference, model) < TOL
    assert stats().get("cp", {}).get("score_elements", 0) > before  # dt-cp's kernels ran


@pytest.mark.compile_heavy
@pytest.mark.ranks(4, timeout=900)
def test_fsdp2_x_context_parallel_head_tail_compiled_per_block() -> None:
    """dp x cp = 2 x 2: FSDP2 over all four ranks (torchtitan shards over dp and cp
    together), the batch split over dp, the sequence over cp by torch's head-tail
    balancer; dt-cp computes the attention (torch alone has no CPU path)."""
    import torch
    from dt_core.testing import cpu_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.experimental._attention import (
        _context_parallel_shard,
        _ContextParallel,
    )
    from torch.distributed.tensor.experimental._context_parallel import _HeadTailLoadBalancer
    from torch.distributed.tensor.parallel import parallelize_module

    torch.set_num_threads(1)
    torch._dynamo.reset()
    restore = _torch_cp_globals_restorer()
    mesh = cpu_mesh((2, 2), ("dp", "cp"))
    everyone = cpu_mesh(4)
    reference = _llama()
    model = _llama()
    style = _ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.SDPA)
    cp_mesh = mesh["cp"]
    for block in model.layers.values():
        parallelize_module(block.attention.sdpa, cp_mesh, style)
    _compile_blocks(model)
    for block in model.layers.values():
        fully_shard(block, mesh=everyone)
    fully_shard(model, mesh=everyone)
    dp = mesh["dp"].get_local_rank()
    balancer = _HeadTailLoadBalancer(SEQ, 2, "cpu")

    def local_batch(x, y):
        mine = [t.chunk(2)[dp].contiguous() for t in (x, y)]
        return _context_parallel_shard(cp_mesh, mine, [1, 1], load_balancer=balancer)

    _train_under_torch_cp(model, reference, local_batch, restore)


@pytest.mark.ci_once
@pytest.mark.ranks(8, timeout=900)
def test_fsdp2_x_tp_x_cp_on_a_2x2x2_mesh_eager() -> None:
    """dp x cp x tp = 2 x 2 x 2, torchtitan's order: the sequence split over cp by torch's
    head-tail balancer, then over tp by sequence parallelism; FSDP2 over dp and cp
    together. Eager (on 2 shared cores eight ranks compiling would cost minutes; the
    compiled runs above are 2 x 2)."""
    import torch
    from dt_core.testing import cpu_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.experimental._attention import (
        _context_parallel_shard,
        _ContextParallel,
    )
    from torch.distributed.tensor.experimental._context_parallel import _HeadTailLoadBalancer
    from torch.distributed.tensor.parallel import parallelize_module

    torch.set_num_threads(1)
    restore = _torch_cp_globals_restorer()
    mesh = cpu_mesh((2, 2, 2), ("dp", "cp", "tp"))
    fsdp_mesh = mesh["dp", "cp"]._flatten("dp_cp_framework_shaped")
    reference = _llama()
    model = _llama()
    style = _ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.SDPA)
    for block in model.layers.values():
        parallelize_module(block, mesh["tp"], _tp_plan())
        parallelize_module(block.attention.sdpa, mesh["cp"], style)
    for block in model.layers.values():
        fully_shard(block, mesh=fsdp_mesh)
    fully_shard(model, mesh=fsdp_mesh)
    dp, tp = mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank()
    balancer = _HeadTailLoadBalancer(SEQ, 2, "cpu")

    def local_batch(x, y):
        mine = [t.chunk(2)[dp].contiguous() for t in (x, y)]
        ours = _context_parallel_shard(mesh["cp"], mine, [1, 1], load_balancer=balancer)
        return tuple(t.chunk(2, dim=1)[tp].contiguous() for t in ours)

    _train_under_torch_cp(model, reference, local_batch, restore)
