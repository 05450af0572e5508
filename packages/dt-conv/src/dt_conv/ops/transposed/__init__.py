"""Transposed convolution: its plan, forward and backward (one module each)."""
