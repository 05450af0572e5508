"""dt-core: the shared core of the DTensor plugins.

Plugins are modules named by entry points in the `dt.plugins` group, with hookimpls
(`dt_core.hookimpl`) returning what they contribute (see `dt_core.hookspecs`). Installing
a plugin is enough: `import torch` arms them, and they install themselves into DTensor
and Inductor when those are first imported. `HOOK_API_VERSION` is the hook API this core
provides; a plugin states the range it was written for as `DT_API` in its module.
"""

from __future__ import annotations

__version__ = "0.2.0"

from .activation import (  # noqa: E402
    activate,
    deactivate,
    is_active,
    plugins,
    register_plugin,
    unregister_plugin,
)
from .contributions import (  # noqa: E402
    GraphPass,
    HopRule,
    LibraryOps,
    LocalTensorRule,
    OpHandler,
    Patch,
    ShardingStrategy,
)
from .errors import DtPluginError, PluginConflictError, UnsupportedTorchError  # noqa: E402
from .hookspecs import HOOK_API_VERSION, hookimpl  # noqa: E402
from .records import PluginInfo  # noqa: E402

__all__ = [
    "DtPluginError",
    "GraphPass",
    "HOOK_API_VERSION",
    "HopRule",
    "LibraryOps",
    "LocalTensorRule",
    "OpHandler",
    "Patch",
    "PluginConflictError",
    "PluginInfo",
    "ShardingStrategy",
    "UnsupportedTorchError",
    "__version__",
    "activate",
    "deactivate",
    "hookimpl",
    "is_active",
    "plugins",
    "register_plugin",
    "unregister_plugin",
]
