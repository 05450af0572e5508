"""Errors dt-core raises: each one names the plugin(s) and the limitation involved."""


class DtPluginError(RuntimeError):
    """Base class of dt-core's errors."""


class PluginConflictError(DtPluginError):
    """Two enabled plugins claim the same op (or pass identity).

    Raised by an explicit `dt_core.activate()`; under autoload the same text is
    warned once and both plugins show as failed, so `import torch` never breaks.
    """


class UnsupportedTorchError(DtPluginError):
    """torch is outside the version range dt-core's compat layer was tested with."""


class Unsupported(DtPluginError):
    """A call a plugin's sharded path cannot take; `str(exc)` (also `exc.reason`) says why.

    Raised where the limit is found, however deep; caught once per handler, which takes
    the exact fallback with its one warning, or raises the user-facing error. The reason
    is what users read there, so it names the limit, not the code that found it.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
