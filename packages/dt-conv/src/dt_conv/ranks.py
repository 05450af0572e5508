"""A rank's position on the mesh, on real ranks and under torch's LocalTensorMode.

A handler's plan is global metadata, the same on every rank; what differs per rank is
its coordinate on the mesh, and from it its rows, window, offsets and peers. On a real
rank the coordinate is a plain int. Under LocalTensorMode (one process simulating every
rank) the mesh answers with a per-rank integer that Python cannot branch on, so the code
that reads a coordinate runs once per simulated rank instead (`each_rank`): on that
rank's plain tensors, seeing its own plain coordinates through `local_rank` — the code a
real rank runs, unchanged. Collectives stay outside such code: they run at the mode's
level, where LocalTensorMode simulates them for every rank at once (`mode_level`).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any, TypeVar

from dt_core.compat import local_tensor as compat
from dt_core.tracing import simulates_ranks
from torch.distributed.device_mesh import DeviceMesh

T = TypeVar("T")

# Inside `each_rank`: {mesh: that simulated rank's coordinate on every mesh dim}.
_coords: contextvars.ContextVar[dict[DeviceMesh, tuple[int, ...]] | None] = contextvars.ContextVar(
    "dt_conv_rank_coords", default=None
)


def simulated() -> bool:
    """Whether torch's LocalTensorMode simulates the ranks here (dt-core's one check,
    `simulates_ranks()`: the mode entered and enabled) and this is not dt-conv's per-rank
    code (`each_rank`, where one rank's plain coordinates are at hand)."""
    return _coords.get() is None and simulates_ranks()


def local_rank(mesh: DeviceMesh, mesh_dim: int) -> int:
    """This rank's coordinate along `mesh_dim`: a plain int on a real rank and in
    per-rank code; a per-rank integer at the mode's level (do arithmetic only)."""
    seen = _coords.get()
    if seen is None:
        return mesh.get_local_rank(mesh_dim)
    if mesh not in seen:
        raise RuntimeError(
            "dt-conv: per-rank code under LocalTensorMode asked for its rank on a mesh "
            "it was not started for"
        )
    return seen[mesh][mesh_dim]


def each_rank(mesh: DeviceMesh, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` for this rank: on a real rank a plain call; under LocalTensorMode once
    per simulated rank with that rank's tensors (LocalTensor arguments unwrapped) and
    its coordinates on `mesh` (`local_rank`), the results combined into LocalTensors."""
    if not simulated():
        return fn(*args)
    coords = tuple(mesh.get_local_rank(d) for d in range(mesh.ndim))

    def on_rank(rank_coords: tuple[int, ...], *rank_args: Any) -> T:
        token = _coords.set({mesh: tuple(int(c) for c in rank_coords)})
        try:
            return fn(*rank_args)
        finally:
            _coords.reset(token)

    result: T = compat.run_per_rank(on_rank, coords, *args)
    return result


def mode_level(what: str) -> None:
    """Collectives must not run in per-rank code: the process group there is fake."""
    if _coords.get() is not None:
        raise RuntimeError(f"dt-conv: {what} inside per-rank code under LocalTensorMode")
