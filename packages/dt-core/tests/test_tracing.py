"""`dt_core.tracing.is_tracing` tells tracers from eager tensor subclasses.

Every tensor subclass torch defines (with its own `__torch_dispatch__`) is listed and
classified here; a torch upgrade that adds one fails `test_every_torch_subclass_is_
classified` until it is added to the table, so no subclass is guessed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import pytest
import torch
from dt_core.tracing import is_tracing, simulates_ranks

# Modules that define torch's tensor subclasses (imported so the walk below sees them).
SUBCLASS_MODULES = (
    "torch._subclasses.fake_tensor",
    "torch._subclasses.functional_tensor",
    "torch.distributed._functional_collectives",
    "torch.distributed._local_tensor",
    "torch.distributed._shard.sharded_tensor.api",
    "torch.distributed.tensor",
    "torch.masked.maskedtensor.core",
    "torch.nested._internal.nested_tensor",
    "torch.sparse.semi_structured",
    "torch.testing._internal.logging_tensor",
    "torch.testing._internal.two_tensor",  # imported by torch's fake process group too
)


def _fake() -> torch.Tensor:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode().from_tensor(torch.randn(2, 3))


def _functional() -> torch.Tensor:
    from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

    with FunctionalTensorMode():
        return FunctionalTensor.to_functional(torch.randn(2, 3))


def _async_collective() -> torch.Tensor:
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    return AsyncCollectiveTensor(torch.randn(2, 3))


def _local_tensor() -> torch.Tensor:
    from torch.distributed._local_tensor import LocalTensor

    return LocalTensor({0: torch.randn(2, 3), 1: torch.randn(2, 3)})


def _masked() -> torch.Tensor:
    from torch.masked import masked_tensor

    return masked_tensor(torch.randn(2, 3), torch.ones(2, 3, dtype=torch.bool))


def _nested() -> torch.Tensor:
    return torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=torch.jagged)


def _logging() -> torch.Tensor:
    from torch.testing._internal.logging_tensor import LoggingTensor

    return LoggingTensor(torch.randn(2, 3))


def _two_tensor() -> torch.Tensor:
    from torch.testing._internal.two_tensor import TwoTensor

    return TwoTensor(torch.randn(2, 3), torch.randn(2, 3))


# class name -> (an instance factory, or None where one needs a process group / GPU;
#               whether the subclass itself means "being traced")
SUBCLASSES: dict[str, tuple[Callable[[], torch.Tensor] | None, bool]] = {
    "FakeTensor": (_fake, True),
    "FunctionalTensor": (_functional, True),
    "AsyncCollectiveTensor": (_async_collective, False),
    "LocalTensor": (_local_tensor, False),
    "DTensor": (None, False),  # needs a mesh: checked on ranks in dt-conv's tests
    "ShardedTensor": (None, False),  # needs a process group
    "ShardedTensorBase": (None, False),
    "MaskedTensor": (_masked, False),
    "NestedTensor": (_nested, False),
    "SparseSemiStructuredTensor": (None, False),  # CUDA only
    "SparseSemiStructuredTensorCUSPARSELT": (None, False),
    "SparseSemiStructuredTensorCUTLASS": (None, False),
    "LoggingTensor": (_logging, False),
    "TwoTensor": (_two_tensor, False),
    "LoggingTensorReentrant": (None, False),
}


def _torch_subclasses() -> list[type]:
    for name in SUBCLASS_MODULES:
        importlib.import_module(name)
    found: set[type] = set()
    pending = [torch.Tensor]
    while pending:
        for sub in pending.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                pending.append(sub)
    own_dispatch = [
        c
        for c in found
        if c.__module__.startswith("torch.")
        and any("__torch_dispatch__" in b.__dict__ for b in c.__mro__ if b is not torch.Tensor)
    ]
    return sorted(own_dispatch, key=lambda c: c.__qualname__)


def test_every_torch_subclass_is_classified() -> None:
    names = [c.__qualname__ for c in _torch_subclasses()]
    assert "LocalTensor" in names and "FakeTensor" in names  # the walk finds them
    assert sorted(set(names) - set(SUBCLASSES)) == []


@pytest.mark.parametrize("name", sorted(n for n, (f, _) in SUBCLASSES.items() if f is not None))
def test_each_subclass_instance(name: str) -> None:
    factory, traced = SUBCLASSES[name]
    assert factory is not None
    instance = factory()
    assert type(instance).__qualname__ == name
    assert is_tracing(instance) is traced
    assert is_tracing([torch.ones(1), instance]) is traced  # lists are searched too


def test_plain_tensors_and_no_arguments_are_eager() -> None:
    assert not is_tracing()
    assert not is_tracing(torch.ones(2), 3, "x", None)
    assert not simulates_ranks(torch.ones(2))


def test_tracer_modes_count_without_traced_arguments() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode():
        assert is_tracing()
    seen: list[bool] = []

    def record(t: torch.Tensor) -> torch.Tensor:
        seen.append(is_tracing())
        return t + 1

    make_fx(record, tracing_mode="real")(torch.ones(2))
    torch.compile(record, backend="eager", fullgraph=False)(torch.ones(2))
    assert len(seen) >= 2 and all(seen), seen  # make_fx, then Dynamo
    assert not is_tracing()


def test_wrappers_of_fake_tensors_are_traced() -> None:
    """A wrapper is traced exactly when something it wraps is."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.distributed._local_tensor import LocalTensor

    fake = _fake()
    assert is_tracing(AsyncCollectiveTensor(fake))
    assert not is_tracing(AsyncCollectiveTensor(torch.randn(2)))
    local = LocalTensor({0: torch.randn(2), 1: torch.randn(2)})
    assert not is_tracing(local) and simulates_ranks(local)
