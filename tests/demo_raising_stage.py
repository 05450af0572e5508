"""A demo stage that raises (its traceback must land in the rank logs, not the console)."""

from __future__ import annotations


def run_stage(small: bool = True) -> dict:
    raise RuntimeError("raised on purpose")
