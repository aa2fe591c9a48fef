"""The real app through ``flwr run`` in Flower's Ray simulation, on generated data.

The tests own their simulation SuperLink (:class:`fedreg_tools.launcher.LocalSuperLink`):
free loopback ports, their own ``FLWR_HOME``, and every process it spawned stopped by
process group when the module's tests are done.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fedreg_app.core.checkpoint import Checkpoint
from fedreg_app.core.data import DatasetInfo
from fedreg_app.core.models import BASE, HEAD_G, build_model
from fedreg_app.registry import federated_algorithm_names
from fedreg_tools.launcher import LocalSuperLink, descendants
from tests.algorithm_runs import (
    as_run_config_text,
    check_run,
    dataset_fixture,
    expected_sampled_clients,
    run_config,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def superlink(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSuperLink]:
    offline = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    with LocalSuperLink(tmp_path_factory.mktemp("flwr_home"), extra_env=offline) as link:
        yield link


def flwr_run(superlink: LocalSuperLink, run_config: str) -> str:
    return superlink.run(run_config, supernodes=4, timeout=600)


def results_of(folder: Path) -> dict:
    [path] = list(folder.glob("*/results.json"))
    return json.loads(path.read_text())


#: The algorithms whose run goes through Flower's Ray simulation in CI: the product, and
#: the baselines with server state (FedDyn) and client state (Ditto), on three layouts.
#: Every algorithm runs in process in CI (``test_algorithm_runs.py``, the same checks);
#: ``--all-simulations`` runs each of them here too.
SIMULATED_IN_CI = ("fedreg", "feddyn", "ditto")


def simulation_params(algos: list[str]) -> list:
    return [
        algo if algo in SIMULATED_IN_CI else pytest.param(algo, marks=pytest.mark.simulation_all)
        for algo in algos
    ]


@pytest.mark.parametrize("algo", simulation_params(federated_algorithm_names()))
def test_every_algorithm_runs_in_simulation(
    superlink: LocalSuperLink, request: pytest.FixtureRequest, tmp_path: Path, algo: str
) -> None:
    dataset = request.getfixturevalue(dataset_fixture(algo))
    results_dir = tmp_path / "results"
    log = flwr_run(superlink, as_run_config_text(run_config(algo, dataset, results_dir)))
    assert "[round   3/3]" in log, log[-3000:]
    csv_text = next(results_dir.glob("*/rounds.csv")).read_text()
    results = results_of(results_dir)
    check_run(algo, results, csv_text)
    hosts = [host for r in results["rounds"] for host in r["client_hosts"].values()]
    actors = {host["ray-actor"] for host in hosts}  # every training client names its actor
    assert 1 <= len(actors) <= (os.cpu_count() or 1)  # one actor per CPU at most
    assert {host["niceness"] for host in hosts} == {"0"}  # not Ray's default of 15


@pytest.mark.simulation_all
@pytest.mark.parametrize("algo", ["local", "centralised"])
def test_the_references_run_in_simulation(
    superlink: LocalSuperLink, grey_dataset: Path, tmp_path: Path, algo: str
) -> None:
    """Local training: the sampled clients train and send no parameters, no global model.
    Centralised training: the ServerApp trains on the union of the train splits (its own
    copy of the data, in the ServerApp's process) and every client evaluates the model."""
    results_dir = tmp_path / "results"
    log = flwr_run(
        superlink,
        f"algo='{algo}' dataset-path='{grey_dataset}' results-dir='{results_dir}' "
        "num-server-rounds=2 local-epochs=1 fraction-train=0.5 min-partition-size=5 seed=7",
    )
    assert "[round   2/2]" in log, log[-3000:]
    results = results_of(results_dir)
    assert results["run"]["status"] == "completed"
    for record in results["rounds"]:
        assert 0.0 <= record["personal_accuracy"] <= 1.0
        assert len(record["client_accuracies"]) == 4 and record["num_train_examples"] > 0
        assert record["train_bytes_from_clients"] == 0
    if algo == "local":
        assert results["best_global_accuracy"] is None
        sampled = [r["sampled_clients"] for r in results["rounds"]]
        assert sampled == expected_sampled_clients(7, 2)
    else:
        assert results["best_global_accuracy"] == max(
            r["global_accuracy"] for r in results["rounds"]
        )
        assert all(r["sampled_clients"] == [] for r in results["rounds"])


def test_bad_config_fails_before_training(
    superlink: LocalSuperLink, grey_dataset: Path, tmp_path: Path
) -> None:
    results_dir = tmp_path / "results"
    log = flwr_run(
        superlink, f"alpha=-1.0 dataset-path='{grey_dataset}' results-dir='{results_dir}'"
    )
    assert "alpha=-1.0 is not allowed" in log, log[-3000:]
    results = results_of(results_dir)  # refused before any work, and says so on disk
    assert results["run"]["status"] == "failed" and results["rounds"] == []
    assert "alpha=-1.0 is not allowed" in results["run"]["error"]


def simulation_processes(superlink: LocalSuperLink) -> list[int]:
    """PIDs of the running ``flwr-simulation`` process (ServerApp + Ray clients)."""
    found = []
    for pid in descendants(superlink.process.pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "flwr-simulation" in command:
            found.append(pid)
    return found


def sigkill_tree(pid: int) -> None:
    for target in [*descendants(pid), pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, signal.SIGKILL)


def test_server_sigkilled_mid_round_then_resumed_matches_an_uninterrupted_run(
    superlink: LocalSuperLink, grey_dataset: Path, tmp_path: Path
) -> None:
    """A real fault: SIGKILL the simulation process (ServerApp and clients) during round
    2's training, as soon as one client has committed its round-2 state and before the
    server's round-2 checkpoint; resume from the checkpoint: every round's accuracies
    equal the uninterrupted run's. One client at a time (2 CPUs each), so the kill lands
    between the two clients of the round."""
    common = (
        f"algo='fedreg' dataset-path='{grey_dataset}' local-epochs=10 fraction-train=0.5 "
        "min-partition-size=5 seed=11 num-server-rounds=3"
    )
    whole, part = tmp_path / "whole", tmp_path / "part"
    superlink.run(f"{common} results-dir='{whole}' state-dir='{tmp_path / 'sw'}'",
                  supernodes=4, cpus_per_client=2, timeout=600)  # fmt: skip
    state = tmp_path / "sp"
    command = superlink.command(f"{common} results-dir='{part}' state-dir='{state}'", 4, 2)
    log = (tmp_path / "killed.log").open("w")
    cli = subprocess.Popen(command, cwd=superlink.app, env=superlink.env, stdout=log,
                           stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.monotonic() + 300
    try:
        while not list(state.glob("runs/*/partition-*/round-000002")):
            assert time.monotonic() < deadline, "round 2 never started"
            time.sleep(0.005)
        for pid in simulation_processes(superlink):
            sigkill_tree(pid)
    finally:
        cli.terminate()
        cli.wait(timeout=60)
        log.close()
    [run_folder] = list(part.glob("*/"))
    checkpoint = json.loads((run_folder / "checkpoint" / "state.json").read_text())
    assert checkpoint["round"] == 1  # killed before the round-2 checkpoint ...
    assert len(list(state.glob("runs/*/partition-*/round-000002"))) == 1  # ... mid-round
    assert results_of(part)["run"]["status"] == "running"  # nothing could write "failed"
    log_text = superlink.run(
        f"{common} results-dir='{part}' state-dir='{state}' resume='{run_folder}'",
        supernodes=4, cpus_per_client=2, timeout=600,
    )  # fmt: skip
    assert "resuming" in log_text, log_text[-3000:]
    expected, resumed = results_of(whole), results_of(part)
    assert resumed["run"]["status"] == "completed"
    assert resumed["run"]["resumed"][0]["after_round"] == 1
    for a, b in zip(expected["rounds"], resumed["rounds"], strict=True):
        assert a["sampled_clients"] == b["sampled_clients"]
        assert a["global_accuracy"] == b["global_accuracy"]
        assert a["personal_accuracy"] == b["personal_accuracy"]
    [whole_folder] = list(whole.glob("*/"))
    final, reference = Checkpoint.load(run_folder)[0], Checkpoint.load(whole_folder)[0]
    assert final.round == reference.round == 3
    assert all(np.array_equal(final.model[k], reference.model[k]) for k in reference.model)


def test_a_client_that_raises_in_the_simulation_is_recorded_by_its_exception(
    superlink: LocalSuperLink, grey_dataset: Path, tmp_path: Path
) -> None:
    """A real client fault in Flower's Ray simulation: once the ServerApp has made its run
    folder, a file takes the place of one sampled client's state folder, so the client's
    ClientApp raises ``FileExistsError`` when it commits its state after training. Flower
    hands the ServerApp Ray's task error (a chained traceback with colour codes); the
    record names the client's own exception, and the run goes on without that client."""
    seed = 13
    victim = expected_sampled_clients(seed, 1)[0][0]
    results_dir, state = tmp_path / "results", tmp_path / "state"
    run_config = (
        f"algo='fedreg' dataset-path='{grey_dataset}' local-epochs=1 fraction-train=0.5 "
        f"min-partition-size=5 seed={seed} num-server-rounds=2 "
        f"results-dir='{results_dir}' state-dir='{state}'"
    )
    log = (tmp_path / "run.log").open("w")
    cli = subprocess.Popen(superlink.command(run_config, 4), cwd=superlink.app,
                           env=superlink.env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not (folders := [p for p in results_dir.glob("*/") if p.is_dir()]):
            assert time.monotonic() < deadline and cli.poll() is None, "no run folder"
            time.sleep(0.005)
        blocked = (state / "runs" / folders[0].name / f"partition-{victim}").resolve()
        assert not blocked.exists(), "the client committed before the fault was placed"
        blocked.parent.mkdir(parents=True, exist_ok=True)
        blocked.write_text("not a folder")
        assert cli.wait(timeout=600) == 0
    finally:
        if cli.poll() is None:
            cli.terminate()
            cli.wait(timeout=60)
        log.close()
    results = results_of(results_dir)
    assert results["run"]["status"] == "degraded"
    failed = {"phase": "train", "error": f"FileExistsError: [Errno 17] File exists: '{blocked}'"}
    for record in results["rounds"]:
        if victim in record["sampled_clients"]:
            assert [{k: e[k] for k in ("phase", "error")} for e in record["errors"]] == [failed]
            assert record["errors"][0]["partitions"] == [victim]
            assert record["train_failures"] == 1 and record["train_replies"] == 1
        else:
            assert record["errors"] == [] and record["train_failures"] == 0


def test_shakespeare_with_the_char_lstm_from_a_pretrained_model(
    superlink: LocalSuperLink, tmp_path: Path, shakespeare_like: Path
) -> None:
    """LEAF Shakespeare's layout, natural per-speaker clients, ``003``'s CharLSTM, started
    from a model file (``init-model``): the path a user of ``003`` takes."""
    from fedreg_app.core.persist import save_arrays

    text = DatasetInfo(num_classes=80, channels=1, height=1, width=80, modality="text")
    pretrained = build_model(text, head_depth=1, seed=123, model="charlstm")
    init_file = tmp_path / "pretrained.npz"
    save_arrays(init_file, pretrained.group_state(BASE, HEAD_G))
    results_dir = tmp_path / "results"
    log = flwr_run(
        superlink,
        f"algo='fedreg' dataset-path='{shakespeare_like}' results-dir='{results_dir}' "
        f"model='charlstm' head-depth=1 partition='natural' init-model='{init_file}' "
        "num-server-rounds=2 local-epochs=1 fraction-train=0.5 min-partition-size=5",
    )
    results = results_of(results_dir)
    assert results["run"]["status"] == "completed", log[-3000:]
    assert results["config"]["init-model"] == str(init_file)
    for record in results["rounds"]:
        assert 0.0 <= record["global_accuracy"] <= 1.0
        assert len(record["client_accuracies"]) == 4  # 4 of the 6 speakers
