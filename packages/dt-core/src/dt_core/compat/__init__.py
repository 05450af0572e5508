"""dt-core's private torch areas, and the shared checks every package's compat modules use.

Private torch APIs are touched only in compat modules. Each package owns the areas only it
uses (`dt_cp.compat`, `dt_symm_mem.compat`, `dt_fsdp_passes.compat`), so a torch change
there needs that package's release only; the areas the core itself or several plugins use
are here. Every compat module states the torch releases it was checked with
(`CHECKED_WITH_TORCH`), calls the shared `ensure_supported_torch()` before its first
private access, and branches on what torch has (`torch_has`), not on version numbers.
The modules were checked with 2.11 and 2.12 too (the plugins run there with the
override, and dt-core's `torch-gaps` plugin fills in what those releases lack), which is
wider than the window the plugins activate in by themselves (`TESTED_TORCH_RANGE`).

Areas:
    torch_version     the shared checks: TESTED_TORCH_RANGE, ALLOW_UNTESTED_ENV,
                      ensure_supported_torch, torch_has (feature detection)
    dispatch          DTensor's op-handler table and sharding caches
    sharding_rules    DTensor's sharding propagator (strategies, rules, placements)
    placements        placement types torch keeps private (_StridedShard)
    hop_rules         higher-order operators' tensor-subclass rules
    library           torch.library registrations and torch's Python-defined op namespaces
    inductor_passes   Inductor's post-grad custom pass lists
    process_groups    process groups by registered name; is_fake_group (torch's fake backend)
    local_tensor      LocalTensorMode's rules for ops that talk to peers
    tracing           telling tracing from eager work; functional collectives, node order
    compile_introspection  Inductor's generated code, compile counters and caches (tests)
"""

from __future__ import annotations

from typing import Any

from .torch_version import (
    ALLOW_UNTESTED_ENV,
    TESTED_TORCH_RANGE,
    TESTED_TORCH_SPEC,
    ensure_supported_torch,
    torch_has,
    torch_version_problem,
)

# Marks "there was nothing here" in saved state, distinct from a stored None.
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING"})()

__all__ = [
    "ALLOW_UNTESTED_ENV",
    "MISSING",
    "TESTED_TORCH_RANGE",
    "TESTED_TORCH_SPEC",
    "ensure_supported_torch",
    "torch_has",
    "torch_version_problem",
]
