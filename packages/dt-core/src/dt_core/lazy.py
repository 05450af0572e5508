"""Public names that load from their modules on first use (a module `__getattr__`, PEP 562).

`import torch` imports dt-core and every plugin's `plugin` module, hence their packages;
a package's `__init__` that imported its front end would put that on every `import torch`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A `__getattr__` for `package`: `homes` maps a public name to the submodule defining
    it; the first access imports that submodule and keeps the value on the package."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
