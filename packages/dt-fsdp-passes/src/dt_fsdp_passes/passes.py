"""The graph passes the plugin contributes: bucket FSDP collectives, then reorder for overlap.

Both read `current_settings()` when Inductor runs them; the plugin reports the same
settings to dt-core, which puts them in the passes' cache uuid. Each run appends a record
to `pass_log()` (graph sizes, collective counts before/after, estimates), which is how
tests and benchmarks see what happened inside a compile; the totals also go to dt-core's
counters (`counters`, shown by `dt-plugins stats -- <command>`).
"""

from __future__ import annotations

import warnings
from typing import Any

from dt_core.kit import Counters
from torch import fx

from dt_fsdp_passes.bucketing import (
    FSDP_META,
    bucket_graph,
    find_fsdp_all_gathers,
    find_fsdp_reduce_scatters,
)
from dt_fsdp_passes.config import current_settings
from dt_fsdp_passes.graph_utils import (
    ALL_GATHER,
    REDUCE_SCATTER,
    count_calls,
    fake_mode_of,
    nbytes,
    val,
)
from dt_fsdp_passes.overlap import overlap_graph

_log: list[dict[str, Any]] = []
_warned: set[str] = set()
# Per process, once per compiled graph: pass runs, collectives merged away, skipped graphs.
counters = Counters("fsdp-passes")


def pass_log() -> list[dict[str, Any]]:
    """Records of the passes' runs in this process (newest last)."""
    return _log


def clear_pass_log() -> None:
    _log.clear()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(f"dt_fsdp_passes: {message}", RuntimeWarning, stacklevel=3)


def _graph_of(graph_or_module: Any) -> fx.Graph:
    return graph_or_module.graph if isinstance(graph_or_module, fx.GraphModule) else graph_or_module


def _output_bytes(graph: fx.Graph) -> int:
    """Bytes the graph returns: for a forward graph, what is saved for backward (plus outputs)."""
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    seen: set[fx.Node] = set()
    total = 0
    for node in output.all_input_nodes:
        if node not in seen:
            seen.add(node)
            total += nbytes(val(node))
    return total


def bucket_pass(graph_or_module: Any) -> None:
    """Merge adjacent FSDP all-gathers / reduce-scatters into buckets (settings.mode)."""
    graph = _graph_of(graph_or_module)
    settings = current_settings()
    record: dict[str, Any] = {"pass": "bucket", "settings": settings.as_dict()}
    _log.append(record)
    record["all_gather_total_before"] = count_calls(graph, ALL_GATHER)
    record["reduce_scatter_total_before"] = count_calls(graph, REDUCE_SCATTER)
    if settings.mode != "off":
        fake_mode = fake_mode_of(graph)
        if fake_mode is None:
            counters.add("graphs_left_unbucketed")
            _warn_once("no fake tensor mode found on the graph; collectives left unbucketed")
        else:
            record.update(
                bucket_graph(graph, settings.mode, settings.bucket_cap_mb, fake_mode, _warn_once)
            )
            graph.lint()
            for kind in ("all_gather", "reduce_scatter", "all_reduce"):
                counters.add(f"{kind}s_merged", record[f"{kind}_before"] - record[f"{kind}_after"])
    counters.add("bucket_pass_runs")
    record["output_bytes"] = _output_bytes(graph)
    record["all_gather_total_after"] = count_calls(graph, ALL_GATHER)
    record["reduce_scatter_total_after"] = count_calls(graph, REDUCE_SCATTER)


def overlap_pass(graph_or_module: Any) -> None:
    """Reorder FSDP collectives for prefetch / late waits under the memory bound."""
    graph = _graph_of(graph_or_module)
    settings = current_settings()
    record: dict[str, Any] = {"pass": "overlap", "settings": settings.as_dict()}
    _log.append(record)
    counters.add("overlap_pass_runs")
    if settings.mode == "off" or not settings.overlap:
        return
    fsdp = {n for n in graph.nodes if n.meta.get(FSDP_META)}
    fsdp |= {c.node for c in find_fsdp_all_gathers(graph) + find_fsdp_reduce_scatters(graph)}
    extra = settings.overlap_max_extra_mb
    record.update(overlap_graph(graph, fsdp, None if extra is None else extra * 1024 * 1024))
    if record.get("overlap_applied"):
        counters.add("graphs_reordered_for_overlap")
    graph.lint()
