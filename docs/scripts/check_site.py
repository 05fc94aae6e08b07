"""Checks of the built site that mkdocs' strict mode does not make (run by ``nox -s docs``).

    python docs/scripts/check_site.py site

- The API reference names no private class as a base ("Bases: _BaseClient").
- Its ``>>>`` examples are code blocks: no ``>>>`` left as a (nested) quote, and no
  ``# doctest:`` directive shown.
- Every name exported by ``herdless`` has an entry (an anchor) on that page.
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path


def problems(site: Path) -> list[str]:
    page = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    found: list[str] = []
    for bases in re.findall(r'<p class="doc doc-class-bases">(.*?)</p>', page, re.DOTALL):
        names = re.findall(r">\s*(\w+)\s*</(?:span|a)>", bases)
        found += [f"a private base is shown: {name}" for name in names if name.startswith("_")]
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    if "doctest:" in text:
        found.append("a '# doctest:' directive is shown")
    if re.search(r"<blockquote>\s*<blockquote>", page):
        found.append("a >>> example rendered as a nested quote")
    import herdless

    for name in herdless.__all__:
        if name.startswith("__"):
            continue
        # Documented as herdless.NAME, or in its public module (herdless.errors.NAME).
        module = getattr(getattr(herdless, name), "__module__", "")
        anchors = [f"herdless.{name}"]
        if "._" not in f"{module}.":  # a public module rendered whole
            anchors.append(f"{module}.{name}")
        if not any(f'id="{anchor}"' in page for anchor in anchors):
            found.append(f"no entry for herdless.{name}")
    return found


def main(argv: list[str]) -> int:
    found = problems(Path(argv[0] if argv else "site"))
    for problem in found:
        print(f"docs/reference/api.md: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
