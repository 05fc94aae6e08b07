"""The sdist and the wheel carry the license, the changelog and the package itself.

Built with hatchling's own builders, in this process, offline (``python -m build``
builds the same two through the same backend, in an isolated environment).
"""

from __future__ import annotations

import email.parser
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("hatchling", reason="the test dependency group brings hatchling")
    from hatchling.builders.sdist import SdistBuilder
    from hatchling.builders.wheel import WheelBuilder

    out = tmp_path_factory.mktemp("dist")
    sdist = next(SdistBuilder(str(ROOT)).build(directory=str(out), versions=["standard"]))
    wheel = next(WheelBuilder(str(ROOT)).build(directory=str(out), versions=["standard"]))
    return {"sdist": Path(sdist), "wheel": Path(wheel)}


def test_the_license_is_apache_2_and_declared_so() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text
    assert "Version 2.0, January 2004" in text
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()


def test_the_wheel_carries_the_license_and_declares_it(built: dict[str, Path]) -> None:
    with zipfile.ZipFile(built["wheel"]) as wheel:
        names = wheel.namelist()
        dist_info = next(n.split("/")[0] for n in names if ".dist-info/" in n)
        licensed = wheel.read(f"{dist_info}/licenses/LICENSE").decode()
        metadata = email.parser.Parser().parsestr(wheel.read(f"{dist_info}/METADATA").decode())
    assert licensed == (ROOT / "LICENSE").read_text()
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["License-File"] == "LICENSE"
    assert "herdless/py.typed" in names
    extras = set(metadata.get_all("Provides-Extra") or [])
    assert {"openai", "langchain", "llamaindex"} <= extras


def test_the_sdist_carries_license_changelog_and_sources(built: dict[str, Path]) -> None:
    with tarfile.open(built["sdist"]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml"} <= names
    assert "sdk/herdless/__init__.py" in names
    assert not any(name.startswith(("tests/", "examples/", "deploy/")) for name in names)


def test_the_changelog_keeps_the_format() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "[Keep a Changelog]" in text
    assert "## [Unreleased]" in text
    from herdless import __version__

    assert f"## [{__version__}] - " in text
