"""The reference points on the same partition: local training and centralised training,
run through the real ServerApp and ClientApp in this process."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedreg_app.core.checkpoint import Checkpoint
from fedreg_app.core.config import ConfigError
from fedreg_app.core.data import PartitionKey, data_digest, load_union_split, split_digests
from fedreg_app.core.models import BASE, HEAD_G
from fedreg_app.registry import get_algorithm, load_config
from tests.fake_data import copy_dataset
from tests.inprocess import ServerKilled, results, run_server


def reference_config(dataset: Path, tmp_path: Path, algo: str, **extra: Any) -> dict[str, Any]:
    return {"algo": algo, "dataset-path": str(dataset), "local-epochs": 1,
            "fraction-train": 0.5, "min-partition-size": 5, "alpha": 0.5, "seed": 3,
            "num-server-rounds": 2, "results-dir": str(tmp_path / "results"),
            "state-dir": str(tmp_path / "state"), **extra}  # fmt: skip


def the_run(tmp_path: Path) -> dict[str, Any]:
    return results(tmp_path / "results")


def test_local_training_sends_no_parameters_and_reports_no_global_accuracy(
    grey_dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    grid, stopped = run_server(reference_config(grey_dataset, tmp_path, "local"))
    assert stopped is None
    assert "run completed | best global – | best personal 0." in caplog.text  # not 0.0000
    document = the_run(tmp_path)
    assert document["run"]["status"] == "completed"
    assert document["run"]["global_evaluation"] == "none"
    assert document["best_global_accuracy"] is None
    for record in document["rounds"]:
        assert record["global_accuracy"] is None
        assert record["train_bytes_to_clients"] == 0 and record["bytes_from_clients"] == 0
        assert record["personal_accuracy"] is not None and len(record["sampled_clients"]) == 2
    assert any(phase == "train" for phase, _, _ in grid.delivered)


def test_a_local_client_trains_its_own_model_only_when_sampled(
    grey_dataset: Path, tmp_path: Path
) -> None:
    """A client never sampled keeps the seeded initial model (its accuracy is the same
    in both rounds); a sampled client's model moved, and no two clients share one."""
    run_server(reference_config(grey_dataset, tmp_path, "local"))
    first, second = the_run(tmp_path)["rounds"]
    never = set(range(4)) - set(first["sampled_clients"]) - set(second["sampled_clients"])
    for pid in never:
        assert first["client_accuracies"][str(pid)] == second["client_accuracies"][str(pid)]
    states = sorted((tmp_path / "state").glob("runs/*/partition-*/round-*/base.npz"))
    trained = {p.parts[-3] for p in states}
    assert trained == {f"partition-{p}" for p in set(first["sampled_clients"])
                       | set(second["sampled_clients"])}  # fmt: skip


def test_local_training_refuses_a_global_evaluation(grey_dataset: Path, tmp_path: Path) -> None:
    config = reference_config(grey_dataset, tmp_path, "local", **{"global-eval": "server"})
    with pytest.raises(ConfigError, match="global-eval='server'.*algo='local'.*no global model"):
        get_algorithm("local").strategy(load_config(config))


def test_centralised_training_runs_in_the_server_on_the_union_of_train_splits(
    grey_dataset: Path, tmp_path: Path
) -> None:
    """No client trains; each round processes the train samples of every whole batch
    (drop-last) local-epochs times; the personal figure is the same model per client, so
    it equals the global one."""
    grid, stopped = run_server(reference_config(grey_dataset, tmp_path, "centralised",
                                                **{"local-epochs": 2}))  # fmt: skip
    assert stopped is None
    assert not [d for d in grid.delivered if d[0] == "train"]
    document = the_run(tmp_path)
    key = PartitionKey.from_config(load_config(document["config"]), 4)
    union = len(load_union_split(key, "train"))
    batch = document["config"]["batch-size"]
    for record in document["rounds"]:
        assert record["num_train_examples"] == 2 * (union - union % batch)
        assert record["sampled_clients"] == [] and record["train_bytes_to_clients"] == 0
        assert record["global_accuracy"] == pytest.approx(record["personal_accuracy"])
    assert document["run"]["status"] == "completed"


def test_the_centralised_serverapp_decodes_its_train_union_once(
    grey_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The union it trains on comes from the pass that digests the partitions: decoding it
    again at round 1 (load_union_split) would fail this run."""

    def decoded_again(*args: object) -> None:
        raise AssertionError("the train union was decoded a second time")

    monkeypatch.setattr("strategies.centralised.load_union_split", decoded_again)
    _, stopped = run_server(reference_config(grey_dataset, tmp_path, "centralised"))
    assert stopped is None
    assert the_run(tmp_path)["run"]["status"] == "completed"


def test_a_resumed_centralised_run_equals_an_uninterrupted_one(
    grey_dataset: Path, tmp_path: Path
) -> None:
    """Killed in round 2's evaluation, after the server trained round 2 and before its
    checkpoint (round 1's keeps the optimizer's momentum), resumed in a fresh strategy:
    the same weights and figures as three rounds in one go."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    settings = {"num-server-rounds": 3}
    assert run_server(reference_config(grey_dataset, whole, "centralised", **settings))[1] is None
    killed = reference_config(grey_dataset, parts, "centralised", **settings)
    _, stopped = run_server(killed, kill_after=("evaluate", 2, 1))
    assert isinstance(stopped, ServerKilled)
    [folder] = list((parts / "results").glob("*/"))
    assert results(parts / "results")["run"]["status"] == "running"  # as a SIGKILL left it
    checkpoint, _ = Checkpoint.load(folder)
    assert checkpoint.round == 1
    assert any(k.startswith("momentum/") for k in checkpoint.strategy_arrays)
    _, stopped = run_server({**killed, "resume": str(folder)}, run_id=2)
    assert stopped is None
    ours, theirs = (
        Checkpoint.load(folder)[0],
        Checkpoint.load(next((whole / "results").glob("*/")))[0],
    )
    assert ours.round == theirs.round == 3 and ours.model.keys() == theirs.model.keys()
    for name in ours.model:
        np.testing.assert_array_equal(ours.model[name], theirs.model[name])
    accuracy = [[r["global_accuracy"] for r in the_run(p)["rounds"]] for p in (whole, parts)]
    assert len(accuracy[0]) == 3 and accuracy[0] == accuracy[1]


def test_centralised_momentum_of_the_wrong_shape_is_refused(grey_dataset: Path) -> None:
    config = load_config({"algo": "centralised", "dataset-path": str(grey_dataset)})
    strategy = get_algorithm("centralised").strategy(config)
    strategy.momentum = {"base.0.weight": np.zeros((1, 1), dtype=np.float32)}
    params = [torch.nn.Parameter(torch.zeros(3, 3))]
    with pytest.raises(ValueError, match="momentum of 'base.0.weight' has shape"):
        strategy.restored_momentum(["base.0.weight"], params)


def test_the_reference_algorithms_keep_what_they_should(grey_dataset: Path) -> None:
    """Local keeps the whole model private (so its resume needs a state-dir); the
    centralised client keeps nothing (its optimizer is the ServerApp's)."""
    config = load_config({"algo": "local", "dataset-path": str(grey_dataset)})
    local = get_algorithm("local").client
    assert set(local.private_groups) == {BASE, HEAD_G} and local.shared_groups == ()
    assert local.keeps_state(config)
    assert not get_algorithm("centralised").client.keeps_state(config)
    assert json.dumps(get_algorithm("local").strategy.group_weights) == "{}"


@pytest.mark.parametrize("algo", ["local", "centralised"])
def test_the_references_check_their_clients_data_as_the_federated_algorithms_do(
    grey_dataset: Path, tmp_path: Path, algo: str
) -> None:
    """The references' partitions are computed in the ServerApp as every other
    algorithm's: their records name their data (so a reference beside a federated run is
    shown to read the same samples), a node whose copy holds other samples is not
    counted, and a resume on a replaced dataset is refused. Before 0.3.0 none of this
    held for the references."""
    repainted = copy_dataset(grey_dataset, tmp_path / "repainted", repaint=5)
    ours, theirs = (
        split_digests(
            PartitionKey.from_config(load_config(reference_config(data, tmp_path, algo)), 4)
        )
        for data in (grey_dataset, repainted)
    )
    [changed] = [p for p in ours if ours[p] != theirs[p]]
    # the record names the partitioning, the same digest as any algorithm's on it
    whole = tmp_path / "whole"
    assert run_server(reference_config(grey_dataset, whole, algo))[1] is None
    assert the_run(whole)["run"]["data_digest"] == data_digest(ours)
    # a node reading other samples of the same sizes: its replies refused and named
    node = tmp_path / "node"
    config = reference_config(grey_dataset, node, algo)
    assert run_server(config, node_config={"dataset-path": str(repainted)})[1] is None
    document = the_run(node)
    assert document["run"]["status"] == "degraded"
    errors = [e for r in document["rounds"] for e in r["errors"]]
    assert errors and all(e["partitions"] == [changed] for e in errors), errors
    assert all("the node's dataset-path holds other data" in e["error"] for e in errors)
    assert all(str(changed) not in r["client_accuracies"] for r in document["rounds"])
    # a resume on the replaced dataset: refused before any work, the folder untouched
    killed = reference_config(grey_dataset, tmp_path / "killed", algo)
    assert isinstance(run_server(killed, kill_after=("evaluate", 2, 1))[1], ServerKilled)
    [folder] = list((tmp_path / "killed" / "results").glob("*/"))
    before = (folder / "results.json").read_bytes()
    resumed = {**killed, "resume": str(folder), "dataset-path": str(repainted),
               "results-dir": str(tmp_path / "refused")}  # fmt: skip
    grid, stopped = run_server(resumed, run_id=2)
    assert isinstance(stopped, ConfigError) and "now holds other samples" in str(stopped)
    assert not [d for d in grid.delivered if d[0] in ("train", "evaluate")]
    assert (folder / "results.json").read_bytes() == before
    # and on its own data it ends as the uninterrupted run
    assert run_server({**killed, "resume": str(folder)}, run_id=3)[1] is None
    rounds = [[(r["personal_accuracy"], r["global_accuracy"]) for r in the_run(p)["rounds"]]
              for p in (whole, tmp_path / "killed")]  # fmt: skip
    assert len(rounds[0]) == 2 and rounds[0] == rounds[1]
