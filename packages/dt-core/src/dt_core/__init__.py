"""dt-core: the shared core of the DTensor plugins.

Plugins are modules named by entry points in the `dt.plugins` group, with hookimpls
(`dt_core.hookimpl`) returning what they contribute (see `dt_core.hookspecs`). Installing
a plugin is enough: `import torch` arms them, and they install themselves into DTensor
and Inductor when those are first imported. `HOOK_API_VERSION` is the hook API this core
provides; a plugin states the range it was written for as `DT_API` in its module.

The public names load from their modules on first use: `import torch` imports this
package to reach `dt_core.autoload`, and with autoload off that must cost nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_exports

__version__ = "0.2.0"

if TYPE_CHECKING:
    from .activation import (
        activate,
        deactivate,
        is_active,
        plugins,
        register_plugin,
        unregister_plugin,
    )
    from .contributions import (
        GraphPass,
        HopRule,
        LibraryOps,
        LocalTensorRule,
        OpHandler,
        Patch,
        ShardingStrategy,
    )
    from .errors import DtPluginError, PluginConflictError, Unsupported, UnsupportedTorchError
    from .hookspecs import HOOK_API_VERSION, hookimpl
    from .inactive_notes import explain, explain_errors
    from .records import PluginInfo
    from .remembered import forget, on_forget

# public name -> the dt_core module that defines it
_HOME = {
    **dict.fromkeys(
        ("activate", "deactivate", "is_active", "plugins", "register_plugin", "unregister_plugin"),
        "activation",
    ),
    **dict.fromkeys(
        (
            "GraphPass",
            "HopRule",
            "LibraryOps",
            "LocalTensorRule",
            "OpHandler",
            "Patch",
            "ShardingStrategy",
        ),
        "contributions",
    ),
    **dict.fromkeys(
        ("DtPluginError", "PluginConflictError", "Unsupported", "UnsupportedTorchError"), "errors"
    ),
    **dict.fromkeys(("explain", "explain_errors"), "inactive_notes"),
    **dict.fromkeys(("HOOK_API_VERSION", "hookimpl"), "hookspecs"),
    "PluginInfo": "records",
    **dict.fromkeys(("forget", "on_forget"), "remembered"),
}


__getattr__ = lazy_exports(__name__, _HOME)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})


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
    "Unsupported",
    "UnsupportedTorchError",
    "__version__",
    "activate",
    "deactivate",
    "explain",
    "explain_errors",
    "forget",
    "hookimpl",
    "is_active",
    "on_forget",
    "plugins",
    "register_plugin",
    "unregister_plugin",
]
