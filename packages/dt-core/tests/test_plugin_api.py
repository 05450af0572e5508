"""The hook-API contract and bad plugin input: a plugin written for another hook API is
not activated (state "incompatible", naming both versions and what to upgrade); an entry
point naming a missing module or object, or a plugin importing what only a newer dt-core
has, fails with a message naming the plugin and the fix. Either way torch still imports,
one warning is logged at autoload, `dt-plugins check` exits non-zero, and the other
plugins keep working."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import dt_core
import pytest
from dt_core.versions import in_range, release
from hypothesis import given
from hypothesis import strategies as st
from test_activation import core, plugin  # noqa: F401 - `core` is a fixture
from test_autoload import CHECK_SAMPLE_ACTIVE, lines, run_python

versions = st.tuples(*[st.integers(0, 30)] * 3)


def _text(version: tuple[int, int, int]) -> str:
    return ".".join(map(str, version))


@given(versions, versions, versions)
def test_version_ranges_compare_releases_as_numbers(have, low, high) -> None:
    assert in_range(_text(have), f">={_text(low)},<{_text(high)}") == (low <= have < high)
    assert in_range(_text(have), f"=={_text(low)}") == (have == low)


def test_release_ignores_local_and_pre_release_parts() -> None:
    assert release("2.13.0a0+git123") == (2, 13, 0)
    assert release("1.1") == (1, 1, 0)
    with pytest.raises(ValueError, match="not a version range"):
        in_range("1.0", "~=1.0")


def _api_plugin(api: object):
    target = plugin(dt_op_handlers=lambda: [])
    target.DT_API = api
    return target


@pytest.mark.parametrize(
    ("api", "fix"),
    [(">=2.0,<3", "upgrade dt-core"), ("<1.0", "upgrade the plugin")],
)
def test_plugin_for_another_hook_api_is_incompatible(core, recwarn, api, fix) -> None:  # noqa: F811
    dt_core.register_plugin(_api_plugin(api), "elsewhere")
    core.append("elsewhere")
    infos = {p.name: p for p in dt_core.activate()}
    info = infos["elsewhere"]
    assert info.state == "incompatible" and info.api == api
    assert api in info.reason and f"hook API {dt_core.HOOK_API_VERSION}" in info.reason
    assert fix in info.reason
    assert infos["sample"].state == "active"
    messages = [str(w.message) for w in recwarn if "dt-core" in str(w.message)]
    assert len(messages) == 1 and "'elsewhere' is incompatible" in messages[0]


def test_plugin_without_dt_api_counts_as_written_for_1_0(core) -> None:  # noqa: F811
    dt_core.register_plugin(plugin(dt_op_handlers=lambda: []), "older")
    core.append("older")
    info = {p.name: p for p in dt_core.activate()}["older"]
    assert info.state == "active" and info.api == ">=1.0,<2"


@pytest.mark.parametrize("api", ["banana", 2])
def test_malformed_dt_api_fails_with_the_fix(core, api) -> None:  # noqa: F811
    dt_core.register_plugin(_api_plugin(api), "garbled")
    core.append("garbled")
    with pytest.warns(RuntimeWarning, match="'garbled' failed"):
        info = {p.name: p for p in dt_core.activate()}["garbled"]
    assert info.state == "failed" and "DT_API" in info.reason and ">=1.0,<2" in info.reason


# --- DT_SETTINGS: settings modules imported when listed, not when activated --------------

SETTINGS_MODULE = """
from dataclasses import dataclass
from dt_core.kit import SettingsStore

@dataclass(frozen=True)
class Knobs:
    depth: int = 3

settings = SettingsStore("declared-probe", Knobs)
"""


@pytest.fixture
def settings_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path for settings modules; the stores they make are forgotten after."""
    import sys

    from dt_core.kit import settings

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(settings, "_registry", dict(settings._registry))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("dt_probe_")]:
        del sys.modules[name]


def _settings_plugin(declared: object):
    target = plugin(dt_op_handlers=lambda: [])
    target.DT_SETTINGS = declared
    return target


def test_declared_settings_module_loads_when_settings_are_listed(core, settings_site) -> None:  # noqa: F811
    import sys

    from dt_core.kit import registered_settings

    (settings_site / "dt_probe_settings.py").write_text(SETTINGS_MODULE)
    dt_core.register_plugin(_settings_plugin("dt_probe_settings"), "declared")
    core.append("declared")
    assert {p.name: p.state for p in dt_core.activate()}["declared"] == "active"
    assert "dt_probe_settings" not in sys.modules  # activation does not need it
    assert registered_settings()["declared-probe"].current().depth == 3


@pytest.mark.parametrize("declared", [3, ["dt_probe_a", ""]])
def test_malformed_dt_settings_fails_with_the_fix(core, declared) -> None:  # noqa: F811
    dt_core.register_plugin(_settings_plugin(declared), "garbled")
    core.append("garbled")
    with pytest.warns(RuntimeWarning, match="'garbled' failed"):
        info = {p.name: p for p in dt_core.activate()}["garbled"]
    assert info.state == "failed" and "DT_SETTINGS" in info.reason


def test_settings_module_that_fails_to_import_fails_its_plugin(core, settings_site) -> None:  # noqa: F811
    from dt_core.kit import registered_settings

    (settings_site / "dt_probe_broken.py").write_text("raise ImportError('no knobs today')")
    dt_core.register_plugin(_settings_plugin("dt_probe_broken"), "knobless")
    core.append("knobless")
    dt_core.activate()
    with pytest.warns(RuntimeWarning, match="'knobless' failed"):
        registered_settings()
    info = {p.name: p for p in dt_core.plugins()}["knobless"]
    assert info.state == "failed"
    assert "'dt_probe_broken'" in info.reason and "no knobs today" in info.reason


# --- installed plugins, through autoload and the CLI -------------------------------------

FUTURE = """
import dt_core

DT_API = ">=2.0,<3"  # written for a dt-core that does not exist yet

@dt_core.hookimpl
def dt_hooks_from_the_future():
    return []
"""

NEEDS_NEWER_CORE = """
from dt_core import ContributionFromTheFuture
"""

HAS_NO_HOOKS = """
DT_API = ">=1.0,<2"
"""


def make_dist(site: Path, name: str, entry: str, module_source: str | None = None) -> None:
    """An installed distribution `dt-test-<name>` whose entry point value is `entry`."""
    if module_source is not None:
        (site / f"dt_test_{name}.py").write_text(textwrap.dedent(module_source))
    info = site / f"dt_test_{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: dt-test-{name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[dt.plugins]\n{name} = {entry}\n")


BAD_PLUGINS = {
    # name: (entry point value, module source, what the message must say)
    "future": ("dt_test_future", FUTURE, ["incompatible", ">=2.0,<3", "upgrade dt-core"]),
    "newer": ("dt_test_newer", NEEDS_NEWER_CORE, ["ContributionFromTheFuture", "upgrade dt-core"]),
    "ghost": ("dt_test_not_installed", None, ["'dt_test_not_installed'", "not installed"]),
    "hollow": ("dt_test_hollow:plugin", HAS_NO_HOOKS, ["'plugin'", "does not define"]),
}


@pytest.fixture(scope="module")
def bad_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("bad_plugins")
    for name, (entry, source, _) in BAD_PLUGINS.items():
        make_dist(site, name, entry, source)
    return site


@pytest.mark.window_ends  # autoload in a fresh interpreter: the window's ends
def test_bad_plugins_warn_once_each_at_autoload_and_others_work(bad_site: Path) -> None:
    script = CHECK_SAMPLE_ACTIVE + "\nfor n in info: print('BAD', n, info[n].state)"
    result = run_python(script, bad_site)
    assert lines(result, "STATE") == ["active"]
    assert lines(result, "HANDLER") == ["dt_sample_plugin.plugin._is_same_size"]
    states = dict(line.split() for line in lines(result, "BAD"))
    assert states["future"] == "incompatible"
    assert {states[n] for n in ("newer", "ghost", "hollow")} == {"failed"}
    warnings = [line for line in result.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(warnings) == len(BAD_PLUGINS), result.stderr
    for name, (_, _, words) in BAD_PLUGINS.items():
        (warning,) = [w for w in warnings if f"'{name}'" in w]
        assert all(word in warning for word in words), warning


@pytest.mark.window_ends  # the CLI in a fresh interpreter: the window's ends
def test_cli_names_each_bad_plugin_and_its_fix(bad_site: Path) -> None:
    check = "import sys; from dt_core.cli import main; sys.exit(main(['check']))"
    result = run_python(check, bad_site)
    assert result.returncode == 1, result.stdout + result.stderr
    problems = [line for line in result.stdout.splitlines() if line.startswith("problem:")]
    assert len(problems) == len(BAD_PLUGINS), result.stdout
    for name, (_, _, words) in BAD_PLUGINS.items():
        (problem,) = [p for p in problems if f"'{name}'" in p]
        assert all(word in problem for word in words), problem
    listing = run_python("from dt_core.cli import main; main(['list'])", bad_site)
    (row,) = [line for line in listing.stdout.splitlines() if line.startswith("future ")]
    assert "incompatible" in row and ">=2.0,<3" in row
    assert f"provides hook API {dt_core.HOOK_API_VERSION}" in listing.stdout
