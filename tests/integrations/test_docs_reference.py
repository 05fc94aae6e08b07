"""The configuration reference is generated from the settings classes: check what it shows."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parents[2] / "docs" / "scripts"


@pytest.fixture(scope="module")
def reference():
    spec = importlib.util.spec_from_file_location(
        "config_reference", SCRIPTS / "config_reference.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("config_reference", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def page(reference):
    return reference.render(reference.settings_classes())


def test_every_settings_field_has_a_row(reference, page):
    classes = reference.settings_classes()
    assert classes
    for cls in classes:
        prefix = cls.model_config["env_prefix"]
        for name in cls.model_fields:
            assert f"`{prefix}{name}`".upper() in page.upper(), name


def test_the_contract_variables_are_listed(page):
    for name in (
        "HERDLESS_PRIMARY_URL",
        "HERDLESS_PRIMARY_API_KEY",
        "HERDLESS_MODEL",
        "HERDLESS_FALLBACK_URL",
        "HERDLESS_FALLBACK_API_KEY",
        "HERDLESS_FALLBACK_MODEL",
    ):
        assert f"| `{name}` |" in page


def test_policy_knobs_show_the_policy_defaults(reference, page):
    from herdless._breaker import BreakerPolicy
    from herdless._retry import RetryPolicy

    rows = {row.env: row for cls in reference.settings_classes() for row in reference.rows(cls)}
    for cls, prefix in ((RetryPolicy, "HERDLESS_RETRY_"), (BreakerPolicy, "HERDLESS_BREAKER_")):
        for field in dataclasses.fields(cls):
            row = rows[f"{prefix}{field.name.upper()}"]
            assert row.default == str(field.default)
            assert row.description


def test_secrets_never_show_a_value(reference, monkeypatch):
    monkeypatch.setenv("HERDLESS_GATEWAY_ADMIN_TOKEN", "s3cret-token")
    page = reference.render(reference.settings_classes())
    assert "s3cret-token" not in page


def test_the_hook_replaces_the_marker_and_unlinks_missing_pages(tmp_path):
    spec = importlib.util.spec_from_file_location("docs_hooks", SCRIPTS / "hooks.py")
    assert spec is not None
    assert spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    (tmp_path / "here.md").write_text("# here")
    config = {
        "docs_dir": str(tmp_path),
        "nav": [{"A": "here.md"}, {"B": "gateway.md"}, {"S": ["gateway.md"]}],
    }
    assert hooks.on_config(config)["nav"] == [{"A": "here.md"}]
    markdown = "See [the gateway](gateway.md#http).\n<!-- herdless:settings -->"
    out = hooks.on_page_markdown(markdown, None, config, None)
    assert "See the gateway." in out
    assert "HERDLESS_PRIMARY_URL" in out
