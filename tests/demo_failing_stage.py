"""A demo stage whose result does not match its reference (tests the demo's exit code)."""

from __future__ import annotations

import torch.distributed as dist


def run_stage(small: bool = True) -> dict:
    return {
        "feature": "deliberately wrong stage",
        "ranks": dist.get_world_size(),
        "max_error": 1.0,
        "tolerance": 1e-6,
        "ok": dist.get_rank() != 1,  # wrong on one rank only: the demo must still fail
        "time_s": 1.0,
        "baseline_time_s": 1.0,
        "bytes_communicated": 0,
        "details": "",
    }
