"""dt-conv: exact DTensor convolution when the input is sharded on spatial dims.

Installing the package is enough: dt-core finds the `conv` plugin (`dt_conv.plugin`) and
installs its handlers for `aten.convolution` and `aten.convolution_backward`.
"""

__version__ = "0.1.0"
