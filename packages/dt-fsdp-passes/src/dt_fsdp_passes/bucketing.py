"""Bucket SimpleFSDP's per-parameter all-gathers and reduce-scatters in a post-grad graph.

The pass in three steps, each in its own module: find the FSDP collectives
(fsdp_collectives.py), plan which adjacent ones share a bucket (bucket_plan.py), and
rewrite the graph so each bucket is one collective (bucket_merge.py). Every rank plans
from the same sequence and shapes, so every rank issues the same collectives in the same
order. The names of those modules are re-exported here, where callers import them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import fx

from dt_fsdp_passes.bucket_merge import merge_all_gathers, merge_all_reduces, merge_reduce_scatters
from dt_fsdp_passes.bucket_plan import Bucket, plan_buckets
from dt_fsdp_passes.fsdp_collectives import (
    Collective,
    _module_key,  # noqa: F401 - re-exported: tests import it from here
    find_fsdp_all_gathers,
    find_fsdp_reduce_scatters,
    find_hsdp_all_reduces,
)

FSDP_META = "dt_fsdp_collective"  # node.meta flag: an FSDP collective (bucketed or not)
MB = 1024 * 1024


def _merge_each(
    graph: fx.Graph,
    buckets: list[Bucket],
    merge: Callable[[fx.Graph, Bucket, Any], fx.Node],
    fake_mode: Any,
) -> None:
    """Merge each bucket of several collectives into one; flag what remains (the merged
    collective, or a bucket's only member) as FSDP's, for the overlap pass."""
    for bucket in buckets:
        node = bucket.members[0].node
        if len(bucket.members) > 1:
            node = merge(graph, bucket, fake_mode)
        node.meta[FSDP_META] = True


def bucket_graph(
    graph: fx.Graph, mode: str, cap_mb: float, fake_mode: Any, log: Callable[[str], None]
) -> dict[str, Any]:
    """Bucket FSDP all-gathers and reduce-scatters; returns counts for the pass's stats."""
    gathers = find_fsdp_all_gathers(graph)
    scatters = find_fsdp_reduce_scatters(graph)
    stats: dict[str, Any] = {
        "all_gather_before": len(gathers),
        "reduce_scatter_before": len(scatters),
    }
    keys = [c.module_key for c in gathers + scatters]
    if (mode == "module" and None in keys) or (mode == "auto" and keys and set(keys) == {None}):
        log(
            "module structure missing from the graph's node meta; bucketing by size "
            f"(bucket_cap_mb={cap_mb:g}) instead of mode={mode!r}"
        )
        mode = "size"
    cap_bytes = cap_mb * MB
    ag_buckets = plan_buckets(gathers, "all_gather", mode, cap_bytes)
    rs_buckets = plan_buckets(scatters, "reduce_scatter", mode, cap_bytes)
    _merge_each(graph, ag_buckets, merge_all_gathers, fake_mode)
    _merge_each(graph, rs_buckets, merge_reduce_scatters, fake_mode)
    # HSDP: found after the reduce-scatters are merged (their outputs feed these).
    reduces = find_hsdp_all_reduces(graph)
    ar_buckets = plan_buckets(reduces, "all_reduce", mode, cap_bytes)
    _merge_each(graph, ar_buckets, merge_all_reduces, fake_mode)
    stats["all_reduce_before"] = len(reduces)
    stats["all_reduce_after"] = len(ar_buckets)
    stats["all_gather_after"] = len(ag_buckets)
    stats["reduce_scatter_after"] = len(rs_buckets)
    stats["all_gather_bucket_bytes"] = [b.wire_bytes for b in ag_buckets]
    stats["reduce_scatter_bucket_bytes"] = [b.wire_bytes for b in rs_buckets]
    stats["bucket_modules"] = [sorted({str(m.module_key) for m in b.members}) for b in ag_buckets]
    return stats


__all__ = ["Bucket", "Collective", "bucket_graph", "plan_buckets"]
