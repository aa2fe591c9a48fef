"""Every run-config file in configs/ uses only keys the app declares, with valid values."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from clients.fedreg import FedReGOptions
from fedreg_app.config import RunConfig
from fedreg_app.experiments import Experiment, plan
from fedreg_app.registry import load_config

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
