"""Analytical time and memory estimates of an FX graph order; needs no triton and no GPU.

Time: one compute stream runs nodes in order (matmul-like nodes by FLOPs, everything else
by bytes touched); collectives go to one communication stream in issue order, each taking
latency + bytes / bandwidth; a wait stalls compute until its collective is done. The
makespan of that simulation is what reordering tries to reduce.
Memory: every non-view node allocates its output when it runs; a storage is freed after
the last use of it or of any view of it; graph inputs are not counted (they do not move).
The constants are deliberately rough (a CPU host over gloo): only comparisons between two
orders of the same graph use them.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import fx

from dt_fsdp_passes.graph_utils import COLLECTIVES, WAIT, nbytes, val

aten = torch.ops.aten

VIEW_TARGETS = {
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.permute.default,
    aten.t.default,
    aten.transpose.int,
    aten.slice.Tensor,
    aten.select.int,
    aten.expand.default,
    aten.squeeze.dim,
    aten.unsqueeze.default,
    aten.as_strided.default,
    aten.alias.default,
    aten.split.Tensor,
    aten.split_with_sizes.default,
    operator.getitem,
}
MATMUL_TARGETS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}


@dataclass(frozen=True)
class Machine:
    """Throughputs the estimates assume (defaults: a CPU core and gloo over loopback)."""

    flops_per_s: float = 20e9
    memory_bytes_per_s: float = 5e9
    comm_latency_s: float = 100e-6
    comm_bytes_per_s: float = 1e9


def _matmul_flops(node: fx.Node) -> float:
    out = val(node)
    if not isinstance(out, torch.Tensor):
        return 0.0
    tensors = [val(a) for a in node.all_input_nodes if isinstance(val(a), torch.Tensor)]
    if node.target in (aten.addmm.default, aten.baddbmm.default):
        tensors = tensors[1:]
    if not tensors:
        return 0.0
    inner = int(tensors[0].shape[-1]) if tensors[0].dim() else 1
    return 2.0 * int(out.numel()) * inner


def node_seconds(node: fx.Node, machine: Machine) -> float:
    """Estimated compute-stream time of one node."""
    if node.op != "call_function" or node.target in VIEW_TARGETS or node.target is WAIT:
        return 0.0
    if node.target in COLLECTIVES:
        return machine.comm_latency_s * 0.1  # issuing is cheap; the transfer is elsewhere
    if node.target in MATMUL_TARGETS:
        return _matmul_flops(node) / machine.flops_per_s
    touched = nbytes(val(node)) + sum(nbytes(val(a)) for a in node.all_input_nodes)
    return touched / machine.memory_bytes_per_s


def collective_seconds(node: fx.Node, machine: Machine) -> float:
    """latency + bytes on the wire / bandwidth (the larger of input and output)."""
    size = max(nbytes(val(node)), *(nbytes(val(a)) for a in node.all_input_nodes))
    return machine.comm_latency_s + size / machine.comm_bytes_per_s


def estimate_seconds(order: Sequence[fx.Node], machine: Machine) -> float:
    """Makespan of the order under the two-stream model."""
    now = 0.0
    comm_free = 0.0
    done: dict[fx.Node, float] = {}
    for node in order:
        if node.op == "call_function" and node.target in COLLECTIVES:
            start = max(now, comm_free)
            comm_free = start + collective_seconds(node, machine)
            done[node] = comm_free
            now += node_seconds(node, machine)
        elif node.op == "call_function" and node.target is WAIT:
            source = node.args[0]
            now = max(now, done.get(source, now))  # type: ignore[arg-type]  # wait_tensor's arg: a node
        else:
            now += node_seconds(node, machine)
    return max(now, comm_free)


def _storage_root(node: fx.Node, roots: dict[fx.Node, fx.Node]) -> fx.Node:
    if node.op == "call_function" and node.target in VIEW_TARGETS and node.all_input_nodes:
        return roots.get(node.all_input_nodes[0], node.all_input_nodes[0])
    return node


def estimate_peak_bytes(order: Sequence[fx.Node]) -> int:
    """Peak bytes of intermediate storages alive at once, for this order."""
    position = {n: i for i, n in enumerate(order)}
    roots: dict[fx.Node, fx.Node] = {}
    last_use: dict[fx.Node, int] = {}
    for node in order:
        root = _storage_root(node, roots)
        roots[node] = root
    end = len(order)
    for node in order:
        root = roots[node]
        for user in node.users:
            last = end if user.op == "output" else position.get(user, end)
            last_use[root] = max(last_use.get(root, -1), last)
    frees: dict[int, int] = {}
    live = peak = 0
    for i, node in enumerate(order):
        if node.op in ("placeholder", "output") or roots[node] is not node:
            pass
        else:
            size = nbytes(val(node))
            live += size
            release = last_use.get(node, i)
            frees[release] = frees.get(release, 0) + size
        peak = max(peak, live)
        live -= frees.pop(i, 0)
    return peak
