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
