"""torch's own context-parallel APIs with dt-cp installed equal one process, or refuse.

Patterns of torch's CP tests and of torchtitan's way of applying CP, on CPU / gloo: the
legacy `context_parallel()` manager (head-tail balancing on or off by length),
`set_rotate_method`, the module wrapper `_ContextParallel` with `_context_parallel_shard`
and `_HeadTailLoadBalancer` (or none), `context_parallel_unshard`, and torch.compile of a
wrapped module. Every case compares output and dq/dk/dv in float64 with plain SDPA on the
full sequence. Lengths torch's state cannot describe raise a clear error on every rank.
"""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch
import torch.nn.functional as F
from cp_cases import make_qkv, run_all
from dt_core.testing import cpu_mesh

ATOL = 1e-10


class Attention(torch.nn.Module):
    """The attention core a model would wrap with `_ContextParallel` (torchtitan style)."""

    def __init__(self, causal: bool, gqa: bool) -> None:
        super().__init__()
        self.causal, self.gqa = causal, gqa

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=self.gqa)


def reference(shape: tuple, kv_heads: int, causal: bool, seed: int) -> tuple[list, list]:
    q, k, v, g = make_qkv(shape, kv_heads, seed)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=kv_heads != shape[1])
    (out * g).sum().backward()
    return [q, k, v, g], [out.detach(), *(t.grad for t in leaves)]


def mismatch(name: str, got: list[torch.Tensor], want: list[torch.Tensor]) -> str | None:
    for label, a, b in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        if a.shape != b.shape:
            return f"{name}: {label} shape {tuple(a.shape)} != {tuple(b.shape)}"
        err = (a - b).abs().max().item()
        if not err <= ATOL:
            return f"{name}: {label} max error {err:.3g}"
    return None


def restore_torch_cp_globals() -> None:
    """Put torch's CP globals back to their import-time values (worlds are shared)."""
    from torch.distributed.tensor.experimental._context_parallel import _attention

    _attention._cp_options.enable_load_balance = True
    _attention.set_rotate_method("allgather")
    _attention._dispatch_mode = _attention._DispatchMode.MONKEY_PATCH


def torch_balances_any_length() -> bool:
    """Whether torch's default head-tail balancer is made for a sequence it cannot split
    (torch before 2.13), so `context_parallel` itself asserts on such a sequence."""
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
        _create_default_load_balancer,
    )

    return _create_default_load_balancer(3, 1, "cpu") is not None


def legacy_refusal_case(mesh, shape, kv_heads, causal, rotate) -> str | None:
    """Older torch: `context_parallel` on a sequence its head-tail balancer cannot split
    raises torch's own AssertionError from the balancer, plugins installed or not."""
    try:
        legacy_case(mesh, shape, kv_heads, causal, rotate)
    except AssertionError as error:
        frames = [f.name for f in __import__("traceback").extract_tb(error.__traceback__)]
        if "_generate_indices" in frames:
            return None
        raise
    return f"context_parallel S={shape[2]}: torch's balancer accepted a length it cannot split"


def legacy_case(mesh, shape, kv_heads, causal, rotate, seed=0) -> str | None:
    """`context_parallel(mesh, buffers=...)` around plain SDPA, then unshard."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import (
        context_parallel_unshard,
        set_rotate_method,
    )

    full, want = reference(shape, kv_heads, causal, seed)
    set_rotate_method(rotate)
    buffers = [t.clone() for t in full]
    try:
        with context_parallel(
            mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2, 2], no_restore_buffers=set(buffers)
        ):
            q, k, v, g = buffers
            for t in (q, k, v):
                t.requires_grad_()
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=causal, enable_gqa=kv_heads != shape[1]
            )
            out.backward(g)
            got = context_parallel_unshard(
                mesh, [out.detach(), q.grad, k.grad, v.grad], [2, 2, 2, 2]
            )
    finally:
        restore_torch_cp_globals()
    name = f"context_parallel S={shape[2]} causal={causal} gqa={kv_heads} {rotate}"
    return mismatch(name, got, want)


def wrapper_case(mesh, shape, kv_heads, causal, balance, compiled="", seed=0) -> str | None:
    """torchtitan's way: `_ContextParallel` on the attention module, buffers sharded by
    `_context_parallel_shard` (head-tail balancer or none), dispatcher enabled.

    compiled="forward": the module's forward compiled with fullgraph=True (torch's hooks,
    which call `DTensor.from_local`, run eagerly around it); "module": the whole wrapped
    module compiled (dynamo breaks the graph at torch's `from_local` in the hook).
    """
    from torch.distributed.tensor.experimental._attention import (
        _context_parallel_shard,
        _ContextParallel,
        _disable_context_parallel_dispatcher,
        _enable_context_parallel_dispatcher,
        context_parallel_unshard,
    )
    from torch.distributed.tensor.experimental._context_parallel import _HeadTailLoadBalancer
    from torch.distributed.tensor.parallel import parallelize_module

    full, want = reference(shape, kv_heads, causal, seed)
    size = mesh.size()
    balancer = _HeadTailLoadBalancer(shape[2], size, "cpu") if balance else None
    module = Attention(causal, kv_heads != shape[1])
    style = _ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.SDPA)
    parallelize_module(module, mesh, style)
    run = module
    if compiled == "forward":
        module.forward = torch.compile(module.forward, backend="aot_eager", fullgraph=True)
    elif compiled == "module":
        run = torch.compile(module, backend="aot_eager")
    q, k, v, g = _context_parallel_shard(mesh, full, [2, 2, 2, 2], load_balancer=balancer)
    _enable_context_parallel_dispatcher()
    try:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = run(*leaves)
        out.backward(g)
        grads = [t.grad for t in leaves]
        got = context_parallel_unshard(mesh, [out.detach(), *grads], [2] * 4, balancer)
    finally:
        _disable_context_parallel_dispatcher()
        restore_torch_cp_globals()
    name = (
        f"_ContextParallel S={shape[2]} causal={causal} gqa={kv_heads} balance={balance} {compiled}"
    )
    return mismatch(name, got, want)


def declared_balancer_case(mesh, kind: str) -> str | None:
    """A torch balancer other than head-tail, named to dt-cp: causal SDPA through
    `_ContextParallel` follows its permutation exactly."""
    import dt_cp
    from torch.distributed.tensor.experimental._attention import (
        _context_parallel_shard,
        _ContextParallel,
        _disable_context_parallel_dispatcher,
        _enable_context_parallel_dispatcher,
        context_parallel_unshard,
    )
    from torch.distributed.tensor.experimental._context_parallel import (
        _PerDocumentHeadTailLoadBalancer,
        _PTRRLoadBalancer,
    )
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.nn.attention.flex_attention import create_block_mask

    world = mesh.size()
    if kind == "per-document":
        docs = [2 * world, 6 * world]
        shape = (1, 4, sum(docs), 8)
        balancer = _PerDocumentHeadTailLoadBalancer([docs], world, "cpu")
    else:
        shape = (1, 4, 128 * world, 8)  # PTRR shares out 128-row blocks

        def causal_mask(b, h, qi, ki):
            return ki <= qi

        block_mask = create_block_mask(causal_mask, 1, 1, shape[2], shape[2], device="cpu")
        balancer = _PTRRLoadBalancer(block_mask, world)
    full, want = reference(shape, 2, True, seed=7)
    module = Attention(True, True)
    style = _ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.SDPA)
    parallelize_module(module, mesh, style)
    q, k, v, g = _context_parallel_shard(mesh, full, [2] * 4, load_balancer=balancer)
    _enable_context_parallel_dispatcher()
    try:
        with dt_cp.settings(torch_load_balancer=balancer):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out = module(*leaves)
            out.backward(g)
        got = context_parallel_unshard(
            mesh, [out.detach(), *(t.grad for t in leaves)], [2] * 4, balancer
        )
    finally:
        _disable_context_parallel_dispatcher()
        restore_torch_cp_globals()
    return mismatch(f"declared {kind} balancer", got, want)


def torch_api_cases(world: int) -> None:
    mesh = cpu_mesh(world)
    cases = []
    # 4·P splits head-tail (balanced); 3·P does not split into 2·P pieces (not balanced).
    for s, causal, gqa, rotate in itertools.product(
        (4 * world, 3 * world), (True, False), (False, True), ("allgather", "alltoall")
    ):
        shape, kv = (2, 4, s, 8), (2 if gqa else 4)
        case = legacy_case
        if s % (2 * world) and torch_balances_any_length():
            case = legacy_refusal_case  # torch asserts, as without the plugins
        cases.append(
            (
                "legacy",
                lambda shape=shape, kv=kv, c=causal, r=rotate, case=case: case(
                    mesh, shape, kv, c, r
                ),
            )
        )
    for s, causal, gqa, balance in itertools.product(
        (4 * world, 3 * world), (True, False), (False, True), (True, False)
    ):
        if balance and s % (2 * world):
            continue  # torch's head-tail balancer cannot split it (torch asserts)
        shape, kv = (1, 4, s, 8), (2 if gqa else 4)
        cases.append(
            (
                "wrapper",
                lambda shape=shape, kv=kv, c=causal, b=balance: wrapper_case(mesh, shape, kv, c, b),
            )
        )
    shape = (1, 4, 4 * world, 8)
    for how in ("forward", "module"):
        cases.append(("compiled", lambda how=how: wrapper_case(mesh, shape, 2, True, True, how)))
    cases.append(("dt-cp after torch", lambda: dt_cp_mode_after_torch_cp(mesh)))
    for kind in ("per-document", "ptrr"):
        cases.append((kind, lambda kind=kind: declared_balancer_case(mesh, kind)))
    run_all(cases)
    refusals(mesh)


def dt_cp_mode_after_torch_cp(mesh) -> str | None:
    """dt-cp's own DTensors keep working with torch's globals at their defaults
    (`enable_load_balance` True, dispatcher off)."""
    from cp_cases import compare, sdpa
    from dt_cp.compat.context_parallel import torch_cp_state

    state = torch_cp_state()
    assert state is not None and state.load_balance and not state.dispatcher_enabled
    for balancer in ("none", "head_tail"):
        f = sdpa(is_causal=True)
        failure = compare(f"dt-cp {balancer}", f, f, mesh, (1, 2, 13, 4), balancer=balancer)
        if failure:
            return failure
    return None


def refusals(mesh) -> None:
    """Where torch's state leaves the layout unknown: a clear error on every rank."""
    import dt_cp
    from dt_cp.torch_cp import TorchLayoutError
    from torch.distributed.tensor import Replicate, distribute_tensor
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import (
        _context_parallel_shard,
        _disable_context_parallel_dispatcher,
        _enable_context_parallel_dispatcher,
    )
    from torch.distributed.tensor.experimental._context_parallel import _HeadTailLoadBalancer

    world = mesh.size()
    q, k, v, _ = make_qkv((1, 2, 4 * world, 4), 2, seed=3)
    causal = {"is_causal": True}

    # A length Shard splits unevenly: torch's hooks mis-state the global length. (Before
    # 2.13 torch's own balancer asserts on such a length first, plugins or not.)
    buffers = [t[:, :, : 3 * world + 1].clone() for t in (q, k, v)]
    refusal = torch_balances_any_length()
    try:
        with pytest.raises(AssertionError) if refusal else contextlib.nullcontext():
            with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2]):
                with pytest.raises(TorchLayoutError, match="local sequence lengths differ"):
                    F.scaled_dot_product_attention(*buffers, **causal)
    finally:
        restore_torch_cp_globals()

    # torch sharded with a balancer but its dispatcher is off: order unknown.
    balancer = _HeadTailLoadBalancer(q.shape[2], world, "cpu")
    try:
        _context_parallel_shard(mesh, [q.clone()], [2], load_balancer=balancer)
        qd, kd, vd = (dt_cp.shard_sequence(t, mesh, 2) for t in (q, k, v))
        with pytest.raises(TorchLayoutError, match="dispatcher is off"):
            F.scaled_dot_product_attention(qd, kd, vd, **causal)
        with dt_cp.settings(torch_cp="ignore"):  # the user says: dt-cp's layout
            got = F.scaled_dot_product_attention(qd, kd, vd, **causal).full_tensor()
        assert (got - F.scaled_dot_product_attention(q, k, v, **causal)).abs().max() < ATOL

        # Dispatcher on with head-tail: dt-cp layouts that disagree are refused.
        _enable_context_parallel_dispatcher()
        with pytest.raises(TorchLayoutError, match="load_balancer='none'"):
            dt_cp.shard_sequence(q, mesh, 2, load_balancer="none")
        qd, kd, vd = (dt_cp.shard_sequence(t, mesh, 2, "head_tail") for t in (q, k, v))
        with dt_cp.settings(load_balancer="document", documents=(q.shape[2],)):
            with pytest.raises(TorchLayoutError, match="'document'"):
                F.scaled_dot_product_attention(qd, kd, vd, **causal)
        # A declared balancer that does not fit the mesh or the length: named, refused.
        for wrong, match in (
            (_HeadTailLoadBalancer(q.shape[2], 2 * world, "cpu"), "world size"),
            (_HeadTailLoadBalancer(2 * q.shape[2], world, "cpu"), "permutes"),
        ):
            with dt_cp.settings(torch_load_balancer=wrong):
                with pytest.raises(TorchLayoutError, match=f"torch_load_balancer.*{match}"):
                    F.scaled_dot_product_attention(qd, kd, vd, **causal)
        with pytest.raises(TypeError, match="torch_load_balancer"):
            with dt_cp.settings(torch_load_balancer="head_tail"):
                pass
        # The replicate fallback would read the permuted order: refused, not computed.
        k_rep = distribute_tensor(k, mesh, [Replicate()])
        with pytest.raises(ValueError, match="permuted order"):
            F.scaled_dot_product_attention(qd, k_rep, vd, **causal)
    finally:
        _disable_context_parallel_dispatcher()
        restore_torch_cp_globals()


@pytest.mark.ranks(2, 4)
def test_torch_cp_apis(world_size: int) -> None:
    torch_api_cases(world_size)


@pytest.mark.ranks(2, timeout=600)  # compiles flex: past 120 s on torch 2.11 under load
def test_torch_flex_cp_module_wrapper_with_balancers() -> None:
    """`_ContextParallel(FLEX)` with torch's balancers and a sharded BlockMask (torchtitan's
    flex path). q stays a plain local tensor and K/V are gathered as plain tensors, so
    dt-cp takes no part: the forward must equal one process with dt-cp installed, and the
    backward stays torch's loud CPU refusal (never a quiet wrong gradient)."""
    from torch.distributed.tensor.experimental._attention import (
        _context_parallel_shard,
        _ContextParallel,
        context_parallel_unshard,
    )
    from torch.distributed.tensor.experimental._context_parallel import (
        _PerDocumentHeadTailLoadBalancer,
        _PTRRLoadBalancer,
    )
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    mesh = cpu_mesh(2)
    s, docs = 512, [128, 384]  # torch needs S % (P·128) == 0 and documents % 2P == 0
    q, k, v, _ = make_qkv((1, 2, s, 8), 2, seed=5)
    doc_id = torch.repeat_interleave(torch.arange(len(docs)), torch.tensor(docs))

    def document_causal(b, h, qi, ki):
        return (ki <= qi) & (doc_id[qi] == doc_id[ki])

    block_mask = create_block_mask(document_causal, 1, 1, s, s, device="cpu")
    want = flex_attention(q, k, v, block_mask=block_mask)

    class FlexCore(torch.nn.Module):
        def forward(self, q, k, v, block_mask):
            return flex_attention(q, k, v, block_mask=block_mask)

    module = FlexCore()
    style = _ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.FLEX)
    parallelize_module(module, mesh, style)
    balancers = {
        "ptrr": _PTRRLoadBalancer(block_mask, 2),
        "per-document": _PerDocumentHeadTailLoadBalancer([docs], 2, "cpu"),
    }
    try:
        for name, balancer in balancers.items():
            ql, kl, vl, mask = _context_parallel_shard(
                mesh, [q, k, v, block_mask], [2, 2, 2, 0], load_balancer=balancer
            )
            out = module(ql, kl, vl, block_mask=mask)
            (full,) = context_parallel_unshard(mesh, [out], [2], balancer)
            err = (full - want).abs().max().item()
            assert err < ATOL, f"{name}: forward max error {err:.3g}"
            with pytest.raises(NotImplementedError, match="backward on CPU"):
                module(ql.requires_grad_(), kl, vl, block_mask=mask)
    finally:
        restore_torch_cp_globals()
