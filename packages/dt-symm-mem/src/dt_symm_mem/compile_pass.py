"""Inductor post-grad pass: fuse all-gather -> matmul and matmul -> reduce-scatter of CPU
process groups into torch's `symm_mem` fused ops (which this plugin runs on CPU).

torch's own micro-pipeline TP pass (`_micro_pipeline_tp`) only fires when NCCL is built
and symmetric memory is enabled for the group. This pass reuses torch's pattern
matchers and rewrites (through dt-core's compat layer) for matches whose tensors live on
the CPU, and leaves CUDA matches to torch's pass.
"""

from __future__ import annotations

from typing import Any

import torch

from dt_symm_mem import compat
from dt_symm_mem.settings import settings


def _on_cpu(node: Any) -> bool:
    try:
        tensor = compat.match_tensor(node)
    except (KeyError, AttributeError, TypeError):
        return False
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu"


def fuse_cpu_collective_matmuls(graph: Any) -> None:
    """Rewrite every fusible CPU all-gather/reduce-scatter + matmul pattern in place."""
    if not settings.current().compile_pass:
        return
    for match in compat.find_all_gather_matches(graph):
        shard_node, _ = compat.all_gather_match_parts(match)
        if _on_cpu(shard_node):
            compat.fuse_all_gather_match(match)
    for match in compat.find_reduce_scatter_matches(graph):
        input_node, _ = compat.reduce_scatter_match_parts(match)
        if _on_cpu(input_node):
            compat.fuse_reduce_scatter_match(match)
