"""Device meshes for test bodies running on ranks, cached per shape within a rank process.

Creating a mesh creates process groups, a collective every rank performs in the same order;
caching by (shape, names) keeps repeated tests from piling up groups in shared worlds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

_meshes: dict[tuple[tuple[int, ...], tuple[str, ...] | None], DeviceMesh] = {}


def cpu_mesh(shape: int | Sequence[int], names: Sequence[str] | None = None) -> DeviceMesh:
    """`init_device_mesh("cpu", shape, mesh_dim_names=names)`, created once per rank process.

    Call it on every rank with the same arguments, as with `init_device_mesh` itself.
    """
    from torch.distributed.device_mesh import init_device_mesh

    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    key = (dims, None if names is None else tuple(names))
    mesh = _meshes.get(key)
    if mesh is None:
        mesh = _meshes[key] = init_device_mesh("cpu", dims, mesh_dim_names=key[1])
    return mesh
