"""Inactive plugins say why and how to turn them on: a note on an error of an op they
handle (same error type and message), `dt-plugins list`'s reason column, and
`dt-plugins check`, which passes when the user turned them off and fails otherwise."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import dt_core
import pytest
import torch
from dt_core.inactive_notes import _mentions, explain
from test_activation import CONV, core, plugin  # noqa: F401 - `core` is a fixture
from test_autoload import BROKEN, lines, make_plugin_dist, run_python

CHECK = "import sys; from dt_core.cli import main; sys.exit(main(['check']))"
LIST = "from dt_core.cli import main; main(['list']); main(['list', '--json'])"
MIXED = (
    "aten.convolution.default: got mixed torch.Tensor and DTensor, need to convert all "
    "torch.Tensor to DTensor before calling distributed operators!"
)

# A third-party plugin handling convolution: what dt-conv is to a user.
SPATIAL = """
import dt_core

def _convolution(op_call, args, kwargs):
    raise AssertionError("never called: the plugin stays inactive")

@dt_core.hookimpl
def dt_op_handlers():
    import torch
    return [dt_core.OpHandler(torch.ops.aten.convolution.default, _convolution)]
"""


def _spatial(names: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-process plugin handling convolution, in a process whose autoload is on."""
    for name in ("DT_PLUGINS_AUTOLOAD", "TORCH_DEVICE_BACKEND_AUTOLOAD"):
        monkeypatch.delenv(name, raising=False)
    dt_core.register_plugin(
        plugin(dt_op_handlers=lambda: [dt_core.OpHandler(CONV, lambda *a: None)]), "spatial"
    )
    names.append("spatial")


def _notes(error: BaseException) -> list[str]:
    return [n for n in getattr(error, "__notes__", []) if n.startswith("dt-core:")]


@pytest.mark.parametrize(
    ("text", "op", "named"),
    [
        (MIXED, "aten.convolution.default", True),
        ("Operator aten.convolution.default does not have a strategy.", "aten.convolution", True),
        ("Could not run 'aten::convolution' with arguments", "aten.convolution.default", True),
        ("aten.convolution_backward.default: got mixed", "aten.convolution.default", False),
        ("aten.convolution_backward.default: got mixed", "aten.convolution", False),
        ("no rule registered for HOP flex_attention and subclass", "flex_attention", True),
        ("no rule registered for HOP flex_attention_backward", "flex_attention", False),
        ("torch.ops.aten.neg.default failed", "aten.neg.default", True),
    ],
)
def test_an_op_is_named_by_its_overload_its_packet_and_torchs_cpp_name(text, op, named) -> None:
    assert _mentions(text, op) is named


def test_the_note_names_the_plugin_why_it_is_off_and_how_to_turn_it_on(core, monkeypatch) -> None:  # noqa: F811
    _spatial(core, monkeypatch)
    monkeypatch.setenv("DT_PLUGINS_AUTOLOAD", "0")
    error = RuntimeError(MIXED)
    assert explain(error) is error and str(error) == MIXED and type(error) is RuntimeError
    (note,) = _notes(error)
    assert "'spatial'" in note and "aten.convolution.default" in note
    assert "autoload is off (DT_PLUGINS_AUTOLOAD=0)" in note and "dt_core.activate()" in note
    explain(error)
    assert len(_notes(error)) == 1  # once, however many dt-core frames it passes
    assert _notes(explain(RuntimeError("aten.neg.default: got mixed"))) == []


def test_a_plugin_deactivated_unasked_is_named_with_activate(core, monkeypatch) -> None:  # noqa: F811
    _spatial(core, monkeypatch)
    (note,) = _notes(explain(RuntimeError(MIXED)))
    assert "'spatial'" in note and "dt-core is not active" in note
    assert "call dt_core.activate()" in note


def test_a_call_no_sharing_handler_takes_leaves_with_the_note(core, monkeypatch) -> None:  # noqa: F811
    """dt-core's SharedOp is on the way of the calls it hands on: their errors get it."""
    from dt_core.shared_handlers import SharedOp

    _spatial(core, monkeypatch)
    others = os.environ["DT_PLUGINS_DISABLE"]
    monkeypatch.setenv("DT_PLUGINS_DISABLE", f"{others},spatial".lstrip(","))

    def torchs_own(op_call, args, kwargs):
        raise ValueError("torch refuses this layout")

    shared = SharedOp(CONV, torchs_own)
    with pytest.raises(ValueError, match="torch refuses this layout") as caught:
        shared(CONV, (), {})
    (note,) = _notes(caught.value)
    assert "'spatial'" in note and "disabled by name (DT_PLUGINS_DISABLE=" in note
    assert "remove 'spatial' from DT_PLUGINS_DISABLE" in note


def test_a_rank_process_reports_the_note_with_its_error(core, monkeypatch) -> None:  # noqa: F811
    from dt_core.testing.world_rank import _rank_error

    _spatial(core, monkeypatch)
    monkeypatch.setenv("DT_PLUGINS_AUTOLOAD", "0")
    try:
        raise RuntimeError(MIXED)
    except RuntimeError as error:
        report = _rank_error(error, in_task=True)
    assert report.type_name == "RuntimeError" and report.message == MIXED
    assert "installed plugin 'spatial' handles aten.convolution.default" in report.traceback


# Two simulated ranks, a sharded input: torch's own errors for ops plugins would handle.
FAILING_OPS = """
import json, torch, torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
import dt_core
from dt_core.testing import simulated_ranks

def report(name, run):
    try:
        with simulated_ranks(2):
            mesh = init_device_mesh("cpu", (2,))
            x = distribute_tensor(torch.randn(1, 2, 8, 8), mesh, [Shard(2)])
            run(mesh, x)
        print("ERROR", json.dumps([name, None, "", []]))
    except Exception as error:
        notes = getattr(error, "__notes__", [])
        print("ERROR", json.dumps([name, type(error).__name__, str(error), notes]))

def conv(mesh, x):
    F.conv2d(x, torch.randn(3, 2, 3, 3), padding=1)  # a plain weight: mixed

def prelu_backward(mesh, x):  # no torch of the window has its strategy
    weight = distribute_tensor(torch.ones(2, 1, 1), mesh, [Replicate()])
    torch.ops.aten._prelu_kernel_backward(x, x, weight)

def explained(mesh, x):
    with dt_core.explain_errors():
        conv(mesh, x)

report("conv", conv)
report("prelu", prelu_backward)
report("explained", explained)
"""


def _errors(result) -> dict[str, tuple[str | None, str, list[str]]]:
    found = [json.loads(line) for line in lines(result, "ERROR")]
    return {name: (kind, message, notes) for name, kind, message, notes in found}


def _note_of(notes: list[str], plugin_name: str) -> str:
    (note,) = [n for n in notes if n.startswith("dt-core:")]
    (line,) = [line for line in note.splitlines() if f"plugin {plugin_name!r}" in line]
    return line


def test_with_autoload_off_torchs_errors_name_the_plugins_and_activate(tmp_path: Path) -> None:
    make_plugin_dist(tmp_path, "spatial", SPATIAL)
    result = run_python(FAILING_OPS, tmp_path, keep=("torch-gaps",), DT_PLUGINS_AUTOLOAD="0")
    errors = _errors(result)
    kind, message, notes = errors["conv"]
    assert kind == "RuntimeError" and "got mixed torch.Tensor and DTensor" in message
    assert "dt-core" not in message  # torch's own message, the note beside it
    line = _note_of(notes, "spatial")
    assert "handles aten.convolution.default" in line
    assert "autoload is off (DT_PLUGINS_AUTOLOAD=0)" in line and "dt_core.activate()" in line
    kind, message, notes = errors["prelu"]
    assert kind == "NotImplementedError" and "sharding strategy" in message
    assert "autoload is off" in _note_of(notes, "torch-gaps")
    kind, _, notes = errors["explained"]
    assert kind == "RuntimeError" and len([n for n in notes if n.startswith("dt-core:")]) == 1


@pytest.mark.window_ends  # the CLI in a fresh interpreter: the window's ends
def test_a_plugin_disabled_by_name_is_named_with_how_to_enable_it(tmp_path: Path) -> None:
    make_plugin_dist(tmp_path, "spatial", SPATIAL)
    result = run_python(FAILING_OPS, tmp_path, keep=("torch-gaps",), DT_PLUGINS_DISABLE="spatial")
    errors = _errors(result)
    assert errors["prelu"][0] is None  # torch-gaps is active: the op works
    line = _note_of(errors["conv"][2], "spatial")
    assert "disabled by name" in line and "remove 'spatial' from DT_PLUGINS_DISABLE" in line


@pytest.mark.ci_once  # the CLI's words and exit codes: the same on every torch
def test_check_passes_and_says_so_when_the_user_turned_plugins_off() -> None:
    off = run_python(CHECK, DT_PLUGINS_AUTOLOAD="0")
    assert off.returncode == 0, off.stdout + off.stderr
    assert "note: the plugins are inactive by request: autoload is off" in off.stdout
    assert "checked as dt_core.activate() would install them" in off.stdout
    assert "inactive by request, torch in the tested range" in off.stdout
    disabled = run_python(CHECK, DT_PLUGINS_DISABLE="sample")
    assert disabled.returncode == 0, disabled.stdout + disabled.stderr
    assert "note: plugin 'sample' is inactive by request: disabled by name" in disabled.stdout
    assert "remove 'sample' from DT_PLUGINS_DISABLE" in disabled.stdout


AUTOLOAD_FAILS = """
import sys
import dt_core.activation

def arm():
    raise OSError("no room to arm")

dt_core.activation.arm = arm  # what autoload calls during `import torch`
from dt_core.cli import main
sys.exit(main(["check"]))
"""


@pytest.mark.ci_once  # the CLI's words and exit codes: the same on every torch
def test_check_fails_when_a_plugin_is_inactive_unasked() -> None:
    result = run_python(AUTOLOAD_FAILS)
    assert result.returncode == 1, result.stdout + result.stderr
    (problem,) = [p for p in result.stdout.splitlines() if "'sample'" in p]
    assert problem.startswith("problem: plugin 'sample' is inactive: dt-core is not active")
    assert "call dt_core.activate()" in problem


@pytest.mark.ci_once  # the CLI's words and exit codes: the same on every torch
def test_list_gives_the_reason_for_each_inactive_plugin(tmp_path: Path) -> None:
    make_plugin_dist(tmp_path, "broken", BROKEN)
    result = run_python(LIST, tmp_path, DT_PLUGINS_AUTOLOAD="0")
    assert result.returncode == 0, result.stderr
    table, _, listing = result.stdout.partition("\n[")
    rows = [re.split(r"\s{2,}", line.strip()) for line in table.splitlines()]
    assert rows[0][4:6] == ["state", "why inactive"]
    cells = {row[0]: row[4:6] for row in rows[2:] if len(row) == len(rows[0])}
    assert cells["sample"] == ["inactive", "autoload off"]
    assert cells["broken"] == ["failed", "failed"]
    assert cells["torch-gaps"] == ["disabled", "disabled"]  # run_python disables it
    assert "sample: inactive: autoload is off (DT_PLUGINS_AUTOLOAD=0); to turn it on: " in table
    assert "broken: failed: it failed: import failed" in table
    infos = {info["name"]: info for info in json.loads("[" + listing)}
    assert infos["sample"]["inactive"]["label"] == "autoload off"
    assert infos["sample"]["inactive"]["requested"] is True
    assert infos["broken"]["inactive"]["requested"] is False


def test_an_untested_torch_is_the_reason_given(monkeypatch) -> None:
    from dt_core.compat import torch_version
    from dt_core.inactive import why_inactive

    monkeypatch.setattr(torch_version, "torch_version", lambda: "9.0.0")
    problem = torch_version.torch_version_problem()
    info = dt_core.PluginInfo("x", None, None, None, (), (), (), {}, "failed", problem)
    why = why_inactive(info, active=False)
    assert why is not None and why.label == "untested torch" and not why.requested
    assert "torch 9.0.0 is outside the tested releases" in why.reason
    assert "DT_PLUGINS_ALLOW_UNTESTED_TORCH=1" in why.turn_on
    assert torch.__version__  # the real torch is untouched


def test_list_is_one_row_per_plugin_by_name_and_verbose_adds_what_each_installs() -> None:
    from dt_core.cli import _format_list
    from dt_core.records import PluginInfo

    def info(name: str, ops: tuple[str, ...]) -> PluginInfo:
        return PluginInfo(name, f"dt-{name}", "1.0", ">=1.0,<2", ops, (), (), {}, "active", None)

    infos = [
        info("zeta", ("aten.add.Tensor",)),
        info("alpha", ("aten.mul.Tensor", "aten.div.Tensor")),
    ]
    short = _format_list(infos).splitlines()
    rows = [line.split()[0] for line in short if line.startswith(("alpha ", "zeta "))]
    assert rows == ["alpha", "zeta"]
    assert not [line for line in short if ": op " in line]
    assert "--verbose" in short[-1]
    verbose = _format_list(infos, verbose=True).splitlines()
    assert [line for line in verbose if ": op " in line] == [
        "alpha: op aten.mul.Tensor",
        "alpha: op aten.div.Tensor",
        "zeta: op aten.add.Tensor",
    ]


def test_dt_core_explain_is_the_function_whatever_was_imported_before() -> None:
    """A submodule named like the function would replace it on the package once imported."""
    import dt_core
    import dt_core.inactive_notes
    import dt_core.testing.local_ranks  # noqa: F401 - imports the notes' module

    assert callable(dt_core.explain) and dt_core.explain.__name__ == "explain"
    error = ValueError("no plugin declares this")
    assert dt_core.explain(error) is error
