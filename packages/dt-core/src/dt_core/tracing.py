"""Is this call being traced, or run? One answer for every plugin's handlers.

Handlers that do eager-only work (point-to-point sends, data-dependent Python) must know
whether their tensors hold data. Checking `type(local) is torch.Tensor` is wrong: eager
wrapper subclasses (torch's LocalTensor simulating ranks, AsyncCollectiveTensor, user
subclasses) hold real data and run eagerly, while fake and functional tensors and the
tracer modes (Dynamo, make_fx / AOTAutograd, FakeTensorMode) do not. A wrapper is traced
exactly when a tensor it wraps is.
"""

from __future__ import annotations

from typing import Any

from .compat import tracing as _compat


def _traced_value(value: Any, depth: int = 0) -> bool:
    import torch

    if isinstance(value, (list, tuple)):
        return any(_traced_value(v, depth) for v in value)
    if not isinstance(value, torch.Tensor) or depth > 8:
        return False
    if isinstance(value, _compat.tracer_tensor_types()):
        return True
    return any(_traced_value(t, depth + 1) for t in _compat.inner_tensors(value))


def is_tracing(*values: Any) -> bool:
    """Whether a tracer records this call: Dynamo compiling, a proxy / fake / functional
    mode active, or one of `values` (tensors, wrapper subclasses such as DTensor, lists of
    them) being or wrapping a fake or functional tensor. Eager subclasses are not."""
    import torch

    if torch.compiler.is_compiling():  # public, and constant-folded by Dynamo
        return True
    return _compat.tracer_modes_active() or any(_traced_value(v) for v in values)


def simulates_ranks(*values: Any) -> bool:
    """Whether torch's LocalTensorMode runs several ranks in this process (eager, but
    rank-dependent Python sees per-rank symbolic ints rather than one rank)."""
    if _compat.local_tensor_mode_active():
        return True
    local_type = _compat.local_tensor_type()
    if local_type is None:
        return False
    return any(
        isinstance(v, local_type) or any(isinstance(t, local_type) for t in _inner(v))
        for v in values
    )


def _inner(value: Any) -> list[Any]:
    import torch

    return _compat.inner_tensors(value) if isinstance(value, torch.Tensor) else []
