"""dt-cp's private torch areas, one module each, on dt-core's shared version check.

A torch release that changes flex_attention or torch's own context-parallel state needs a
dt-cp release only. Each module states the releases it was checked with
(`CHECKED_WITH_TORCH`) and calls `dt_core.compat.ensure_supported_torch` before private
access.

Areas:
    attention         flex_attention's higher-order ops, its CPU-backward refusal, masks
    context_parallel  torch's own CP state (dispatch mode, load balancing, balancers)
"""
