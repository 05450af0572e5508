"""Settings: defaults, environment, configure(); the plugin's passes and their cache identity."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
from dt_fsdp_passes import config


@pytest.fixture(autouse=True)
def _fresh_settings():
    config.configure(reset=True)
    yield
    config.configure(reset=True)


def test_entry_point_names_the_plugin_module() -> None:
    eps = {ep.name: ep.value for ep in entry_points(group="dt.plugins")}
    assert eps.get("fsdp-passes") == "dt_fsdp_passes.plugin"


def _set_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name in [*config.LEGACY_ENV.values()] + [
        config.settings.env_var(f) for f in config.LEGACY_ENV
    ]:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("prefix", ["DT_FSDP_", "DT_FSDP_PASSES_"])
def test_environment_overrides_defaults(monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    mode = "Module" if prefix == "DT_FSDP_" else "module"  # the old names took any case
    env = {"MODE": mode, "BUCKET_CAP_MB": "2.5", "OVERLAP": "off", "OVERLAP_MAX_EXTRA_MB": "7"}
    _set_env(monkeypatch, {prefix + k: v for k, v in env.items()})
    got = config.current_settings()
    assert (got.mode, got.bucket_cap_mb, got.overlap, got.overlap_max_extra_mb) == (
        "module",
        2.5,
        False,
        7.0,
    )
    sources = {row["name"]: row["source"] for row in config.settings.describe()}
    assert set(sources.values()) == {"environment"}
    _set_env(monkeypatch, {})
    assert config.current_settings() == config.FsdpPassSettings()


def test_new_variable_names_win_over_the_old(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_env(monkeypatch, {"DT_FSDP_BUCKET_CAP_MB": "2", "DT_FSDP_PASSES_BUCKET_CAP_MB": "5"})
    assert config.current_settings().bucket_cap_mb == 5.0
    assert config.configure(bucket_cap_mb=1).bucket_cap_mb == 1.0  # configure() wins over both


@pytest.mark.parametrize(
    "env",
    [
        {"DT_FSDP_MODE": "bogus"},
        {"DT_FSDP_BUCKET_CAP_MB": "-1"},
        {"DT_FSDP_BUCKET_CAP_MB": "lots"},
        {"DT_FSDP_OVERLAP": "maybe"},
        {"DT_FSDP_PASSES_MODE": "bogus"},
        {"DT_FSDP_PASSES_BUCKET_CAP_MB": "-1"},
        {"DT_FSDP_PASSES_OVERLAP": "maybe"},
    ],
)
def test_bad_environment_values_are_named(monkeypatch: pytest.MonkeyPatch, env: dict) -> None:
    _set_env(monkeypatch, env)
    with pytest.raises(ValueError, match=next(iter(env))):
        config.current_settings()


def test_configure_validates_and_resets(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_env(monkeypatch, {})
    new = config.configure(bucket_cap_mb=3, mode="module", overlap=False)
    assert config.current_settings() == new
    assert new.as_dict() == {
        "mode": "module",
        "bucket_cap_mb": 3.0,
        "overlap": False,
        "overlap_max_extra_mb": None,
    }
    with pytest.raises(ValueError, match="mode"):
        config.configure(mode="everything")
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        config.configure(bucket_cap_mb=0)
    with pytest.raises(TypeError, match="unknown settings"):
        config.configure(cap=1)
    assert config.current_settings() == new  # failed calls change nothing
    assert config.configure(overlap_max_extra_mb=2).overlap_max_extra_mb == 2.0
    assert config.configure(overlap_max_extra_mb=None).overlap_max_extra_mb is None  # a value
    with config.settings.scoped(mode="off") as scoped:
        assert config.current_settings() == scoped and scoped.mode == "off"
    assert config.current_settings().mode == "module"
    assert config.configure(reset=True) == config.FsdpPassSettings()


def test_pass_settings_and_uuid_follow_configure() -> None:
    from dt_core.graph_passes import pass_uuid
    from dt_fsdp_passes import plugin

    passes = {p.name: p for p in plugin.dt_graph_passes()}
    assert set(passes) == {"bucket", "overlap"}
    bucket = passes["bucket"]
    assert bucket.stage == "post_grad_post" and passes["overlap"].order > bucket.order
    first = pass_uuid("fsdp-passes:bucket", bucket)
    assert dict(bucket.settings())["bucket_cap_mb"] == config.DEFAULT_BUCKET_CAP_MB
    config.configure(bucket_cap_mb=1.0)
    assert dict(bucket.settings())["bucket_cap_mb"] == 1.0
    assert pass_uuid("fsdp-passes:bucket", bucket) != first
    config.configure(reset=True)
    assert pass_uuid("fsdp-passes:bucket", bucket) == first


@pytest.mark.window_ends  # the CLI in a fresh interpreter: the window's ends
def test_dt_plugins_list_shows_the_passes_and_settings() -> None:
    import os
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "dt_core.cli", "list", "--verbose", "--settings"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DT_FSDP_BUCKET_CAP_MB": "3"},  # the old name still counts
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "fsdp-passes:bucket" in text and "fsdp-passes:overlap" in text
    assert '"bucket_cap_mb": 3.0' in text  # the passes' settings (their cache key)
    rows = [line.split() for line in text.splitlines() if line.startswith("fsdp-passes ")]
    assert [
        "fsdp-passes",
        "bucket_cap_mb",
        "3.0",
        "environment",
        "DT_FSDP_PASSES_BUCKET_CAP_MB",
    ] in rows
