"""Convolution: its plan, forward and backward, the channel-sharded layouts both
directions use (`channels`) and the 'same' conv's seam split (`same`)."""
