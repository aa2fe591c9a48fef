"""One short run of each algorithm, and what it must show: shared by the in-process run
of every algorithm (``test_algorithm_runs.py``, CI) and the Ray simulation runs
(``test_e2e.py``: a few in CI, every algorithm with ``--all-simulations``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedreg_app.core.config import RunConfig
from fedreg_app.core.data import DatasetInfo
from fedreg_app.core.models import BASE, HEAD_G, build_model
from fedreg_app.core.partition_map import PartitionMap
from fedreg_app.core.records import to_record
from fedreg_app.registry import load_config
from strategies.fedavg import FedAvgStrategy

#: Where an algorithm's run does not use the default (Fashion-MNIST/MNIST's layout with
#: the ConvNet), the hub layout and model it runs on instead: every dataset layout and
#: model goes through a whole run this way, at no extra run's cost. (FedAvg, FedPer and
#: FedBABU stay on the default: their bytes are checked exactly.)
LAYOUTS: dict[str, tuple[str, dict[str, Any]]] = {
    "fedprox": ("emnist_letters_like", {}),
    "fedavg2rep": ("emnist_letters_like", {"model": "cnn", "head-depth": 1}),
    "feddyn": ("cifar100_like", {}),
    "ditto": ("colour_dataset", {}),
    "fedrod": ("colour_dataset", {}),
    "fedrep": ("tiny_imagenet_like", {"model": "mlp", "head-depth": 1}),  # small for 64x64
    "lg-fedavg": ("grey_dataset", {"model": "cnn", "head-depth": 1}),
}
SEED, ROUNDS, CLIENTS = 7, 3, 4


def eval_every(algo: str) -> int:
    return 1 if algo == "fedbabu-deviation" else 2  # it tracks every round's spread


def run_config(algo: str, dataset: Path, results_dir: Path) -> dict[str, Any]:
    """Three rounds, half the 4 clients a round, evaluated in rounds 2 and 3."""
    return {
        "algo": algo, "dataset-path": str(dataset), "results-dir": str(results_dir),
        **LAYOUTS.get(algo, ("", {}))[1],
        "num-server-rounds": ROUNDS, "eval-every": eval_every(algo), "local-epochs": 1,
        "fraction-train": 0.5, "min-partition-size": 5, "personal-epochs": 1,
        "finetune-epochs": 1, "seed": SEED, "deviation-finetune-rounds": 1,
        "fedavg2rep-warmup-rounds": 1,
    }  # fmt: skip


def as_run_config_text(config: dict[str, Any]) -> str:
    """``flwr run --run-config`` text: ``key='text' key=1 ...``."""
    return " ".join(f"{k}='{v}'" if isinstance(v, str) else f"{k}={v}" for k, v in config.items())


def dataset_fixture(algo: str) -> str:
    return LAYOUTS.get(algo, ("grey_dataset", {}))[0]


def expected_sampled_clients(seed: int, rounds: int) -> list[list[int]]:
    """What the seeded sampler draws for 4 clients at fraction 0.5, whatever the algo."""
    strategy = FedAvgStrategy(RunConfig(seed=seed, fraction_train=0.5))
    strategy.set_partitions(PartitionMap(CLIENTS, {p: p for p in range(CLIENTS)}))
    return [strategy.sample_partitions(0) for _ in range(rounds)]


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
    FedBABU's fixed head). Only an evaluated round's evaluation phase has client compute,
    and it is a part of the round's."""
    for record in rounds:
        assert record["bytes_to_clients"] > 0 and record["bytes_from_clients"] > 0
        assert record["trained_parameters"] > 0
        assert 0 < record["client_compute_seconds"] <= record["client_handler_seconds"]
        parts = ("client_compute_seconds", "client_setup_seconds", "client_state_seconds")
        assert min(record[part] for part in parts) >= 0
        assert sum(record[part] for part in parts) <= record["client_handler_seconds"] + 0.005
        by_client = record["client_train_seconds"]  # one per trained client, its handler's
        assert sorted(map(int, by_client)) == sorted(record["sampled_clients"])
        assert min(by_client.values()) > 0
        assert sum(by_client.values()) <= record["client_handler_seconds"] + 0.005 * len(by_client)
    for record in rounds:
        evaluated = record["personal_accuracy"] is not None
        assert (record["eval_compute_seconds"] > 0) == evaluated
        assert record["eval_compute_seconds"] < record["client_compute_seconds"]
    sent = {"fedavg": (BASE, HEAD_G), "fedper": (BASE,), "fedbabu": (BASE,)}.get(algo)
    if sent:
        size = model_bytes(algo, *sent)
        assert rounds[0]["bytes_to_clients"] == 2 * size  # training only
        whole = model_bytes(algo, BASE, HEAD_G)
        assert rounds[1]["bytes_to_clients"] == 2 * size + 4 * whole  # train + evaluate
        assert [r["train_bytes_to_clients"] for r in rounds] == [2 * size] * 3
    if algo == "fedavg":
        assert rounds[0]["bytes_from_clients"] == 2 * model_bytes(algo, BASE, HEAD_G)


def check_run(algo: str, results: dict[str, Any], csv_text: str) -> None:
    """A completed 3-round run: the evaluated rounds, every client's accuracy, the seeded
    clients of each round (the same for every algorithm), the best figure, the CSV and
    the costs."""
    assert results["run"]["status"] == "completed"
    assert results["config"]["algo"] == algo
    rounds = results["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    # eval-every=2: rounds 2 and 3 (the last) are evaluated, round 1 is not
    if eval_every(algo) == 2:
        assert rounds[0]["global_accuracy"] is None and rounds[0]["personal_accuracy"] is None
    for record in rounds[1:]:
        assert 0.0 <= record["global_accuracy"] <= 1.0
        assert 0.0 <= record["personal_accuracy"] <= 1.0
        assert len(record["client_accuracies"]) == CLIENTS  # every client, not the sampled
        assert 0.0 <= record["personal_accuracy_sampled"] <= 1.0  # over those that trained
        assert 2 <= record["clients_trained"] <= CLIENTS
    assert all(r["num_train_examples"] > 0 for r in rounds)
    expected = expected_sampled_clients(SEED, ROUNDS)
    if algo in ("fedseq-vanilla", "fedseq-anti", "fedbabu-deviation"):
        expected[2] = [0, 1, 2, 3]  # their final fine-tune round trains every client
    assert [r["sampled_clients"] for r in rounds] == expected
    best = max(r["global_accuracy"] for r in rounds[1:])
    assert results["best_global_accuracy"] == best
    csv_lines = csv_text.splitlines()
    assert csv_lines[0].startswith("round,global_accuracy,personal_accuracy")
    assert len(csv_lines) == ROUNDS + 1
    check_costs(algo, rounds)
