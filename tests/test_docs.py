"""The README and the guides in docs/ link to each other and to committed files; a
moved section or a renamed file must not leave a reader at a dead link."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
DOCUMENTS = [PROJECT / "README.md", *sorted((PROJECT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings outside code blocks: lower case, punctuation
    other than ``-`` and ``_`` dropped, spaces as hyphens."""
    anchors, in_code = set(), False
    for line in markdown.split("\n"):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        heading = re.match(r"^#+ (.*)", line)
        if heading and not in_code:
            text = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def dead_links(document: Path) -> list[str]:
    dead = []
    for link in LINK.findall(document.read_text()):
        if re.match(r"^[a-z]+:", link):  # http(s), mailto: not checked offline
            continue
        path, _, anchor = link.partition("#")
        target = (document.parent / path).resolve() if path else document
        if not target.exists():
            dead.append(f"{link} (no such file)")
        elif (
            anchor and target.suffix == ".md" and anchor not in heading_anchors(target.read_text())
        ):
            dead.append(f"{link} (no such heading)")
    return dead


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(PROJECT)))
def test_every_relative_link_reaches_a_file_and_heading(document: Path) -> None:
    assert dead_links(document) == []


def test_the_checker_finds_a_dead_file_and_a_dead_heading(tmp_path: Path) -> None:
    (tmp_path / "guide.md").write_text(
        "# A guide\n\n## Its part\n\n```bash\n# not a heading\n```\n"
    )
    readme = tmp_path / "README.md"
    readme.write_text(
        "[ok](guide.md#its-part) [ok](#top) [gone](gone.md) [moved](guide.md#old-part)"
        " [code](guide.md#not-a-heading) [web](https://flower.ai/#x)\n\n# Top\n"
    )
    assert dead_links(readme) == [
        "gone.md (no such file)",
        "guide.md#old-part (no such heading)",
        "guide.md#not-a-heading (no such heading)",
    ]
