"""Deactivating every installed plugin gives back torch's own objects, by identity.

Runs in a fresh interpreter with the real installed plugins (all of this repository's
that are installed, plus the sample plugin), autoload off so the "before" snapshot is
torch alone: DTensor's handler and sharding tables, HOP rules, op-library registrations,
Inductor's pass settings, LocalTensorMode rules and every attribute a plugin patches.
"""

from __future__ import annotations

import json
import os

from dt_core.testing.scripts import run_python

SCRIPT = """
import json
import torch
import torch.distributed.tensor, torch._inductor.config  # the tables live here
import torch.distributed._symmetric_memory  # defines torch's own symm_mem ops (they stay)
import torch.distributed._local_tensor  # LocalTensorMode: rules for it are installed now
import dt_core
from dt_core.discovery import load_plugin, plugin_entry_points
from dt_core.testing.torch_state import differences, snapshot

plugins = [load_plugin(ep) for ep in plugin_entry_points()]
patches = [p for plugin in plugins for p in getattr(plugin, "dt_patches", list)()]
before = snapshot(patches)
infos = dt_core.activate()
during = differences(before, snapshot(patches))
dt_core.deactivate()
after = differences(before, snapshot(patches))
print("RESULT", json.dumps({
    "states": {p.name: p.state for p in infos},
    "changed_tables": sorted({line.split(":")[0] for line in during}),
    "left_behind": after,
}))
"""


def test_deactivate_gives_back_torchs_own_state_for_every_installed_plugin() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DT_PLUGINS_")}
    env["DT_PLUGINS_AUTOLOAD"] = "0"
    out = run_python(SCRIPT, env=env)
    (line,) = [x for x in out.splitlines() if x.startswith("RESULT ")]
    report = json.loads(line.split(" ", 1)[1])
    assert report["states"]["sample"] == "active"
    assert all(state == "active" for state in report["states"].values()), report["states"]
    # Activation did change each kind of table (so the comparison below can fail) ...
    expected = {"op handlers", "sharding strategies", "library", "inductor passes"}
    expected.add("patched attributes")  # the sample plugin's DTensor.__repr__
    if "cp" in report["states"]:  # dt-cp installed: its flex_attention HOP rules
        expected.add("hop rules")
    if "symm-mem" in report["states"]:  # dt-symm-mem: its ops under LocalTensorMode
        expected.add("local tensor rules")
    assert expected <= set(report["changed_tables"]), report["changed_tables"]
    # ... and deactivation put back every entry, the very objects torch had.
    assert report["left_behind"] == []
