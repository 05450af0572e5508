"""`is_fake_group`: the one check every plugin uses to tell torch's fake backend (dry
runs, one process, no peers) from a real group."""

from __future__ import annotations

import pytest
from dt_core.testing.scripts import run_in_fake_world, run_python


@pytest.mark.parametrize("world_size", [2, 8])
def test_fake_groups_are_fake(world_size: int) -> None:
    found = run_in_fake_world(
        """
        from torch.distributed.device_mesh import init_device_mesh
        from dt_core.compat.process_groups import is_fake_group

        world = dist.group.WORLD
        print("DEFAULT", is_fake_group())
        print("GROUP", is_fake_group(world))
        print("NAME", is_fake_group(world.group_name))
        mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("a", "b"))
        print("MESH", is_fake_group(mesh.get_group("b")), is_fake_group(mesh.get_group("a")))
        """,
        world_size,
    )
    assert found == {
        "DEFAULT": ["True"],
        "GROUP": ["True"],
        "NAME": ["True"],
        "MESH": ["True True"],
    }


def test_real_groups_are_not_fake() -> None:
    out = run_python(
        """
        import torch.distributed as dist
        from dt_core.compat.process_groups import is_fake_group

        print("BEFORE", is_fake_group())
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
        world = dist.group.WORLD
        print("GLOO", is_fake_group(), is_fake_group(world), is_fake_group(world.group_name))
        dist.destroy_process_group()
        import torch.testing._internal.distributed.fake_pg  # registers the fake backend

        dist.init_process_group("cpu:gloo,cuda:fake", rank=0, world_size=1, store=dist.HashStore())
        print("MIXED", is_fake_group())
        dist.destroy_process_group()
        """,
        timeout=120,
    )
    assert out.splitlines() == ["BEFORE False", "GLOO False False False", "MIXED False"]
