"""The one place dt-core and the plugins touch private torch APIs, one module per torch area.

A torch upgrade means reviewing these modules only. Each states the torch releases it was
checked against (`CHECKED_WITH_TORCH`) and calls the shared `ensure_supported_torch()`
before its first private access; activation checks the package-wide range first.

Areas:
    torch_version     the shared version check (TESTED_TORCH_RANGE, ALLOW_UNTESTED_ENV)
    dispatch          DTensor's op-handler table and sharding caches
    sharding_rules    DTensor's sharding propagator (strategies, rules, placements)
    hop_rules         higher-order operators' tensor-subclass rules
    library           torch.library registrations and torch's Python-defined op namespaces
    inductor_passes   Inductor's post-grad custom pass lists
    process_groups    process groups by registered name (custom ops take groups by name)
    attention         flex_attention (dt-cp)
    context_parallel  torch's own context-parallel state and load balancers (dt-cp)
    local_tensor      LocalTensorMode's rules for ops that talk to peers
    tracing           telling tracing from eager work; functional collectives, node order
    symm_mem          symmetric memory and micro-pipeline TP matchers (dt-symm-mem)
    fsdp              DeviceMesh / placement internals and the fake mode of FSDP graphs
    compile_introspection  Inductor's generated code, compile counters and caches (tests)

No plugin imports `torch.distributed.tensor._*`, `torch._inductor.*` or other private
torch modules itself.
"""

from __future__ import annotations

from typing import Any

from .torch_version import (
    ALLOW_UNTESTED_ENV,
    TESTED_TORCH_RANGE,
    ensure_supported_torch,
    torch_version_problem,
)

# Marks "there was nothing here" in saved state, distinct from a stored None.
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING"})()

__all__ = [
    "ALLOW_UNTESTED_ENV",
    "MISSING",
    "TESTED_TORCH_RANGE",
    "ensure_supported_torch",
    "torch_version_problem",
]
