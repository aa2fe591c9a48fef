"""Every algorithm through the real ServerApp and ClientApp, in this process, with every
message, reply and node context serialized by Flower as on the wire
(:mod:`tests.inprocess`). The same checks run through Flower's Ray simulation in
``test_e2e.py``: there a few algorithms in CI, every one with ``--all-simulations``."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedreg_app.registry import federated_algorithm_names
from tests.algorithm_runs import CLIENTS, check_run, dataset_fixture, run_config
from tests.inprocess import results, run_server


@pytest.mark.parametrize("algo", federated_algorithm_names())
def test_every_algorithm_runs_in_process(
    request: pytest.FixtureRequest, tmp_path: Path, algo: str
) -> None:
    dataset = request.getfixturevalue(dataset_fixture(algo))
    results_dir = tmp_path / "results"
    _, stopped = run_server(run_config(algo, dataset, results_dir), num_partitions=CLIENTS)
    assert stopped is None, stopped
    csv_text = next(results_dir.glob("*/rounds.csv")).read_text()
    check_run(algo, results(results_dir), csv_text)
