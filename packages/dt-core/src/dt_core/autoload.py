"""The `torch.backends` entry point: `import torch` calls `autoload()`.

It runs in the middle of torch's own import, so it must be cheap and must never raise
(torch turns an exception here into a RuntimeError that breaks `import torch`). It
imports the plugin modules (which must stay light), installs their library ops, and
arms lazy installation of everything else.
"""

from __future__ import annotations

import os
import warnings

AUTOLOAD_ENV = "DT_PLUGINS_AUTOLOAD"


def autoload_enabled() -> bool:
    return os.environ.get(AUTOLOAD_ENV, "1") != "0"


def autoload() -> None:
    """Arm lazy activation of every installed plugin unless DT_PLUGINS_AUTOLOAD=0."""
    if not autoload_enabled():
        return
    try:
        from .activation import arm

        arm()
    except Exception as error:  # noqa: BLE001 - never break `import torch`
        warnings.warn(
            f"dt-core: plugin autoload failed ({type(error).__name__}: {error}); "
            "plugins are inactive. Call dt_core.activate() to see the error.",
            RuntimeWarning,
            stacklevel=2,
        )
