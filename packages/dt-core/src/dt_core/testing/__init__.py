"""Multi-rank test harness: run test bodies on N CPU ranks over a real gloo process group.

Use the pytest plugin (`@pytest.mark.ranks(n)`, the `dist_world` fixture) or call
`get_world(n).run(fn)` / `run_on_ranks(fn)` directly; `cpu_mesh` builds meshes on the ranks.
`simulated_ranks(n)` runs N ranks in this one process instead (torch's LocalTensorMode).
Modules imported on their own:

- `torch_state`: snapshots of the torch state dt-core installs into, to check that
  `deactivate()` gives back torch's own objects.
- `compiled`: Inductor's generated code, compile-cache events, compiles with caches off.
- `scripts`: `run_python(script)` in a fresh interpreter.
- `demo_stage`: the demo's stage-result format and its check.
- `memory`: a rank's peak tensor memory over one step (held + the profiled step's rise),
  for the memory benchmarks.

Importing any of them imports no torch; their functions do when called.
"""

from dt_core.testing.local_ranks import per_rank, rank_values, simulated_ranks
from dt_core.testing.mesh import cpu_mesh
from dt_core.testing.rank_failure import (
    RankError,
    RankFailure,
    StepCounts,
    WorldReplacedWarning,
)
from dt_core.testing.world import World, get_world, run_on_ranks, shutdown_worlds

__all__ = [
    "RankError",
    "RankFailure",
    "StepCounts",
    "World",
    "WorldReplacedWarning",
    "cpu_mesh",
    "per_rank",
    "rank_values",
    "simulated_ranks",
    "get_world",
    "run_on_ranks",
    "shutdown_worlds",
]
