"""dt-symm-mem's call counters, in a module of their own: the kernels (`ops`) and the
workspace set-up both count, and `ops` imports the workspace."""

from __future__ import annotations

from dt_core.kit import Counters

counters = Counters("symm-mem")  # kernel calls by op name, segments mapped (tests, stats)
