"""Hookimpls of the `fsdp-passes` plugin: two Inductor post-grad passes.

Light at import: the pass functions live in `dt_fsdp_passes.passes`, imported only when
Inductor's config is first imported (that is when dt-core calls this hook).
"""

from __future__ import annotations

from typing import Any

from dt_core import GraphPass, hookimpl

DT_API = ">=1.0,<2"  # dt-core hook API this plugin is written for


def _settings() -> dict[str, Any]:
    from dt_fsdp_passes.config import current_settings

    return current_settings().as_dict()


def _bucket(graph: Any) -> None:
    from dt_fsdp_passes.passes import bucket_pass

    bucket_pass(graph)


def _overlap(graph: Any) -> None:
    from dt_fsdp_passes.passes import overlap_pass

    overlap_pass(graph)


@hookimpl
def dt_graph_passes() -> list[GraphPass]:
    return [
        GraphPass("bucket", _bucket, stage="post_grad_post", order=10, settings=_settings),
        GraphPass("overlap", _overlap, stage="post_grad_post", order=20, settings=_settings),
    ]
