"""Hookimpls of the `fsdp-passes` plugin: two Inductor post-grad passes, and one patch
that keeps torch's DTensor sharding cache from leaking stale meshes into compiles.

Light at import: the pass functions live in `dt_fsdp_passes.passes`, imported only when
Inductor's config is first imported (that is when dt-core calls this hook). The settings
module is named as DT_SETTINGS, so dt-core imports it for `dt-plugins list --settings`
and `import torch` does not.
"""

from __future__ import annotations

from typing import Any

from dt_core import GraphPass, Patch, hookimpl

# dt-core hook API this plugin is written for (1.1: dt_patches; 1.3: DT_SETTINGS)
DT_API = ">=1.3,<2"
DT_SETTINGS = "dt_fsdp_passes.config"  # creates the settings store

# Order within the post_grad_post stage (other plugins' passes default to 0):
# - bucketing runs first, so FSDP's gradient reduce-scatters (mm -> reduce_scatter on the
#   FSDP group) become buckets before a collective-matmul fusion (dt-symm-mem, order 0)
#   could take them one by one; it leaves collectives on TP/spatial groups alone, which
#   that fusion then takes;
# - overlap runs last: it pins the final order with control dependencies, which a later
#   pattern rewrite would have to respect.
BUCKET_ORDER = -10
OVERLAP_ORDER = 20


def _settings() -> dict[str, Any]:
    from dt_fsdp_passes.config import settings
    from dt_fsdp_passes.groups import as_dict

    return {**settings.current().as_dict(), **as_dict()}


def _bucket(graph: Any) -> None:
    from dt_fsdp_passes.passes import bucket_pass

    bucket_pass(graph)


def _overlap(graph: Any) -> None:
    from dt_fsdp_passes.passes import overlap_pass

    overlap_pass(graph)


@hookimpl
def dt_graph_passes() -> list[GraphPass]:
    return [
        GraphPass("bucket", _bucket, order=BUCKET_ORDER, settings=_settings),
        GraphPass("overlap", _overlap, order=OVERLAP_ORDER, settings=_settings),
    ]


@hookimpl
def dt_patches() -> list[Patch]:
    """Each torch.compile starts with DTensor's C++ sharding cache empty: entries made by
    earlier eager runs carry other (equal) mesh objects, which break AOTAutograd's
    partitioning of FSDP x TP graphs ("tangents_N was invalid, but is output"; see
    `fresh_sharding_cache_per_compile_patch`)."""
    from dt_fsdp_passes.compat import fresh_sharding_cache_per_compile_patch

    return [fresh_sharding_cache_per_compile_patch()]
