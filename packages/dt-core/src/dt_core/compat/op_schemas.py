"""What `dt-plugins check` reads of torch's op and sharding types to validate a plugin's
contributions before any call: an op's argument list, whether an object is an op
overload or a higher-order operator, dispatch key names, and the attributes of the
objects DTensor hands a sharding function (`OpSchema`, `DTensorSpec`).

Checked against torch 2.11.x to 2.15.x (`CHECKED_WITH_TORCH`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from . import ensure_supported_torch

CHECKED_WITH_TORCH = ">=2.11.0,<2.16"


@dataclass(frozen=True)
class Argument:
    """One argument of an op's schema, as a sharding function sees it."""

    name: str
    tensors: int  # 0: not a tensor; 1: a Tensor (or Tensor?); 2: a list of tensors
    kwarg_only: bool
    required: bool
    default: Any = None


def is_op_overload(obj: object) -> bool:
    """An op overload (`torch.ops.aten.neg.default`), not its packet nor a name."""
    from torch._ops import OpOverload

    return isinstance(obj, OpOverload)


def is_higher_order_operator(obj: object) -> bool:
    from torch._ops import HigherOrderOperator

    return isinstance(obj, HigherOrderOperator)


def is_dispatch_key(name: str) -> bool:
    import torch

    return hasattr(torch._C.DispatchKey, name)


def op_arguments(op: Any) -> list[Argument]:
    """`op`'s arguments in order: what DTensor passes a placements function."""
    import torch

    found = []
    for arg in op._schema.arguments:
        kind = arg.type
        if isinstance(kind, torch.OptionalType):
            kind = kind.getElementType()
        tensors = 1 if isinstance(kind, torch.TensorType) else 0
        if isinstance(kind, torch.ListType) and isinstance(kind.getElementType(), torch.TensorType):
            tensors = 2
        required = not arg.has_default_value()
        default = None if required else arg.default_value
        found.append(Argument(arg.name, tensors, arg.kwarg_only, required, default))
    return found


def _attributes(cls: type) -> frozenset[str]:
    names = {name for name in dir(cls) if not name.startswith("__")}
    if dataclasses.is_dataclass(cls):
        names |= {field.name for field in dataclasses.fields(cls)}
    return frozenset(names)


def op_schema_attributes() -> frozenset[str]:
    """What a strategy or rule function may read of the `OpSchema` it is called with."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch.distributed.tensor._op_schema import OpSchema

    return _attributes(OpSchema)


def spec_attributes() -> frozenset[str]:
    """What a placements function may read of a `DTensorSpec` it is called with."""
    ensure_supported_torch(CHECKED_WITH_TORCH)
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    return _attributes(DTensorSpec)
