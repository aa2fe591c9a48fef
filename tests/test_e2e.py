"""The real app through ``flwr run`` in Flower's Ray simulation, on generated data.

The tests own their simulation SuperLink (:class:`fedreg_app.launcher.LocalSuperLink`):
free loopback ports, their own ``FLWR_HOME``, and every process it spawned stopped by
process group when the module's tests are done.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedreg_app.config import RunConfig
from fedreg_app.data import DatasetInfo
from fedreg_app.launcher import LocalSuperLink
from fedreg_app.models import BASE, HEAD_G, build_model
from fedreg_app.partition_map import PartitionMap
from fedreg_app.records import to_record
from fedreg_app.registry import algorithm_names
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


@pytest.mark.parametrize("algo", algorithm_names())
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


def model_bytes(*groups: str) -> int:
    """Serialized bytes of the named groups of the run's model on the generated data."""
    info = DatasetInfo(num_classes=10, channels=1, height=28, width=28)
    record = to_record(build_model(info, 2, 0).group_state(*groups))
    return sum(len(array.data) for array in record.values())


def check_costs(algo: str, rounds: list[dict]) -> None:
    """Every round records traffic, trained parameters and client time; FedAvg, FedPer and
    FedBABU send exactly what they should: 2 sampled clients train, all 4 evaluate in
    round 2."""
    for record in rounds:
        assert record["bytes_to_clients"] > 0 and record["bytes_from_clients"] > 0
        assert record["trained_parameters"] > 0
        assert 0 < record["client_compute_seconds"] <= record["client_handler_seconds"]
    sent = {"fedavg": (BASE, HEAD_G), "fedper": (BASE,), "fedbabu": (BASE,)}.get(algo)
    if sent:
        size = model_bytes(*sent)
        assert rounds[0]["bytes_to_clients"] == 2 * size  # training only
        assert rounds[1]["bytes_to_clients"] == (2 + 4) * size  # training + evaluation
        assert [r["train_bytes_to_clients"] for r in rounds] == [2 * size] * 3
    if algo == "fedavg":
        assert rounds[0]["bytes_from_clients"] == 2 * model_bytes(BASE, HEAD_G)


def test_bad_config_fails_before_training(
    superlink: LocalSuperLink, grey_dataset: Path, tmp_path: Path
) -> None:
    results_dir = tmp_path / "results"
    log = flwr_run(
        superlink, f"alpha=-1.0 dataset-path='{grey_dataset}' results-dir='{results_dir}'"
    )
    assert "alpha=-1.0 is not allowed" in log, log[-3000:]
    assert not results_dir.exists()


def test_interrupted_and_resumed_run_matches_an_uninterrupted_one(
    superlink: LocalSuperLink, grey_dataset: Path, tmp_path: Path
) -> None:
    """Stop after round 2 (a completed 2-round run stands in for the interruption), resume
    from its checkpoint to round 3: the same numbers as 3 rounds in one go. Client state is
    on disk (``state-dir``), so FedReG's private heads carry over the restart."""
    common = (
        f"algo='fedreg' dataset-path='{grey_dataset}' local-epochs=1 fraction-train=0.5 "
        "min-partition-size=5 seed=11"
    )
    whole, part = tmp_path / "whole", tmp_path / "part"
    whole_state, part_state = tmp_path / "state-whole", tmp_path / "state-part"
    flwr_run(
        superlink, f"{common} num-server-rounds=3 results-dir='{whole}' state-dir='{whole_state}'"
    )
    flwr_run(
        superlink, f"{common} num-server-rounds=2 results-dir='{part}' state-dir='{part_state}'"
    )
    [run_folder] = list(part.glob("*/"))
    assert json.loads((run_folder / "checkpoint" / "state.json").read_text())["round"] == 2
    resume = f"state-dir='{part_state}' resume='{run_folder}'"
    log = flwr_run(superlink, f"{common} num-server-rounds=3 results-dir='{part}' {resume}")
    assert "resuming" in log, log[-3000:]
    expected, resumed = results_of(whole), results_of(part)
    assert resumed["run"]["status"] == "completed" and len(resumed["rounds"]) == 3
    assert resumed["run"]["resumed"][0]["after_round"] == 2
    for a, b in zip(expected["rounds"], resumed["rounds"], strict=True):
        assert a["sampled_clients"] == b["sampled_clients"]
        assert a["global_accuracy"] == pytest.approx(b["global_accuracy"], abs=1e-6)
        assert a["personal_accuracy"] == pytest.approx(b["personal_accuracy"], abs=1e-6)
    heads = list((tmp_path / "state-part" / "runs").glob("*/partition-*/head_p.npz"))
    assert heads  # the private heads lived on disk, where the resumed run found them


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
