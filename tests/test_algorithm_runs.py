"""Every algorithm through the real ServerApp and ClientApp, in this process, with every
message, reply and node context serialized by Flower as on the wire
(:mod:`tests.inprocess`): run whole, and killed mid-round then resumed. The same checks
of the whole run go through Flower's Ray simulation in ``test_e2e.py``: there a few
algorithms in CI, every one with ``--all-simulations``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from flwr.app import MessageType

from fedreg_app.registry import federated_algorithm_names
from tests.algorithm_runs import CLIENTS, ROUNDS, check_run, dataset_fixture, run_config
from tests.inprocess import (
    ServerKilled,
    assert_same_arrays,
    client_states,
    final_model,
    results,
    run_server,
)

#: What may differ between two runs of one setting: clocks and where the clients ran.
UNTIMED = ("seconds", "client_hosts")


def without_clocks(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if not any(word in k for word in UNTIMED)}


@pytest.mark.parametrize("algo", federated_algorithm_names())
def test_every_algorithm_runs_in_process_and_resumes_a_kill_to_the_same_run(
    request: pytest.FixtureRequest, tmp_path: Path, algo: str
) -> None:
    """The run (what :func:`check_run` asks of the algorithm), then the same run killed in
    its last round's evaluation after one reply (every client that trained in that round
    has committed its state of the round, the checkpoint is the round before's, and the
    algorithms' last-round steps, FedBABU's fine-tuning, are under way) and resumed from
    its folder: every round's record (all but clocks and hosts), the run's figures, the
    final global model and every client's private state equal the uninterrupted run's,
    bit for bit, for every algorithm, each with its own server and client state. Before,
    an evaluated client deleted its state of the round before as superseded, which the
    resume then needed: it started afresh (`state_resets`) and every algorithm's final
    model differed. (One test: the uninterrupted run is the one checked, not run twice;
    a kill mid-training is `test_reliability.py`'s.)"""
    dataset = request.getfixturevalue(dataset_fixture(algo))
    whole, part = tmp_path / "whole", tmp_path / "part"
    config = run_config(algo, dataset, whole)
    _, stopped = run_server({**config, "state-dir": str(tmp_path / "sw")}, num_partitions=CLIENTS)
    assert stopped is None, stopped
    check_run(algo, results(whole), next(whole.glob("*/rounds.csv")).read_text())
    killed = {**config, "results-dir": str(part), "state-dir": str(tmp_path / "sp")}
    _, stopped = run_server(killed, num_partitions=CLIENTS, run_id=2,
                            kill_after=(MessageType.EVALUATE, ROUNDS, 1))  # fmt: skip
    assert isinstance(stopped, ServerKilled)
    assert results(part)["run"]["status"] == "running"  # as a SIGKILL leaves it
    [run_folder] = [p.parent for p in part.glob("*/results.json")]
    _, stopped = run_server({**killed, "resume": str(run_folder)}, num_partitions=CLIENTS,
                            run_id=3)  # fmt: skip
    assert stopped is None, stopped
    expected, resumed = results(whole), results(part)
    assert resumed["run"]["status"] == expected["run"]["status"] == "completed"
    assert resumed["run"]["resumed"][0]["after_round"] == ROUNDS - 1
    assert [without_clocks(r) for r in resumed["rounds"]] == [
        without_clocks(r) for r in expected["rounds"]
    ]
    figures = [k for k in expected if k.startswith(("best_", "total_", "log10_"))]
    assert {k: resumed[k] for k in figures} == {k: expected[k] for k in figures}
    assert_same_arrays(final_model(part), final_model(whole))
    states = client_states(tmp_path / "sw")
    if states:  # the algorithms whose clients keep private state
        assert_same_arrays(client_states(tmp_path / "sp"), states)
