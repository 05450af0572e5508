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

from .compat import local_tensor as _local_tensor
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
    """Whether this call works on simulated ranks: the one check every plugin asks.

    torch's LocalTensorMode runs every rank in this process (eager, over a fake process
    group; rank-dependent Python sees per-rank integers, not one rank's). True when

    - a LocalTensorMode is entered and enabled here. Inside `mode.disable()` (per-rank
      code, e.g. `compat.local_tensor.run_per_rank`, on one rank's plain tensors) it is
      not: there the code is a real rank's;
    - or, with `values` given, one of them is or wraps a LocalTensor (simulated ranks'
      data, also outside its mode).

    Called without values it answers for the mode alone. Per-plugin context (dt-conv's
    per-rank code) is the plugin's own extra condition.
    """
    if _local_tensor.enabled_mode() is not None:
        return True
    return any(
        _local_tensor.is_local_tensor(v) or any(_local_tensor.is_local_tensor(t) for t in _inner(v))
        for v in values
    )


def _inner(value: Any) -> list[Any]:
    import torch

    return _compat.inner_tensors(value) if isinstance(value, torch.Tensor) else []
