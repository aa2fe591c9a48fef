"""Every run-config file in configs/ uses only keys the app declares, with valid values."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from clients.fedreg import FedReGOptions
from fedreg_app.core.config import RunConfig, earlier_meanings
from fedreg_app.registry import CATALOG, load_config
from fedreg_tools.replay import LOCATIONS
from fedreg_tools.runner_plan import Experiment, plan

PROJECT = Path(__file__).resolve().parents[1]
DECLARED = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


@pytest.mark.parametrize("path", sorted((PROJECT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_config_file_is_a_valid_experiment(path: Path, tmp_path: Path) -> None:
    """Declared keys only, and every cell of its grid passes the run-config checks."""
    experiment = Experiment.load(path, DECLARED)
    assert plan([experiment], tmp_path, DECLARED, {})
    assert "clients" in tomllib.loads(path.read_text()).get("experiment", {}), (
        f"{path.name} must say how many clients it needs ([experiment] clients)"
    )


def test_declared_defaults_are_valid_and_match_the_dataclass() -> None:
    config = load_config(DECLARED)
    # pyproject.toml and the dataclasses' defaults agree (FedReG is the default algo)
    assert config == RunConfig(options=FedReGOptions())


RESULTS_DOC = (PROJECT / "docs" / "results.md").read_text()
#: Every key's earlier meaning, the shared keys' and each algorithm's own.
EARLIER = earlier_meanings(CATALOG)
COMMITTED = sorted((PROJECT / "results").glob("**/seed*/results.json"))


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.parent.relative_to(PROJECT)))
def test_a_committed_run_is_a_run_of_its_config_file_as_it_stands(path: Path, tmp_path) -> None:
    """The README's published figures stay figures of configs/ today: a committed
    ``results.json`` records the config its cell and seed get from the config file that
    names its experiment, key for key (``auto`` resolved as the run resolved it). A key
    added since is absent from the record; it must default to what the run did (it is
    today's declared default, so a replay runs the same thing), unless the default
    changed with the key (:func:`earlier_meanings`): then the figures are of the earlier
    setting, which the record names by the key's absence and ``docs/results.md`` in
    words, and a replay runs it (:func:`as_ran`)."""
    experiment_name, cell, seed = path.parts[-4], path.parts[-3], int(path.parts[-2][4:])
    experiments = [Experiment.load(f, DECLARED) for f in (PROJECT / "configs").glob("*.toml")]
    # one experiment may come from several files (its honest and its attacked runs)
    named = [e for e in experiments if e.name == experiment_name]
    specs = [s for e in named for s in plan([e], tmp_path, DECLARED, {}, seed + 1)]
    [spec] = [s for s in specs if s.folder.parent.name == cell and s.folder.name == f"seed{seed}"]
    planned = load_config({**DECLARED, **spec.run_config}).to_run_config()
    recorded = json.loads(path.read_text())["config"]
    defaults = load_config(DECLARED).to_run_config()
    for key in sorted(set(planned) | set(recorded)):
        if key in LOCATIONS:
            continue
        assert key in planned, f"{path}: records {key}, which the app no longer declares"
        if key in recorded:
            assert recorded[key] == planned[key], f"{path}: {key} ran as {recorded[key]!r}"
        elif key in EARLIER:
            assert f"`{key} = {json.dumps(EARLIER[key])}`" in RESULTS_DOC, (
                f"{path}: ran before {key} existed; docs/results.md must say so"
            )
        else:
            assert planned[key] == defaults[key], f"{path}: ran before {key} existed"
