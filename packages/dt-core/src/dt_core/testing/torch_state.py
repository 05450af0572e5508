"""Snapshots of every piece of torch state dt-core installs into, for tests that check
`deactivate()` gives back torch's own objects (compared by identity, not equality).

Reads go through dt-core's compat layer; nothing here changes torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dt_core.compat import (
    dispatch,
    hop_rules,
    inductor_passes,
    library,
    local_tensor,
    sharding_rules,
)
from dt_core.contributions import PassStage, Patch
from dt_core.installers import patch_target

# Dispatch keys whose kernel registrations a plugin's torch.library ops can add to.
LIBRARY_KEYS = (
    "CPU",
    "CUDA",
    "Meta",
    "Autograd",
    "AutogradCPU",
    "CompositeExplicitAutograd",
    "CompositeImplicitAutograd",
)

Snapshot = dict[str, dict[Any, Any]]


def snapshot(patches: Iterable[Patch] = ()) -> Snapshot:
    """Every table dt-core installs into, copied (values are the live objects). The
    patches' targets are read first: importing one (Inductor's C++ code generation, say)
    registers torch's own rules, which must not read as something a plugin left."""
    patched = {patch.claim(): getattr(patch_target(patch), patch.attribute) for patch in patches}
    strategies, schema_infos = sharding_rules.strategy_tables("strategy")
    rules, _ = sharding_rules.strategy_tables("rule")
    config = inductor_passes.inductor_config()
    return {
        "op handlers": dict(dispatch.op_handler_table()),
        "sharding strategies": dict(strategies),
        "sharding rules": dict(rules),
        "sharding schema infos": dict(schema_infos),
        "hop rules": {
            (hop.name(), subclass): fn
            for hop in hop_rules.all_hops()
            for subclass, fn in hop_rules.subclass_rules(hop).items()
        },
        # Op names: a set per key, compared for equality (names have no identity).
        "library": {
            "defined": library.defined_ops(),
            **{key: library.registrations(key) for key in LIBRARY_KEYS},
        },
        "inductor passes": {
            "config class": type(config),
            **{s: getattr(config, s) for s in inductor_passes.STAGE_SETTINGS.values()},
        },
        "local tensor rules": local_tensor.mode_rules(),
        "patched attributes": patched,
    }


def differences(before: Snapshot, after: Snapshot) -> list[str]:
    """Every entry added, removed or replaced between two snapshots (empty: the same)."""
    found = []
    for table, entries in before.items():
        later = after[table]
        for key in entries.keys() | later.keys():
            if key not in later:
                found.append(f"{table}: {key!r} removed")
            elif key not in entries:
                found.append(f"{table}: {key!r} added")
            elif table == "library":
                if entries[key] != later[key]:
                    changed = sorted(entries[key] ^ later[key])
                    found.append(f"{table}: {key} registrations changed: {changed[:5]}")
            elif entries[key] is not later[key]:
                found.append(f"{table}: {key!r} is {later[key]!r}, was {entries[key]!r}")
    return sorted(found)


def installed_graph_passes(stage: PassStage) -> tuple[Any, ...]:
    """What Inductor will run for `stage`, in order (user passes and dt-core's)."""
    config = inductor_passes.inductor_config()
    return tuple(inductor_passes.as_list(getattr(config, inductor_passes.STAGE_SETTINGS[stage])))
