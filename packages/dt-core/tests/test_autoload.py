"""Auto-registration through `import torch`, in fresh interpreters.

Each test runs a small script in a new Python process, because autoload happens once,
during `import torch`. The sample plugin (tests/sample_plugin) is installed in this
environment; broken and conflicting plugins are made on the fly as distributions on
PYTHONPATH (a dist-info folder with entry_points.txt is all importlib.metadata needs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# autoload seen from fresh interpreters: the window's oldest and newest torch bound it
# (.ci/run leaves it out between them)
pytestmark = pytest.mark.window_ends

CHECK_SAMPLE_ACTIVE = """
import sys, torch
import dt_core
info = {p.name: p for p in dt_core.plugins()}
print("STATE", info["sample"].state)
print("DTENSOR_IMPORTED", "torch.distributed.tensor" in sys.modules)
print("OP", torch.ops.dt_sample.scale(torch.ones(2), 3.0).tolist())
import torch.distributed.tensor._dispatch as dispatch
from torch.distributed.tensor import DTensor
handler = DTensor._op_dispatcher._custom_op_handlers[torch.ops.aten.is_same_size.default]
print("HANDLER", handler.__module__ + "." + handler.__name__)
"""


def make_plugin_dist(site: Path, name: str, module_source: str) -> None:
    """A minimal installed distribution `dt-test-<name>` whose plugin module is given."""
    module = f"dt_test_{name}"
    (site / f"{module}.py").write_text(textwrap.dedent(module_source))
    info = site / f"dt_test_{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: dt-test-{name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[dt.plugins]\n{name} = {module}\n")


def run_python(
    script: str, site: Path | None = None, keep: tuple[str, ...] = (), **env: str
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DT_PLUGINS_")}
    # Other installed plugins (dt-conv in a shared dev venv, say) stay out of these tests,
    # but for those named in `keep`.
    from dt_core.discovery import plugin_entry_points

    others = [ep.name for ep in plugin_entry_points() if ep.name not in ("sample", *keep)]
    disabled = [*filter(None, env.pop("DT_PLUGINS_DISABLE", "").split(",")), *others]
    if disabled:
        full_env["DT_PLUGINS_DISABLE"] = ",".join(disabled)
    full_env.update(env)
    if site is not None:
        full_env["PYTHONPATH"] = os.pathsep.join(
            [str(site), *filter(None, [full_env.get("PYTHONPATH")])]
        )
    return subprocess.run(
        [sys.executable, "-W", "default", "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )


def lines(result: subprocess.CompletedProcess[str], key: str) -> list[str]:
    assert result.returncode == 0, result.stdout + result.stderr
    return [line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith(key)]


BROKEN = """
raise ImportError("the broken plugin cannot import its kernels")
"""

CONFLICTING = """
import dt_core

def _other(op, args, kwargs):
    return False

@dt_core.hookimpl
def dt_op_handlers():
    import torch
    return [dt_core.OpHandler(torch.ops.aten.is_same_size.default, _other)]
"""


def test_import_torch_arms_plugins_lazily_and_dtensor_import_installs_them() -> None:
    result = run_python(CHECK_SAMPLE_ACTIVE)
    assert lines(result, "STATE") == ["active"]
    assert lines(result, "DTENSOR_IMPORTED") == ["False"]  # plugins() did not import it
    assert lines(result, "OP") == ["[3.0, 3.0]"]  # library op defined at import torch
    assert lines(result, "HANDLER") == ["dt_sample_plugin.plugin._is_same_size"]


# What autoload leaves for later: the installers of the lazy parts and the torch internals
# they reach, the pass cache keys, the kit, the listing. Each was once imported by
# `import torch` (the plugin table built at autoload called every hook).
DEFERRED = (
    "dt_core.compat.dispatch",
    "dt_core.compat.hop_rules",
    "dt_core.compat.inductor_passes",
    "dt_core.compat.placements",
    "dt_core.compat.sharding_rules",
    "dt_core.graph_passes",
    "dt_core.kit",
    "dt_core.cli",
)

CHECK_IMPORTED = """
import sys, torch
print("DT", " ".join(sorted(m for m in sys.modules if m.startswith(("dt_", "pluggy")))))
import dt_core
print("STATE", " ".join(sorted(p.name + ":" + p.state for p in dt_core.plugins())))
"""


def test_import_torch_loads_only_what_arming_needs() -> None:
    result = run_python(CHECK_IMPORTED)
    imported = set(lines(result, "DT")[0].split())
    assert {"dt_core.activation", "dt_sample_plugin.plugin"} <= imported
    assert not imported & set(DEFERRED), sorted(imported & set(DEFERRED))
    assert "sample:active" in lines(result, "STATE")[0].split()
    # Off: torch loads the entry point's module and nothing else of dt-core (but the
    # package's lazy-name helper, a dozen lines of stdlib calls).
    off = lines(run_python(CHECK_IMPORTED, DT_PLUGINS_AUTOLOAD="0"), "DT")[0].split()
    assert off == ["dt_core", "dt_core.autoload", "dt_core.lazy"]


ACTIVATE_FROM_EACH_MODULE = """
import importlib, sys, warnings
warnings.simplefilter("error", RuntimeWarning)  # a plugin that fails warns so
importlib.import_module(sys.argv[1])
from torch.distributed.tensor import DTensor
import dt_core
print("STATE", " ".join(sorted(p.name + ":" + p.state for p in dt_core.plugins())))
"""


@pytest.mark.parametrize("first", ["dt_core.dtensors", "dt_core.kit", "torch.distributed.tensor"])
def test_every_installed_plugin_activates_whichever_module_is_imported_first(first: str) -> None:
    """With every installed plugin enabled (torch-gaps included), importing a dt-core
    module that itself imports DTensor first activates them all: no plugin's hook may
    import a module that is still being imported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DT_PLUGINS_")}
    script = textwrap.dedent(ACTIVATE_FROM_EACH_MODULE)
    result = subprocess.run(
        [sys.executable, "-c", script, first], capture_output=True, text=True, env=env, timeout=120
    )
    states = lines(result, "STATE")[0].split()
    assert "torch-gaps:active" in states and "sample:active" in states
    assert all(s.endswith(":active") for s in states), states


def test_autoload_off_installs_nothing_until_activate() -> None:
    script = """
    import torch, torch.distributed.tensor as t
    from torch.distributed.tensor import DTensor
    import dt_core
    table = DTensor._op_dispatcher._custom_op_handlers
    op = torch.ops.aten.is_same_size.default
    print("BEFORE", table[op] is t._dispatch.is_same_size_handler,
          hasattr(torch.ops.dt_sample, "scale"))
    dt_core.activate()
    print("AFTER", table[op].__module__, torch.ops.dt_sample.scale(torch.ones(1), 2.0).item())
    """
    result = run_python(script, DT_PLUGINS_AUTOLOAD="0")
    assert lines(result, "BEFORE") == ["True False"]
    assert lines(result, "AFTER") == ["dt_sample_plugin.plugin 2.0"]


def test_disable_env_var_disables_named_plugin() -> None:
    script = """
    import torch, torch.distributed.tensor as t
    import dt_core
    from torch.distributed.tensor import DTensor
    info = {p.name: p for p in dt_core.plugins()}
    handler = DTensor._op_dispatcher._custom_op_handlers[torch.ops.aten.is_same_size.default]
    print("STATE", info["sample"].state, handler is t._dispatch.is_same_size_handler)
    """
    result = run_python(script, DT_PLUGINS_DISABLE="other,sample")
    assert lines(result, "STATE") == ["disabled True"]


def test_broken_plugin_warns_once_and_others_still_work(tmp_path: Path) -> None:
    make_plugin_dist(tmp_path, "broken", BROKEN)
    result = run_python(CHECK_SAMPLE_ACTIVE + "\nprint('BROKEN', info['broken'].state)", tmp_path)
    assert lines(result, "STATE") == ["active"]
    assert lines(result, "BROKEN") == ["failed"]
    assert lines(result, "HANDLER") == ["dt_sample_plugin.plugin._is_same_size"]
    warnings = [line for line in result.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(warnings) == 1, result.stderr
    assert "'broken'" in warnings[0]
    assert "the broken plugin cannot import its kernels" in warnings[0]


def test_conflict_under_autoload_fails_both_plugins_with_a_warning(tmp_path: Path) -> None:
    make_plugin_dist(tmp_path, "rival", CONFLICTING)
    script = """
    import torch, torch.distributed.tensor as t
    import dt_core
    from torch.distributed.tensor import DTensor
    handler = DTensor._op_dispatcher._custom_op_handlers[torch.ops.aten.is_same_size.default]
    print("TORCH_HANDLER", handler is t._dispatch.is_same_size_handler)
    for p in dt_core.plugins():
        print("STATE", p.name, p.state)
    """
    result = run_python(script, tmp_path)
    assert lines(result, "TORCH_HANDLER") == ["True"]
    states = [s for s in lines(result, "STATE") if s.split()[0] in ("rival", "sample")]
    assert sorted(states) == ["rival failed", "sample failed"]
    assert "both claim aten.is_same_size.default" in result.stderr
    assert "'sample'" in result.stderr and "'rival'" in result.stderr


def test_conflict_on_explicit_activate_raises_naming_both(tmp_path: Path) -> None:
    make_plugin_dist(tmp_path, "rival", CONFLICTING)
    script = """
    import torch
    import dt_core
    try:
        dt_core.activate()
    except dt_core.PluginConflictError as error:
        print("ERROR", error)
    print("OP_LEFT", hasattr(torch.ops.dt_sample, "scale"))
    """
    result = run_python(script, tmp_path, DT_PLUGINS_AUTOLOAD="0")
    (error,) = lines(result, "ERROR")
    assert "'sample'" in error and "'rival'" in error and "aten.is_same_size.default" in error
    assert lines(result, "OP_LEFT") == ["False"]  # nothing stays installed after the error
    # Disabling one of them resolves it.
    result = run_python(script, tmp_path, DT_PLUGINS_AUTOLOAD="0", DT_PLUGINS_DISABLE="rival")
    assert lines(result, "ERROR") == []
    assert lines(result, "OP_LEFT") == ["True"]


@pytest.mark.ci_once  # the CLI's output and exit codes (its checks run per torch elsewhere)
def test_cli_list_json_and_check(tmp_path: Path) -> None:
    listing = run_python("from dt_core.cli import main; main(['list', '--json'])")
    assert listing.returncode == 0, listing.stderr
    (sample,) = [p for p in json.loads(listing.stdout) if p["name"] == "sample"]
    assert sample["distribution"] == "dt-sample-plugin"
    assert sample["state"] == "active"
    assert "aten.is_same_size.default" in sample["ops"]
    assert sample["passes"] == ["sample:count_nodes"]
    assert sample["pass_settings"] == {"sample:count_nodes": {"mode": "count"}}
    patch = "patch torch.distributed.tensor.DTensor.__repr__"
    assert sample["patches"] == [patch]
    from dt_core.compat import TESTED_TORCH_RANGE

    assert sample["patch_details"] == {patch: {"torch": f">={TESTED_TORCH_RANGE[0]}"}}
    assert sample["api"] == ">=1.1,<2"

    table = run_python("from dt_core.cli import main; main(['list'])")
    assert "dt-sample-plugin" in table.stdout and "active" in table.stdout

    check = "import sys; from dt_core.cli import main; sys.exit(main(['check']))"
    passed = run_python(check)
    assert passed.returncode == 0
    (said,) = [line for line in passed.stdout.splitlines() if line.startswith("checked: ")]
    assert "op_handlers" in said and "the torch release" in said  # what it validated
    make_plugin_dist(tmp_path, "broken", BROKEN)
    failed = run_python(check, tmp_path)
    assert failed.returncode == 1
    assert "plugin 'broken' failed" in failed.stdout
    assert "the broken plugin cannot import its kernels" in failed.stdout


def _window() -> tuple[str, str]:
    """The release just below the tested window and the first one above it."""
    from dt_core.compat.torch_version import TESTED_TORCH_RANGE
    from dt_core.versions import release

    major, minor, _ = release(TESTED_TORCH_RANGE[0])
    return f"{major}.{minor - 1}.2", TESTED_TORCH_RANGE[1]


BELOW, ABOVE = _window()


@pytest.mark.parametrize("version", [BELOW, ABOVE, f"{ABOVE}a0+git1", "3.0.0"])
def test_untested_torch_is_refused_with_the_range(version: str) -> None:
    from dt_core.compat import torch_version

    problem = torch_version.torch_version_problem(version)
    assert problem is not None
    assert version in problem and torch_version.TESTED_TORCH_SPEC in problem
    assert torch_version.ALLOW_UNTESTED_ENV in problem


# A torch release outside the tested range, as a user with a newer torch would meet it:
# dt-core is told the version before `import torch` runs its autoload.
UNTESTED_TORCH = """
import sys, warnings
warnings.simplefilter("always")
import dt_core.compat.torch_version as torch_version
torch_version.torch_version = lambda: "{version}"
with warnings.catch_warnings(record=True) as caught:
    import torch
    import torch.distributed.tensor
    x = torch.ones(2) + 1  # torch itself works
    import dt_core
    states = {{p.name: p.state for p in dt_core.plugins()}}
ours = [str(w.message) for w in caught if "dt-core" in str(w.message)]
print("WARNINGS", len(ours))
print("TEXT", ours[0] if ours else "")
print("STATES", states)
print("TORCH_WORKS", x.tolist())
from dt_core.cli import main
print("CHECK_EXIT", main(["check"]))
"""


@pytest.mark.parametrize("version", [BELOW, ABOVE])
def test_untested_torch_warns_once_leaves_torch_working_and_fails_check(version: str) -> None:
    from dt_core.compat.torch_version import TESTED_TORCH_SPEC

    result = run_python(UNTESTED_TORCH.format(version=version))
    assert lines(result, "WARNINGS") == ["1"]
    (text,) = lines(result, "TEXT")
    assert f"torch {version}" in text and TESTED_TORCH_SPEC in text
    assert "DT_PLUGINS_ALLOW_UNTESTED_TORCH=1" in text and "sample" in text
    (states,) = lines(result, "STATES")
    assert "'sample': 'failed'" in states and "active" not in states
    assert lines(result, "TORCH_WORKS") == ["[2.0, 2.0]"]
    assert lines(result, "CHECK_EXIT") == ["1"]
    assert f"problem: torch {version} is outside" in result.stdout


def test_untested_torch_with_the_override_activates_and_check_passes_with_a_note() -> None:
    result = run_python(UNTESTED_TORCH.format(version=ABOVE), DT_PLUGINS_ALLOW_UNTESTED_TORCH="1")
    assert lines(result, "WARNINGS") == ["0"]
    (states,) = lines(result, "STATES")
    assert "'sample': 'active'" in states
    assert lines(result, "CHECK_EXIT") == ["0"]
    assert f"note: torch {ABOVE} is outside the tested releases" in result.stdout
    assert "problem:" not in result.stdout


@pytest.mark.parametrize(
    "version",
    [
        "2.11.0",
        "2.11.0+cu130",
        "2.12.1+cu130",
        "2.13.0",
        "2.13.0+cpu",
        "2.13.0a0+git123",
        "2.14.1+cu130",
        "2.14.2",
        "2.15.0",
        "2.15.0+cu132",
    ],
)
def test_tested_torch_range_is_accepted(version: str) -> None:
    from dt_core.compat import torch_version

    assert torch_version.torch_version_problem(version) is None


def test_lazy_public_names_resolve_to_their_modules_and_unknown_ones_raise() -> None:
    import dt_core
    import dt_core.activation

    assert dt_core.activate is dt_core.activation.activate
    assert "activate" in vars(dt_core)  # kept on the package after the first access
    with pytest.raises(AttributeError, match="module 'dt_core' has no attribute 'nope'"):
        dt_core.nope  # noqa: B018


def test_torch_has_tells_present_from_missing_private_names() -> None:
    from dt_core.compat import torch_has

    assert torch_has("torch.distributed.tensor._dispatch", "OpDispatcher")
    assert torch_has("torch.nn.attention.flex_attention", "_validate_device")
    assert not torch_has("torch.distributed.tensor._dispatch", "OpDispatcher.no_such_method")
    assert not torch_has("torch.no_such_module", "anything")
