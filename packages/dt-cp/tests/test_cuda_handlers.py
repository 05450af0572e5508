"""The CUDA SDPA handlers (flash / efficient / cuDNN), driven directly on CPU DTensors.

No GPU here: this checks the argument and output plumbing of each CUDA op's forward and
backward handler against plain SDPA; the per-block work is the same as on CPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from dt_core.testing import cpu_mesh


def _forward_kwargs(kernel: str, q, k, v, causal: bool) -> dict:
    base = {"query": q, "key": k, "value": v, "dropout_p": 0.0, "is_causal": causal}
    if kernel == "flash":
        return {**base, "return_debug_mask": False, "scale": None}
    if kernel == "efficient":
        return {**base, "attn_bias": None, "compute_log_sumexp": True, "scale": None}
    return {**base, "attn_bias": None, "compute_log_sumexp": True, "return_debug_mask": False}


def _backward_kwargs(kernel: str, outs, dout, q, k, v, causal: bool) -> dict:
    out, lse = outs[0], outs[1]
    base = {"query": q, "key": k, "value": v, "out": out, "logsumexp": lse, "dropout_p": 0.0}
    base["is_causal"] = causal
    if kernel == "flash":
        cq, ck, mq, mk, seed, offset = outs[2:8]
        return {
            **base,
            "grad_out": dout,
            "cum_seq_q": cq,
            "cum_seq_k": ck,
            "max_q": mq,
            "max_k": mk,
            "philox_seed": seed,
            "philox_offset": offset,
        }
    if kernel == "efficient":
        return {
            **base,
            "grad_out_": dout,
            "attn_bias": None,
            "philox_seed": outs[2],
            "philox_offset": outs[3],
            "grad_input_mask": [True, True, True, False],
        }
    return {
        **base,
        "grad_out": dout,
        "philox_seed": outs[6],
        "philox_offset": outs[7],
        "attn_bias": None,
        "cum_seq_q": outs[2],
        "cum_seq_k": outs[3],
        "max_q": outs[4],
        "max_k": outs[5],
    }


@pytest.mark.ranks(2)
def test_cuda_op_handlers_on_cpu_tensors() -> None:
    import dt_cp
    from dt_cp.sdpa import backward_handler, forward_handler

    aten = torch.ops.aten

    mesh = cpu_mesh(2)
    gen = torch.Generator().manual_seed(0)
    q, k, v, g = (torch.randn(1, 2, 9, 8, generator=gen, dtype=torch.float64) for _ in "qkvg")
    failures = []
    for kernel in ("flash", "efficient", "cudnn"):
        fwd = getattr(aten, f"_scaled_dot_product_{kernel}_attention").default
        bwd = getattr(aten, f"_scaled_dot_product_{kernel}_attention_backward").default
        for causal, algorithm in ((True, "ring"), (False, "allgather")):
            ref = [t.clone().requires_grad_() for t in (q, k, v)]
            want = F.scaled_dot_product_attention(*ref, is_causal=causal)
            (want * g).sum().backward()
            with dt_cp.settings(algorithm=algorithm):
                qd, kd, vd, gd = (dt_cp.shard_sequence(t, mesh, 2) for t in (q, k, v, g))
                outs = forward_handler(fwd, (), _forward_kwargs(kernel, qd, kd, vd, causal))
                grads = backward_handler(
                    bwd, (), _backward_kwargs(kernel, outs, gd, qd, kd, vd, causal)
                )
            got = [outs[0].full_tensor(), *(x.full_tensor() for x in grads[:3])]
            expected = [want.detach(), *(r.grad for r in ref)]
            for name, a, b in zip(("out", "dq", "dk", "dv"), got, expected, strict=True):
                if not torch.allclose(a, b, atol=1e-10):
                    failures.append(f"{kernel} causal={causal} {algorithm}: {name}")
    assert not failures, failures
