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


def test_environment_overrides_defaults() -> None:
    env = {
        "DT_FSDP_MODE": "Module",
        "DT_FSDP_BUCKET_CAP_MB": "2.5",
        "DT_FSDP_OVERLAP": "off",
        "DT_FSDP_OVERLAP_MAX_EXTRA_MB": "7",
    }
    got = config.settings_from_env(env)
    assert (got.mode, got.bucket_cap_mb, got.overlap, got.overlap_max_extra_mb) == (
        "module",
        2.5,
        False,
        7.0,
    )
    assert config.settings_from_env({}) == config.FsdpPassSettings()


@pytest.mark.parametrize(
    "env",
    [
        {"DT_FSDP_MODE": "bogus"},
        {"DT_FSDP_BUCKET_CAP_MB": "-1"},
        {"DT_FSDP_BUCKET_CAP_MB": "lots"},
        {"DT_FSDP_OVERLAP": "maybe"},
    ],
)
def test_bad_environment_values_are_named(env: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(env))):
        config.settings_from_env(env)


def test_configure_validates_and_resets() -> None:
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
    assert config.configure(reset=True) == config.settings_from_env()


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


def test_dt_plugins_list_shows_the_passes_and_settings() -> None:
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "dt_core.cli", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "DT_FSDP_BUCKET_CAP_MB": "3"},
    )
    assert out.returncode == 0, out.stderr
    text = json.dumps(json.loads(out.stdout))
    assert "fsdp-passes" in text and "bucket" in text and "overlap" in text
    assert '"bucket_cap_mb": 3.0' in text
