"""dt-soft-clip: `torch.ops.dt_soft_clip.soft_clip(x, limit)`, which keeps DTensors sharded.

An example of a plugin living outside the DTensor plugins' repository. Installing it is
enough: `import torch` makes dt-core find its entry point and install its contributions.
"""

__version__ = "0.1.0"
