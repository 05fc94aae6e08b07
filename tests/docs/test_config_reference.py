"""The configuration reference is generated from the settings classes: check what it shows."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
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
            env = f"{prefix}{name}".upper()
            assert f"| {reference.env_code(env)} |" in page, name


def test_headings_name_what_reads_the_variables_not_private_modules(page):
    headings = [line for line in page.splitlines() if line.startswith("#")]
    assert headings
    for heading in headings:
        assert "herdless._" not in heading, heading
        assert ".settings." not in heading, heading
        assert "Settings`" not in heading, heading  # no class names either
    assert headings[0].startswith("## The SDK: `herdless.Client`")


def test_variable_names_break_only_after_an_underscore(reference, page):
    code = reference.env_code("HERDLESS_GATEWAY_MAX_INFLIGHT_TOKENS")
    assert code == (
        '<code class="herdless-env">HERDLESS_<wbr>GATEWAY_<wbr>MAX_<wbr>INFLIGHT_<wbr>TOKENS</code>'
    )
    # Every table row's variable is written that way...
    rows = [line for line in page.splitlines() if line.startswith("| <code")]
    assert rows
    for row in rows:
        env = re.match(r'\| <code class="herdless-env">([^<]+(?:<wbr>[^<]+)*)</code>', row)
        assert env, row
        assert "_" not in env.group(1).replace("_<wbr>", "")  # a <wbr> after every "_"
    # ... and the site's stylesheet forbids any other break inside it.
    css = (SCRIPTS.parent / "stylesheets" / "herdless.css").read_text()
    assert "code.herdless-env" in css
    assert "word-break: keep-all" in css
    assert "stylesheets/herdless.css" in (SCRIPTS.parents[1] / "mkdocs.yml").read_text()


def test_policy_variables_show_the_field_they_set(reference, page):
    # HERDLESS_RETRY_RETRY_AFTER_JITTER is the variable's real name (prefix + field);
    # the table shows the field beside it, and the section says the rule.
    rows = [line for line in page.splitlines() if "RETRY_<wbr>RETRY_<wbr>AFTER" in line]
    (row,) = rows
    assert "| `retry_after_jitter` |" in row
    assert "`retry_after_jitter` is `HERDLESS_RETRY_RETRY_AFTER_JITTER`" in page
    for line in page.splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if len(cells) == 5 and cells[0].startswith("<code"):
            env = re.sub(r"<[^>]+>", "", cells[0])
            field = cells[1].strip("`")
            assert env.endswith("_" + field.upper()), line


def test_the_contract_variables_are_listed(reference, page):
    for name in (
        "HERDLESS_PRIMARY_URL",
        "HERDLESS_PRIMARY_API_KEY",
        "HERDLESS_MODEL",
        "HERDLESS_FALLBACK_URL",
        "HERDLESS_FALLBACK_API_KEY",
        "HERDLESS_FALLBACK_MODEL",
    ):
        assert f"| {reference.env_code(name)} |" in page


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
    assert "HERDLESS_<wbr>PRIMARY_<wbr>URL" in out


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_exported_name_has_an_entry_in_the_api_reference():
    import herdless

    api = (SCRIPTS.parent / "reference" / "api.md").read_text()
    directives = set(re.findall(r"^::: ([\w.]+)$", api, re.MULTILINE))
    for name in herdless.__all__:
        if name.startswith("__"):
            continue
        module = importlib.import_module(getattr(herdless, name).__module__)
        whole = module.__name__ in directives and name in getattr(module, "__all__", ())
        assert f"herdless.{name}" in directives or whole, f"herdless.{name} has no entry"


def test_doctest_sessions_become_console_blocks():
    fence = _load("griffe_doctests").fence_sessions
    text = (
        "Summary.\n\n"
        ">>> with Client() as client:  # doctest: +SKIP\n"
        "...     client.chat(messages)\n"
        "(0.5, 4.0)\n"
        "\n"
        "Raises:\n"
        "    ValueError: never."
    )
    assert fence(text) == (
        "Summary.\n\n"
        "```pycon\n"
        ">>> with Client() as client:\n"
        "...     client.chat(messages)\n"
        "(0.5, 4.0)\n"
        "```\n"
        "\n"
        "Raises:\n"
        "    ValueError: never."
    )
    already = "```python\n>>> x = 1\n```"
    assert fence(already) == already  # a session already in a code block stays
    assert fence("no examples here") == "no examples here"


def test_the_site_check_finds_private_bases_quotes_and_directives(tmp_path):
    check = _load("check_site")
    api = tmp_path / "reference" / "api"
    api.mkdir(parents=True)
    import herdless

    entries = "".join(f'<h2 id="herdless.{n}"></h2>' for n in herdless.__all__)
    good = entries + '<p class="doc doc-class-bases">Bases: <code><span>Exception</span></code></p>'
    (api / "index.html").write_text(good)
    assert check.problems(tmp_path) == []
    bad = (
        '<p class="doc doc-class-bases">Bases: <code><span title="x">_BaseClient</span></code></p>'
        "<blockquote>\n<blockquote><p>policy = 1  # doctest: +SKIP</p></blockquote></blockquote>"
    )
    (api / "index.html").write_text(bad)
    found = check.problems(tmp_path)
    assert "a private base is shown: _BaseClient" in found
    assert "a '# doctest:' directive is shown" in found
    assert "a >>> example rendered as a nested quote" in found
    assert "no entry for herdless.PacingPolicy" in found


def test_the_cli_page_shows_every_command_s_help_as_it_prints() -> None:
    pytest.importorskip("rich", reason="the demo's and bench's help need the demo extra")
    from herdless.gateway.cli import help_text

    cli_reference = _load("cli_reference")
    page = cli_reference.render()
    for command in ("herdless", *cli_reference.COMMANDS):
        assert f"## `{command}`\n" in page
    assert "Embedded default" in page
    assert "[default: 256; env: HERDLESS_GATEWAY_MAX_QUEUE]" in " ".join(page.split())
    with cli_reference._columns():
        assert help_text().rstrip() in page  # the same text --help prints


def test_every_row_has_a_description(reference, page) -> None:
    # Descriptions come from the settings fields alone (the --help text is made from
    # them too): a field without one is a row without meaning.
    for cls in reference.settings_classes():
        if cls.model_config.get("env_prefix") == "HERDLESS_":
            continue  # the SDK's knobs take theirs from the policies' docstrings
        for row in reference.rows(cls):
            assert row.description, row.env
