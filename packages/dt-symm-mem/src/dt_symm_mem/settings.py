"""dt-symm-mem's settings (the house convention: `DT_SYMM_MEM_<NAME>` variables,
`settings.configure(...)`, `settings.scoped(...)`; `dt-plugins list --settings` shows them).
Light at import: plugin.py loads it while `import torch` is still running."""

from __future__ import annotations

from dataclasses import dataclass

from dt_core.kit import SettingsStore


@dataclass(frozen=True)
class SymmMemSettings:
    """compile_pass: fuse all-gather / reduce-scatter + matmul of CPU groups in compiled
    graphs (DT_SYMM_MEM_COMPILE_PASS=0 turns it off).
    merge_summed_matmuls: fuse a sum of matmuls feeding a reduce-scatter too, into
    dt_symm_mem::fused_matmuls_reduce_scatter (DT_SYMM_MEM_MERGE_SUMMED_MATMULS=0 keeps
    such sums as they are).
    timeout: seconds a rank waits for its peers before raising (a peer died or hangs).
    disable: never use the shared-memory workspace; the ops fall back to torch's
    collectives (exact, slower)."""

    compile_pass: bool = True
    merge_summed_matmuls: bool = True
    timeout: float = 120.0
    disable: bool = False

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ValueError(f"dt-symm-mem: timeout must be > 0 seconds, got {self.timeout}")


settings = SettingsStore("symm-mem", SymmMemSettings)
