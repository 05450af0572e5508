"""Compiles that follow compiles: a compiled simple_fsdp model, with the bucketing passes
under Inductor, trained on batches of other sizes in one process (Dynamo recompiles with
the batch symbolic), each step's gradients equal to one process's on the whole batch."""

from __future__ import annotations

import copy

import pytest
import torch
from dt_core.testing import cpu_mesh
from torch import nn


@pytest.mark.compile_heavy
@pytest.mark.ranks(2, timeout=600)
def test_batch_sizes_that_follow_each_other() -> None:
    import torch.distributed as dist
    from dt_fsdp_passes import simple_fsdp

    torch.set_num_threads(1)
    torch._dynamo.reset()
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).double()
    model = simple_fsdp(copy.deepcopy(reference), cpu_mesh(2))
    compiled = torch.compile(model, backend="inductor", fullgraph=True)
    rank = dist.get_rank()
    for batch in (4, 6, 10, 3):
        x = torch.randn(2 * batch, 8, generator=torch.Generator().manual_seed(batch))
        x = x.double()
        for p in [*reference.parameters(), *model.parameters()]:
            p.grad = None
        reference(x).pow(2).mean().backward()
        # each rank's mean over its half; simple_fsdp averages gradients over ranks
        compiled(x.chunk(2)[rank]).pow(2).mean().backward()
        for (name, p), want in zip(model.named_parameters(), reference.parameters()):
            assert p.grad is not None, name
            torch.testing.assert_close(p.grad.full_tensor(), want.grad, msg=f"{batch} {name}")
