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


# --- the configuration page's key tables, made from the keys' declarations ----------------

CONFIGURATION = PROJECT / "docs" / "configuration.md"


def test_the_configuration_page_shows_the_keys_as_the_code_declares_them() -> None:
    from fedreg_tools.config_doc import page_block, render

    assert page_block(CONFIGURATION.read_text(encoding="utf-8")) == render(), (
        "docs/configuration.md's key tables differ from the code: run "
        "`python -m fedreg_tools.config_doc` to update"
    )


def test_every_declared_key_has_a_meaning_a_source_and_its_allowed_values() -> None:
    """Every key of RunConfig, of every algorithm's options and of pyproject.toml's
    table is on the page, with what it does, what is allowed and where its default
    comes from; the page shows each default as TOML reads it back."""
    import tomllib

    from fedreg_app.registry import CATALOG
    from fedreg_tools.config_doc import core_key_docs, option_groups, toml_value

    documented = core_key_docs() + [k for group in option_groups(CATALOG) for k in group.keys]
    by_key = {doc.key: doc for doc in documented}
    assert len(by_key) == len(documented), "a key is declared twice"
    pyproject = tomllib.loads((PROJECT / "pyproject.toml").read_text())
    declared = pyproject["tool"]["flwr"]["app"]["config"]
    assert set(declared) == set(by_key)
    lacking = [d.key for d in documented if not (d.doc.strip() and d.source.strip() and d.allowed)]
    assert lacking == []
    for doc in documented:
        assert tomllib.loads(f"v = {toml_value(doc.default)}")["v"] == declared[doc.key]


def test_the_algorithm_keys_are_shown_with_every_algorithm_that_reads_them() -> None:
    from fedreg_app.registry import CATALOG, algorithm_names
    from fedreg_tools.config_doc import core_key_docs, keyless_algorithms, option_groups

    readers: dict[str, set[str]] = {}
    for group in option_groups(CATALOG):
        for key in group.keys:
            readers.setdefault(key.key, set()).update(group.algorithms)
    for name, options in CATALOG.items():
        for key in options.declared():
            assert name in readers[key], (name, key)
    assert readers["personal-epochs"] == {"ditto", "fedrep", "fedavg2rep"}
    assert "fedavg" in keyless_algorithms(CATALOG)
    algo = next(key for key in core_key_docs() if key.key == "algo")
    assert [name for name in algorithm_names() if f"`{name}`" not in algo.allowed] == []


def test_the_generator_rewrites_only_its_block_and_check_says_when_the_page_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedreg_tools.config_doc import BEGIN, END, main, render

    page = tmp_path / "configuration.md"
    page.write_text(f"# Configuration\n\nBefore.\n\n{BEGIN}\nold table\n{END}\n\nAfter.\n")
    assert main(["--check", "--page", str(page)]) == 1
    assert "python -m fedreg_tools.config_doc" in capsys.readouterr().err
    assert main(["--page", str(page)]) == 0
    assert page.read_text() == (
        f"# Configuration\n\nBefore.\n\n{BEGIN}\n{render()}{END}\n\nAfter.\n"
    )
    assert main(["--check", "--page", str(page)]) == 0
    page.write_text("# Configuration\n\nno markers\n")
    assert main(["--page", str(page)]) == 2
    assert page.read_text() == "# Configuration\n\nno markers\n"


def test_the_readme_reads_in_minutes() -> None:
    """A newcomer's first page: at most 300 lines, none longer than 300 characters (the
    depth is on the documentation site)."""
    lines = (PROJECT / "README.md").read_text().splitlines()
    assert len(lines) <= 300
    assert [n for n, line in enumerate(lines, 1) if len(line) > 300] == []
