"""The console scripts answer ``--help`` and a wrong argument at once: without torch,
matplotlib, Flower, the datasets library or Ray, which take seconds to import."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
#: What a script must not import before it has parsed its arguments.
HEAVY = ("torch", "matplotlib", "flwr", "datasets", "ray")
#: Subcommands with a parser of their own: (script, subcommand).
SUBCOMMANDS = [("fedreg-report", "classes")]
SECONDS = 5.0  # import and parse; seconds are what a heavy import costs

CHILD = """
import importlib, json, sys, time
module, function, argv = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
start = time.perf_counter()
main = getattr(importlib.import_module(module), function)
try:
    main(argv)
    code = 0
except SystemExit as stop:
    code = stop.code
seconds = time.perf_counter() - start
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy})
print(json.dumps({{"code": code, "seconds": seconds, "heavy": heavy}}), file=sys.stderr)
"""


def scripts() -> dict[str, str]:
    """pyproject.toml's [project.scripts]: name -> ``module:function``."""
    return tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]["scripts"]


def call(entry_point: str, argv: list[str]) -> tuple[dict, str, str]:
    """Run the entry point with ``argv`` in a fresh interpreter: what it reported about
    itself, its standard output and the rest of its standard error."""
    module, function = entry_point.split(":")
    child = CHILD.format(heavy=set(HEAVY))
    done = subprocess.run(
        [sys.executable, "-c", child, module, function, json.dumps(argv)],
        cwd=PROJECT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    *err, last = done.stderr.rstrip("\n").splitlines() or [""]
    assert last.startswith("{"), done.stderr
    return json.loads(last), done.stdout, "\n".join(err)


CASES = [(name, []) for name in scripts()] + [(name, [sub]) for name, sub in SUBCOMMANDS]


@pytest.mark.parametrize(("script", "before"), CASES, ids=[" ".join([n, *s]) for n, s in CASES])
def test_help_answers_without_heavy_imports(script: str, before: list[str]) -> None:
    report, out, _ = call(scripts()[script], [*before, "--help"])
    assert report["code"] in (0, None)
    assert out.startswith(f"usage: {' '.join([script, *before])}")
    assert report["heavy"] == [], f"{script} --help imported {report['heavy'][:5]}"
    assert report["seconds"] < SECONDS


@pytest.mark.parametrize(("script", "before"), CASES, ids=[" ".join([n, *s]) for n, s in CASES])
def test_a_wrong_argument_is_refused_without_heavy_imports(script: str, before: list[str]) -> None:
    report, _, err = call(scripts()[script], [*before, "--no-such-option"])
    assert report["code"] == 2
    assert f"{' '.join([script, *before])}: error: " in err  # argparse's, on stderr
    assert report["heavy"] == [], f"{script} imported {report['heavy'][:5]}"


def test_every_subcommand_named_here_is_a_script() -> None:
    assert {name for name, _ in SUBCOMMANDS} <= set(scripts())
