"""Serialising test bodies for the ranks: cloudpickle, plus modules of odd types.

cloudpickle ships a by-value function's submodule references (`torch.ops` in
`torch.ops.aten.mm`), but only plain `ModuleType` objects; torch's `torch.ops` is a
ModuleType subclass that it then fails on. Any imported module, whatever its type, is
sent as "import it by name" instead. Code objects travel through `marshal`, which
keeps their file name: cloudpickle >= 3.1.3 renames it to "<dynamic-code>", and a
failing rank's traceback would no longer say where the test body is.
"""

from __future__ import annotations

import importlib
import io
import marshal
import sys
import types
from typing import Any

import cloudpickle


class _Pickler(cloudpickle.CloudPickler):
    def reducer_override(self, obj: Any) -> Any:
        if (
            isinstance(obj, types.ModuleType)
            and type(obj) is not types.ModuleType
            and sys.modules.get(obj.__name__) is obj
        ):
            return importlib.import_module, (obj.__name__,)
        if isinstance(obj, types.CodeType):
            return marshal.loads, (marshal.dumps(obj),)
        return super().reducer_override(obj)


def dumps(obj: Any) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer).dump(obj)
    return buffer.getvalue()
