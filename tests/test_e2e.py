"""The real app through ``flwr run`` in Flower's Ray simulation, on generated data.

The tests own their simulation SuperLink (:class:`fedreg_app.launcher.LocalSuperLink`):
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

from fedreg_app.checkpoint import Checkpoint
from fedreg_app.config import RunConfig
from fedreg_app.data import DatasetInfo
from fedreg_app.launcher import LocalSuperLink, descendants
from fedreg_app.models import BASE, HEAD_G, build_model
from fedreg_app.partition_map import PartitionMap
from fedreg_app.records import to_record
from fedreg_app.registry import federated_algorithm_names, load_config
from strategies.fedavg import FedAvgStrategy

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


def expected_sampled_clients(seed: int, rounds: int) -> list[list[int]]:
    """What the seeded sampler draws for 4 clients at fraction 0.5, whatever the algo."""
    strategy = FedAvgStrategy(RunConfig(seed=seed, fraction_train=0.5))
    strategy.set_partitions(PartitionMap(4, {p: p for p in range(4)}))
    return [strategy.sample_partitions(0) for _ in range(rounds)]


#: Where an algorithm's end-to-end run does not use the default (Fashion-MNIST/MNIST's
#: layout with the ConvNet), the hub layout and model it runs on instead: every dataset
#: layout and model goes through a whole ``flwr run`` this way, at no extra run's cost.
#: (FedAvg, FedPer and FedBABU stay on the default: their bytes are checked exactly.)
LAYOUTS = {
    "fedprox": ("emnist_letters_like", ""),
    "fedavg2rep": ("emnist_letters_like", "model='cnn' head-depth=1"),
    "feddyn": ("cifar100_like", ""),
    "ditto": ("colour_dataset", ""),
    "fedrod": ("colour_dataset", ""),
    "fedrep": ("tiny_imagenet_like", "model='mlp' head-depth=1"),  # small model for 64x64
    "lg-fedavg": ("grey_dataset", "model='cnn' head-depth=1"),
}


@pytest.mark.parametrize("algo", federated_algorithm_names())
def test_every_algorithm_runs_in_simulation(
    superlink: LocalSuperLink, request: pytest.FixtureRequest, tmp_path: Path, algo: str
) -> None:
    fixture, model_keys = LAYOUTS.get(algo, ("grey_dataset", ""))
    dataset = request.getfixturevalue(fixture)
    results_dir = tmp_path / "results"
    eval_every = 1 if algo == "fedbabu-deviation" else 2  # it tracks every round's spread
    log = flwr_run(
        superlink,
        f"algo='{algo}' dataset-path='{dataset}' results-dir='{results_dir}' {model_keys} "
        f"num-server-rounds=3 eval-every={eval_every} local-epochs=1 fraction-train=0.5 "
        "min-partition-size=5 personal-epochs=1 finetune-epochs=1 seed=7 "
        "deviation-finetune-rounds=1 fedavg2rep-warmup-rounds=1",
    )
    assert "[round   3/3]" in log, log[-3000:]
    results = results_of(results_dir)
    assert results["run"]["status"] == "completed"
    assert results["config"]["algo"] == algo
    rounds = results["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    # eval-every=2: rounds 2 and 3 (the last) are evaluated, round 1 is not
    if eval_every == 2:
        assert rounds[0]["global_accuracy"] is None and rounds[0]["personal_accuracy"] is None
    for record in rounds[1:]:
        assert 0.0 <= record["global_accuracy"] <= 1.0
        assert 0.0 <= record["personal_accuracy"] <= 1.0
        assert len(record["client_accuracies"]) == 4  # every client, not only the sampled
        assert 0.0 <= record["personal_accuracy_sampled"] <= 1.0  # over those that trained
        assert 2 <= record["clients_trained"] <= 4
    assert all(r["num_train_examples"] > 0 for r in rounds)
    # the same seed trains the same clients in the same rounds for every algorithm
    expected = expected_sampled_clients(7, 3)
    if algo in ("fedseq-vanilla", "fedseq-anti", "fedbabu-deviation"):
        expected[2] = [0, 1, 2, 3]  # their final fine-tune round trains every client
    assert [r["sampled_clients"] for r in rounds] == expected
    best = max(r["global_accuracy"] for r in rounds[1:])
    assert results["best_global_accuracy"] == best
    csv_lines = (next(results_dir.glob("*/rounds.csv"))).read_text().splitlines()
    assert csv_lines[0].startswith("round,global_accuracy,personal_accuracy")
    assert len(csv_lines) == 4
    check_costs(algo, rounds)


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


def model_bytes(algo: str, *groups: str) -> int:
    """Serialized bytes of the named groups of the run's model on the generated data,
    split where the algorithm splits it (``head-depth = "auto"``)."""
    info = DatasetInfo(num_classes=10, channels=1, height=28, width=28)
    depth = load_config({"algo": algo}).head_depth
    record = to_record(build_model(info, depth, 0).group_state(*groups))
    return sum(len(array.data) for array in record.values())


def check_costs(algo: str, rounds: list[dict]) -> None:
    """Every round records traffic, trained parameters and client time; FedAvg, FedPer and
    FedBABU send exactly what they should: 2 sampled clients train, all 4 evaluate in
    round 2, and an evaluation message carries the whole global model (what the client
    uses, plus the rest for evaluating the global model: FedPer's averaged head,
    FedBABU's fixed head)."""
    for record in rounds:
        assert record["bytes_to_clients"] > 0 and record["bytes_from_clients"] > 0
        assert record["trained_parameters"] > 0
        assert 0 < record["client_compute_seconds"] <= record["client_handler_seconds"]
    sent = {"fedavg": (BASE, HEAD_G), "fedper": (BASE,), "fedbabu": (BASE,)}.get(algo)
    if sent:
        size = model_bytes(algo, *sent)
        assert rounds[0]["bytes_to_clients"] == 2 * size  # training only
        whole = model_bytes(algo, BASE, HEAD_G)
        assert rounds[1]["bytes_to_clients"] == 2 * size + 4 * whole  # train + evaluate
        assert [r["train_bytes_to_clients"] for r in rounds] == [2 * size] * 3
    if algo == "fedavg":
        assert rounds[0]["bytes_from_clients"] == 2 * model_bytes(algo, BASE, HEAD_G)


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


def test_shakespeare_with_the_char_lstm_from_a_pretrained_model(
    superlink: LocalSuperLink, tmp_path: Path, shakespeare_like: Path
) -> None:
    """LEAF Shakespeare's layout, natural per-speaker clients, ``003``'s CharLSTM, started
    from a model file (``init-model``): the path a user of ``003`` takes."""
    from fedreg_app.persist import save_arrays

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
