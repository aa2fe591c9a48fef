"""The key tables of the configuration page, made from the keys' declarations.

Every run-config key is declared once in the code, with its default, what is allowed,
what it does and where its default comes from: the keys every algorithm shares as
:class:`~fedreg_app.core.config.RunConfig` fields (:func:`~fedreg_app.core.config.core_key`), each
algorithm's own on its options type (:func:`~fedreg_app.core.config.option`). This module
renders them as Markdown and writes them between ``<!-- keys:begin -->`` and
``<!-- keys:end -->`` in ``docs/configuration.md``; the rest of the page is written by
hand::

    python -m fedreg_tools.config_doc            # rewrite the page's tables
    python -m fedreg_tools.config_doc --check    # exit 1 if the page differs from the code

It imports the registry for the algorithms' options types, and with it PyTorch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedreg_app.core.config import AlgorithmOptions, RunConfig

BEGIN = "<!-- keys:begin -->"
END = "<!-- keys:end -->"
PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
UPDATE = "python -m fedreg_tools.config_doc"
HEADER = "| key | default | allowed | meaning | source of the default |\n|---|---|---|---|---|"


@dataclass(frozen=True)
class KeyDoc:
    """One key as the page shows it."""

    key: str
    default: Any
    allowed: str
    doc: str
    source: str


@dataclass(frozen=True)
class OptionGroup:
    """The keys one options type declares itself, and the algorithms that read them (an
    options type's keys are read by every algorithm whose options derive from it)."""

    algorithms: tuple[str, ...]
    keys: tuple[KeyDoc, ...]


def core_key_docs() -> list[KeyDoc]:
    """The keys every algorithm shares, in their declaration order; ``algo``'s allowed
    values are the registry's names (the shared config names no algorithm)."""
    from fedreg_app.registry import algorithm_names

    names = ", ".join(f"`{name}`" for name in algorithm_names())
    return [
        KeyDoc(
            field.name.replace("_", "-"),
            field.default,
            f"one of {names}" if field.name == "algo" else field.metadata.get("allowed", ""),
            field.metadata.get("doc", ""),
            field.metadata.get("source", ""),
        )
        for field in dataclasses.fields(RunConfig)
        if field.name not in ("options", "given")
    ]


def _owner(kind: type[AlgorithmOptions], name: str) -> type:
    """The options type that declares field ``name`` (the first of ``kind``'s bases to
    have it), not one that inherits it."""
    return next(
        base
        for base in reversed(kind.__mro__)
        if dataclasses.is_dataclass(base) and name in {f.name for f in dataclasses.fields(base)}
    )


def option_groups(catalog: Mapping[str, type[AlgorithmOptions]]) -> list[OptionGroup]:
    """The algorithms' keys, grouped by the options type that declares them, in the
    catalog's order of algorithms (a base type's keys before those of types built on it)."""
    names = list(catalog)
    keys: dict[type, list[KeyDoc]] = {}
    users: dict[type, list[str]] = {}
    for name, kind in catalog.items():
        for field in dataclasses.fields(kind):
            owner = _owner(kind, field.name)
            if owner not in keys:
                keys[owner] = [
                    KeyDoc(
                        f.metadata["key"],
                        f.default,
                        f.metadata["allowed"],
                        f.metadata["doc"],
                        f.metadata["source"],
                    )
                    for f in dataclasses.fields(owner)
                    if _owner(owner, f.name) is owner
                ]
                users[owner] = []
            if name not in users[owner]:
                users[owner].append(name)
    order = sorted(keys, key=lambda owner: (names.index(users[owner][0]), len(owner.__mro__)))
    return [OptionGroup(tuple(users[owner]), tuple(keys[owner])) for owner in order]


def keyless_algorithms(catalog: Mapping[str, type[AlgorithmOptions]]) -> list[str]:
    return [name for name, kind in catalog.items() if not dataclasses.fields(kind)]


def toml_value(value: Any) -> str:
    """A default as it is written in TOML (``pyproject.toml``, ``--run-config``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return repr(value)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _row(key: KeyDoc) -> str:
    cells = (
        f"`{key.key}`",
        f"`{toml_value(key.default)}`",
        _cell(key.allowed),
        _cell(key.doc),
        _cell(key.source),
    )
    return "| " + " | ".join(cells) + " |"


def _names(algorithms: Sequence[str]) -> str:
    quoted = [f"`{name}`" for name in algorithms]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


def render(catalog: Mapping[str, type[AlgorithmOptions]] | None = None) -> str:
    """The Markdown between the markers (without them): the core keys' table, then one
    table per group of algorithm keys."""
    if catalog is None:
        from fedreg_app.registry import CATALOG

        catalog = CATALOG
    lines = [
        f"<!-- Made by `{UPDATE}` from the keys' declarations: edit those. -->",
        "",
        "## Core keys",
        "",
        "Every algorithm reads these.",
        "",
        HEADER,
        *(_row(key) for key in core_key_docs()),
        "",
        "## Algorithm keys",
        "",
        "Each table holds the keys of the algorithms in its heading (the `algo` values).",
    ]
    for group in option_groups(catalog):
        lines += ["", f"### {_names(group.algorithms)}", "", HEADER]
        lines += [_row(key) for key in group.keys]
    keyless = keyless_algorithms(catalog)
    if keyless:
        lines += ["", f"{_names(keyless)} have no keys of their own."]
    return "\n".join(lines) + "\n"


def replace_block(page: str, block: str) -> str:
    """``page`` with the text between the markers replaced by ``block``."""
    if page.count(BEGIN) != 1 or page.count(END) != 1 or page.index(BEGIN) > page.index(END):
        raise ValueError(f"expected one {BEGIN} followed by one {END}")
    head, rest = page.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{block}{END}{tail}"


def page_block(page: str) -> str:
    """The text between the markers, as :func:`render` makes it."""
    return page.split(BEGIN, 1)[1].split(END, 1)[0].removeprefix("\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=UPDATE,
        description="Write the run-config keys' tables into the configuration page, "
        "from their declarations in the code.",
    )
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if the page differs"
    )
    parser.add_argument("--page", type=Path, default=PAGE, help="default: %(default)s")
    args = parser.parse_args(argv)
    try:
        page = args.page.read_text(encoding="utf-8")
        updated = replace_block(page, render())
    except (OSError, ValueError) as error:
        print(f"{args.page}: {error}", file=sys.stderr)
        return 2
    if updated == page:
        print(f"{args.page}: the key tables match the code")
        return 0
    if args.check:
        message = f"{args.page}: the key tables differ from the code; run `{UPDATE}` to update"
        print(message, file=sys.stderr)
        return 1
    args.page.write_text(updated, encoding="utf-8")
    print(f"{args.page}: key tables rewritten from the code")
    return 0


if __name__ == "__main__":
    sys.exit(main())
