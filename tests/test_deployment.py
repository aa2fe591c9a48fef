"""The app as a real deployment on loopback: a SuperLink and three SuperNodes as separate
processes (``fedreg_tools.deployment.LocalDeployment``), on tiny generated data.

Slow (every message starts a ClientApp process; SuperNodes poll every few seconds; a
killed node is noticed after about a minute), so marked ``deployment`` and skipped unless
asked for::

    python -m pytest --deployment -m deployment
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedreg_tools.deployment import LocalDeployment
from fedreg_tools.launcher import HF_OFFLINE_ENV, config_text

pytestmark = pytest.mark.deployment
MAKE_CERTS = Path(__file__).resolve().parents[1] / "deploy" / "make_certs.sh"


def three_nodes(root: Path) -> list[dict]:
    return [
        {"partition-id": i, "num-partitions": 3, "state-dir": str(root / f"device{i}")}
        for i in range(3)
    ]


def run_config(dataset: Path, results: Path, rounds: int, **extra) -> str:
    pairs = {
        "algo": "fedreg", "dataset-path": str(dataset), "results-dir": str(results),
        "num-server-rounds": rounds, "local-epochs": 1, "fraction-train": 1.0,
        "min-partition-size": 5, "seed": 5, **extra,
    }  # fmt: skip
    return config_text(pairs)


def results_in(folder: Path) -> dict:
    paths = sorted(folder.glob("*/results.json"))
    return json.loads(paths[-1].read_text()) if paths else {}


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f}s for {what}")
        time.sleep(1.0)


def assert_stopped(pids: list[int]) -> None:
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[LocalDeployment]:
    with LocalDeployment(tmp_path / "deploy", three_nodes(tmp_path), extra_env=HF_OFFLINE_ENV) as d:
        yield d
        pids = d.pids()
    assert_stopped(pids)


def test_fedreg_on_a_superlink_and_three_supernodes(
    deployment: LocalDeployment, grey_dataset: Path, tmp_path: Path
) -> None:
    results_dir = tmp_path / "results"
    log = deployment.run(run_config(grey_dataset, results_dir, rounds=2), timeout=900)
    results = results_in(results_dir)
    assert results.get("run", {}).get("status") == "completed", log[-3000:]
    assert [r["round"] for r in results["rounds"]] == [1, 2]
    assert all(r["sampled_clients"] == [0, 1, 2] for r in results["rounds"])
    assert sorted(results["rounds"][-1]["client_accuracies"]) == ["0", "1", "2"]
    for i in range(3):  # private heads and decoded data live on each device's disk
        assert list((tmp_path / f"device{i}" / "runs").glob("*/partition-*/round-*/head_p.npz"))
        assert list((tmp_path / f"device{i}" / "data").glob("*/partition-*.npz"))


#: The recent methods: FedALA, FedCP, FedDBE, FedAS, FedAvg with fine-tuning.
RECENT_METHODS = ("fedala", "fedcp", "feddbe", "fedas", "fedavg-ft")


def test_the_recent_methods_run_on_the_same_superlink_and_supernodes(
    deployment: LocalDeployment, grey_dataset: Path, tmp_path: Path
) -> None:
    """Each of the recent five, one run after the other on one deployment: each completes
    with every device trained and evaluated in every round."""
    for algo in RECENT_METHODS:
        results_dir = tmp_path / "results" / algo
        log = deployment.run(run_config(grey_dataset, results_dir, rounds=2, algo=algo),
                             timeout=900)  # fmt: skip
        results = results_in(results_dir)
        assert results.get("run", {}).get("status") == "completed", (algo, log[-3000:])
        assert results["config"]["algo"] == algo
        assert all(r["sampled_clients"] == [0, 1, 2] for r in results["rounds"]), algo
        assert sorted(results["rounds"][-1]["client_accuracies"]) == ["0", "1", "2"], algo
        assert results["rounds"][-1]["global_accuracy"] is not None, algo


def test_a_killed_supernode_rejoins_with_its_private_head(
    deployment: LocalDeployment, grey_dataset: Path, tmp_path: Path
) -> None:
    results_dir = tmp_path / "results"
    config = run_config(grey_dataset, results_dir, rounds=4, **{"reply-timeout": 120.0})
    run = deployment.start_run(config, tmp_path / "run.log")
    try:
        wait_for(lambda: len(results_in(results_dir).get("rounds", [])) >= 1, 600, "round 1")
        deployment.kill_supernode(1)  # power lost mid-run (round 2 is under way)
        time.sleep(5)
        deployment.start_supernode(1)  # back, with a new node id and the same state-dir
        run.wait(timeout=1200)
    finally:
        if run.poll() is None:
            run.kill()
    results = results_in(results_dir)
    log = (tmp_path / "run.log").read_text()
    # the round the node died in is recorded, with the node and its partition: the run is
    # degraded, not completed
    assert results["run"]["status"] == "degraded", log[-3000:]
    failed = [e for r in results["rounds"] for e in r["errors"]]
    assert failed and all(e["partitions"] == [1] for e in failed), failed
    assert "Node Unavailable" in failed[0]["error"]
    assert len(results["rounds"]) == 4
    assert all(r["num_train_examples"] > 0 for r in results["rounds"])
    # partition 1 trained again after coming back, starting from the head it left on disk
    assert 1 in results["rounds"][-1]["sampled_clients"]
    node_log = (tmp_path / "deploy" / "supernode1.log").read_text()
    # after its restart (the log goes on in the same file), with the records it had
    # committed before it died in round 2: its optimizers' momentum and head_p of round 1
    after_restart = node_log.split("Starting Flower SuperNode")[-1]
    assert re.search(r"partition 1: restored [\w\-, ]*head_p of round 1 ", after_restart), node_log
    # with its state-dir intact it lost nothing: no round counts a reset (state-held)
    assert [r["state_resets"] for r in results["rounds"]] == [0, 0, 0, 0]


def test_a_server_killed_mid_round_resumes_to_the_uninterrupted_numbers(
    deployment: LocalDeployment, grey_dataset: Path, tmp_path: Path
) -> None:
    """SIGKILL the SuperLink and its ServerApp in round 2, as soon as one device has
    committed its round-2 state (before the server's round-2 checkpoint); restart, resume:
    every round equals an uninterrupted deployed run's."""
    whole = tmp_path / "whole"
    deployment.run(run_config(grey_dataset, whole, 3), timeout=900)
    results_dir = tmp_path / "results"
    run = deployment.start_run(run_config(grey_dataset, results_dir, 3), tmp_path / "run.log")
    devices = [tmp_path / f"device{i}" / "runs" for i in range(3)]

    def committed_round_2() -> list[Path]:
        folders = [results_dir / p.name for p in results_dir.glob("*/")]
        keys = {f.name for f in folders}
        return [v for d in devices for v in d.glob("*/partition-*/round-000002")
                if v.parent.parent.name in keys]  # fmt: skip

    try:
        deadline = time.monotonic() + 900
        while not committed_round_2():
            assert time.monotonic() < deadline, "round 2 never started"
            time.sleep(0.05)
        deployment.kill_superlink()  # the server crashes mid-round, its ServerApp with it
    finally:
        run.kill()
    [run_folder] = [p for p in results_dir.iterdir() if p.is_dir()]
    done = json.loads((run_folder / "checkpoint" / "state.json").read_text())["round"]
    assert done == 1 and results_in(results_dir)["run"]["status"] == "running"
    assert committed_round_2()  # stale round-2 state on disk that resume must not use
    deployment.start_superlink()  # same port and database: the SuperNodes reconnect
    log = deployment.run(
        run_config(grey_dataset, results_dir, 3, resume=str(run_folder)), timeout=900
    )
    expected, results = results_in(whole), results_in(results_dir)
    assert results["run"]["status"] == "completed", log[-3000:]
    assert results["run"]["resumed"][0]["after_round"] == 1
    for a, b in zip(expected["rounds"], results["rounds"], strict=True):
        assert (a["round"], a["sampled_clients"]) == (b["round"], b["sampled_clients"])
        assert a["global_accuracy"] == b["global_accuracy"]
        assert a["personal_accuracy"] == b["personal_accuracy"]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_tls_between_supernodes_and_superlink(grey_dataset: Path, tmp_path: Path) -> None:
    certificates = tmp_path / "certificates"
    subprocess.run(["bash", str(MAKE_CERTS), str(certificates)], check=True, capture_output=True)
    nodes = three_nodes(tmp_path)[:2]
    for node in nodes:
        node["num-partitions"] = 2
    with LocalDeployment(
        tmp_path / "deploy", nodes, tls=certificates, extra_env=HF_OFFLINE_ENV
    ) as d:
        log = d.run(run_config(grey_dataset, tmp_path / "results", rounds=1), timeout=900)
        pids = d.pids()
    assert_stopped(pids)
    results = results_in(tmp_path / "results")
    assert results.get("run", {}).get("status") == "completed", log[-3000:]
    assert "insecure" not in (tmp_path / "deploy" / "supernode0.log").read_text().lower()
