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


Kill = tuple[str, int, int]  # (phase, round, replies of that phase before the kill)


def run_whole(tmp_path: Path, config: dict[str, Any]) -> None:
    """The uninterrupted run: results in ``whole/``, client state in ``sw/``."""
    whole = {**config, "results-dir": str(tmp_path / "whole"), "state-dir": str(tmp_path / "sw")}
    _, stopped = run_server(whole, num_partitions=CLIENTS)
    assert stopped is None, stopped


def kill_and_resume(tmp_path: Path, config: dict[str, Any], kills: list[Kill]) -> Path:
    """The same run in ``part/``, killed at each of ``kills`` in turn (each resumed
    attempt killed again at the next), then resumed to its end: its results folder."""
    part = tmp_path / "part"
    killed = {**config, "results-dir": str(part), "state-dir": str(tmp_path / "sp")}
    for attempt, kill in enumerate(kills):
        resume = {"resume": str(run_folder(part))} if attempt else {}
        _, stopped = run_server({**killed, **resume}, num_partitions=CLIENTS,
                                run_id=2 + attempt, kill_after=kill)  # fmt: skip
        assert isinstance(stopped, ServerKilled), (kill, stopped)
        assert results(part)["run"]["status"] == "running"  # as a SIGKILL leaves it
    _, stopped = run_server({**killed, "resume": str(run_folder(part))}, num_partitions=CLIENTS,
                            run_id=2 + len(kills))  # fmt: skip
    assert stopped is None, stopped
    return part


def run_folder(results_dir: Path) -> Path:
    [folder] = [path.parent for path in results_dir.glob("*/results.json")]
    return folder


def assert_same_run(tmp_path: Path) -> None:
    """The resumed run (``part/``, ``sp/``) is the uninterrupted one (``whole/``, ``sw/``):
    every round's record (all but clocks and hosts), the run's status and figures, the
    final global model and every client's private state, bit for bit."""
    expected, resumed = results(tmp_path / "whole"), results(tmp_path / "part")
    assert resumed["run"]["status"] == expected["run"]["status"]
    assert [without_clocks(r) for r in resumed["rounds"]] == [
        without_clocks(r) for r in expected["rounds"]
    ]
    figures = [k for k in expected if k.startswith(("best_", "total_", "log10_"))]
    assert {k: resumed[k] for k in figures} == {k: expected[k] for k in figures}
    assert_same_arrays(final_model(tmp_path / "part"), final_model(tmp_path / "whole"))
    states = client_states(tmp_path / "sw")
    if states:  # the algorithms whose clients keep private state
        assert_same_arrays(client_states(tmp_path / "sp"), states)


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
    bit for bit, for every algorithm, each with its own server and client state. An
    evaluated client that deleted its state of the round before as superseded, which the
    resume needs, would start afresh (`state_resets`) and every algorithm's final model
    would differ. (One test: the uninterrupted run is the one checked, not run twice;
    a kill mid-training is `test_reliability.py`'s, more moments ``--resume-matrix``'s.)"""
    config = run_config(algo, request.getfixturevalue(dataset_fixture(algo)), tmp_path)
    run_whole(tmp_path, config)
    whole = tmp_path / "whole"
    check_run(algo, results(whole), next(whole.glob("*/rounds.csv")).read_text())
    part = kill_and_resume(tmp_path, config, [(MessageType.EVALUATE, ROUNDS, 1)])
    assert results(part)["run"]["resumed"][0]["after_round"] == ROUNDS - 1
    assert results(whole)["run"]["status"] == "completed"
    assert_same_run(tmp_path)


#: Opt-in (``--resume-matrix``): more moments to kill at, one after another in one run.
KILL_SEQUENCES = {
    "mid-training of the last round": [(MessageType.TRAIN, ROUNDS, 2)],
    "mid-training of round 2, then its resume in round 2's evaluation": [
        (MessageType.TRAIN, 2, 1), (MessageType.EVALUATE, 2, 2)
    ],
    "last round's evaluation, then its resume mid-training of that round": [
        (MessageType.EVALUATE, ROUNDS, 1), (MessageType.TRAIN, ROUNDS, 1)
    ],
}  # fmt: skip
#: Differential privacy in both modes, with little noise (more diverges on tiny data).
PRIVATE = {"dp-noise-multiplier": 0.01, "dp-clip": 1.0, "dp-delta": 1e-5}


@pytest.mark.resume_matrix
@pytest.mark.parametrize("dp_mode", ["off", "local", "central"])
@pytest.mark.parametrize("moment", list(KILL_SEQUENCES))
@pytest.mark.parametrize("algo", federated_algorithm_names())
def test_every_algorithm_killed_at_any_moment_resumes_to_the_same_run(
    request: pytest.FixtureRequest, tmp_path: Path, algo: str, moment: str, dp_mode: str
) -> None:
    """Every algorithm, with and without differential privacy, killed at further moments
    (a resumed attempt killed again too) and resumed: the uninterrupted run, bit for
    bit. Opt-in (about 10 minutes): ``pytest --resume-matrix -m resume_matrix``."""
    config = run_config(algo, request.getfixturevalue(dataset_fixture(algo)), tmp_path)
    if dp_mode != "off":
        config = {**config, **PRIVATE, "dp-mode": dp_mode}
    run_whole(tmp_path, config)
    kill_and_resume(tmp_path, config, KILL_SEQUENCES[moment])
    assert_same_run(tmp_path)
