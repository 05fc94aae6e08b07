"""mkdocs hooks: generated pages, and a nav that tolerates pages still being written."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import cli_reference  # found through the path above
import config_reference

# Pages other owners write; until one exists, links to it render as plain text.
PAGES_WRITTEN_ELSEWHERE = (
    "emulator.md",
    "gateway.md",
    "resilience.md",
    "real-vllm.md",
    "benchmarks.md",
    "reliability.md",
)


def _unlink_missing(markdown: str, docs_dir: Path) -> str:
    for page in PAGES_WRITTEN_ELSEWHERE:
        if not (docs_dir / page).exists():
            pattern = r"\[([^\]]+)\]\((?:\.\./)?" + re.escape(page) + r"(?:#[^)]*)?\)"
            markdown = re.sub(pattern, r"\1", markdown)
    return markdown


def _prune(items: list[Any], docs_dir: Path) -> list[Any]:
    """Drop nav entries whose markdown file does not exist (yet), and sections left empty."""
    kept: list[Any] = []
    for item in items:
        if isinstance(item, str):
            if (docs_dir / item).exists():
                kept.append(item)
            continue
        ((title, value),) = item.items()
        if isinstance(value, list):
            value = _prune(value, docs_dir)
            if value:
                kept.append({title: value})
        elif (docs_dir / value).exists():
            kept.append(item)
    return kept


def on_config(config: Any) -> Any:
    config["nav"] = _prune(config["nav"], Path(config["docs_dir"]))
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    markdown = _unlink_missing(markdown, Path(config["docs_dir"]))
    if config_reference.MARKER in markdown:
        table = config_reference.render(config_reference.settings_classes())
        markdown = markdown.replace(config_reference.MARKER, table)
    if cli_reference.MARKER in markdown:
        markdown = markdown.replace(cli_reference.MARKER, cli_reference.render())
    return markdown
