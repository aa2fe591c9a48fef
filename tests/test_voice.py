"""The product speaks of the product: no tracked text file tells how the project was made
by numbering the sittings it was made in. History a user needs is told by release version
(CHANGELOG.md), never by such a count."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]

#: Built in two parts so that this file's own source does not match it.
NARRATION = re.compile("sess" + r"ions? [0-9]+", re.IGNORECASE)

#: Files that are not text, by their name's ending (also skipped: any file with a NUL byte).
BINARY_SUFFIXES = frozenset({
    ".png", ".jpg", ".jpeg", ".gif", ".svg", ".ico", ".pdf", ".parquet", ".npz", ".npy",
    ".pt", ".pth", ".ckpt", ".safetensors", ".gz", ".zip", ".tar", ".whl", ".fab",
    ".arrow", ".pkl", ".db", ".sqlite", ".bin", ".h5",
})  # fmt: skip


def tracked_text_files() -> list[Path]:
    """The files git tracks in this checkout that exist and hold text."""
    if shutil.which("git") is None or not (PROJECT / ".git").exists():
        pytest.skip("not a git checkout (an sdist or an installed copy): no tracked files")
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=PROJECT, capture_output=True, check=True
    ).stdout.decode()
    paths = [PROJECT / name for name in listed.split("\0") if name]
    return [p for p in paths if p.suffix.lower() not in BINARY_SUFFIXES and p.is_file()]


def test_no_tracked_text_file_numbers_the_sittings_it_was_made_in() -> None:
    found = []
    for path in tracked_text_files():
        data = path.read_bytes()
        if b"\0" in data:
            continue
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if NARRATION.search(line):
                found.append(f"{path.relative_to(PROJECT)}:{number}: {line.strip()[:120]}")
    assert not found, (
        f"{len(found)} lines narrate how the project was made; state the fact in the "
        "product's terms, with a release version where history matters:\n" + "\n".join(found)
    )
