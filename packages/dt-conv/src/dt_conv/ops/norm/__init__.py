"""Normalization on spatially sharded tensors: batch, instance, group and layer norm.

Statistics reduce over every rank's rows: each rank computes its own count, mean and sum
of squared deviations, one all-gather brings every rank's three to every rank, and each
combines them in rank order (Chan's parallel update), so the result is numerically as
stable as one process's and the same on every rank. The backward's sums are global too
(one all-reduce). The output keeps the input's placements: nothing is gathered.
"""
