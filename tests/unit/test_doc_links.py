"""The README and docs/ link to each other by relative paths: every link lands on a file that
exists (and, with `#anchor`, on a heading that file has), and every page in docs/ is linked from
the README, so a section moved out of the README stays one click away."""

from __future__ import annotations

import re
from pathlib import Path

from tests.toy import ROOT

DOCUMENTS = (
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "bench" / "README.md",
)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchor(heading: str) -> str:
    """A heading's anchor as GitHub renders it: lower case, punctuation dropped, spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {anchor(h) for h in HEADING.findall(FENCE.sub("", path.read_text()))}


def links(path: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(FENCE.sub("", path.read_text()))
        if not re.match(r"^[a-z]+:", target)
    ]


def test_every_relative_link_lands() -> None:
    broken = []
    for document in DOCUMENTS:
        for target in links(document):
            path, _, fragment = target.partition("#")
            landing = (document.parent / path).resolve() if path else document
            where = f"{document.relative_to(ROOT)}: {target}"
            if not landing.exists():
                broken.append(f"{where} (no such file)")
            elif fragment and landing.suffix == ".md" and fragment not in anchors(landing):
                broken.append(f"{where} (no such heading)")
    assert broken == []


def test_every_docs_page_is_linked_from_the_readme() -> None:
    readme = ROOT / "README.md"
    linked = {(readme.parent / t.partition("#")[0]).resolve() for t in links(readme)}
    unlinked = [
        str(page.relative_to(ROOT)) for page in (ROOT / "docs").glob("*.md") if page not in linked
    ]
    assert unlinked == []


def test_anchor_is_githubs() -> None:
    assert anchor("Running it") == "running-it"
    assert anchor("`power_cycle`") == "power_cycle"
    assert anchor("Rollback (a `restart_model`, and `restart_ray`)") == (
        "rollback-a-restart_model-and-restart_ray"
    )
