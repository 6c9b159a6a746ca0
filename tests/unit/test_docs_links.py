"""Every document the code names in a message or a comment exists: a hint that sends a user to a
missing page is a dead end."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"\bdocs/[A-Za-z0-9_./-]+\.(?:md|html)\b")


def test_every_docs_page_named_in_the_source_exists() -> None:
    named: dict[str, list[str]] = {}
    for path in sorted((ROOT / "src").rglob("*.py")) + sorted((ROOT / "src").rglob("*.html")):
        if "vendor" in path.parts:  # third-party bundles name their own docs
            continue
        for page in NAMED.findall(path.read_text(errors="replace")):
            named.setdefault(page, []).append(str(path.relative_to(ROOT)))
    assert named, "the source names no docs page: the pattern no longer matches"
    missing = {page: where for page, where in named.items() if not (ROOT / page).is_file()}
    assert not missing, missing


LINK = re.compile(r"\]\(([A-Za-z0-9_./-]+)(?:#[^)]*)?\)")


def test_every_relative_link_in_the_readme_and_the_docs_resolves() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in pages
        for target in LINK.findall(page.read_text())
        if not target.startswith(("http://", "https://", "mailto:")) and not (page.parent / target).exists()
    ]
    assert len(pages) > 5 and not broken, broken
