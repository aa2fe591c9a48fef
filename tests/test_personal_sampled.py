"""``personal_accuracy_sampled``: the personal accuracy over the clients that have trained
at least once (an accepted training reply), beside the all-client headline figure."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from flwr.app import MessageType

from fedreg_app.core.checkpoint import Checkpoint
from fedreg_app.core.config import RunConfig
from fedreg_app.core.metrics import ResultsWriter, RoundRecord
from fedreg_app.core.partition_map import PartitionMap
from fedreg_app.core.protocol import (
    GLOBAL_CORRECT,
    METRICS,
    NUM_TEST,
    PARTITION_ID,
    PERSONAL_CORRECT,
)
from fedreg_app.round_report import round_line, sampled_accuracy, trained_in
from fedreg_tools.report_tables import paper_table
from fedreg_tools.reports import main
from fedreg_tools.run_records import collect
from strategies.fedavg import FedAvgStrategy
from tests.inprocess import ServerKilled, error_reply, results, run_server
from tests.test_reports import fake_run

#: (partition, personal correct, test samples) of four clients' evaluation replies.
EVALUATED = [(0, 8, 10), (1, 1, 10), (2, 15, 20), (3, 0, 5)]


def strategy_with(trained: list[int]) -> FedAvgStrategy:
    strategy = FedAvgStrategy(RunConfig(algo="fedavg"))
    strategy.set_partitions(PartitionMap(4, {p: 1000 + p for p in range(4)}))
    strategy.note_trained(trained)
    return strategy


def evaluate(strategy: FedAvgStrategy, evaluated=EVALUATED) -> dict[str, Any]:
    """The strategy's summary of crafted evaluation replies (as ``Message.content``)."""
    replies = [
        SimpleNamespace(content={METRICS: {PARTITION_ID: p, PERSONAL_CORRECT: c, NUM_TEST: n,
                                           GLOBAL_CORRECT: 0}})
        for p, c, n in evaluated
    ]  # fmt: skip
    return dict(strategy.aggregate_evaluate(1, replies))  # type: ignore[arg-type]


def test_sampled_figure_is_sample_weighted_over_the_clients_that_trained() -> None:
    strategy = strategy_with([0, 2])
    summary = evaluate(strategy)
    assert summary["personal-accuracy"] == pytest.approx(24 / 45)  # every client
    assert summary["personal-accuracy-sampled"] == pytest.approx((8 + 15) / (10 + 20))
    assert sampled_accuracy(summary, strategy.trained_partitions) == pytest.approx(23 / 30)


def test_no_sampled_figure_before_any_client_trained_or_with_a_trained_client_missing() -> None:
    untrained = strategy_with([])
    summary = evaluate(untrained)
    assert "personal-accuracy-sampled" not in summary
    assert sampled_accuracy(summary, untrained.trained_partitions) is None
    trained = strategy_with([0, 2])
    without_2 = evaluate(trained, [e for e in EVALUATED if e[0] != 2])
    assert sampled_accuracy(without_2, trained.trained_partitions) is None


def test_sampled_figure_equals_the_all_client_one_once_every_client_trained() -> None:
    strategy = strategy_with([0, 1, 2, 3])
    summary = evaluate(strategy)
    assert sampled_accuracy(summary, strategy.trained_partitions) == summary["personal-accuracy"]


def test_trained_clients_survive_a_checkpoint_round_trip(tmp_path: Path) -> None:
    strategy = strategy_with([3, 1])
    arrays, state = strategy.state_dict()
    config = RunConfig(algo="fedavg").to_run_config()
    Checkpoint(2, {}, arrays, state, "key", config).save(tmp_path)
    loaded, _ = Checkpoint.load(tmp_path)
    assert loaded.strategy_state["trained_partitions"] == [1, 3]
    restored = strategy_with([])
    restored.load_state_dict(loaded.strategy_arrays, loaded.strategy_state)
    assert restored.trained_partitions == {1, 3}
    assert evaluate(restored) == evaluate(strategy)


def test_an_earlier_checkpoint_without_the_set_is_rebuilt_from_the_kept_rounds() -> None:
    failed = {"phase": "train", "error": "boom", "nodes": [1003], "partitions": [3]}
    eval_failed = {"phase": "evaluate", "error": "x", "nodes": [1000], "partitions": [0]}
    records = [
        RoundRecord(1, None, None, None, 1.0, 1.0, 10, sampled_clients=[2, 3], errors=[failed]),
        RoundRecord(2, None, None, None, 1.0, 1.0, 10, sampled_clients=[0], errors=[eval_failed]),
    ]
    assert trained_in(records) == {0, 2}


def test_results_and_round_line_carry_the_sampled_figure(tmp_path: Path) -> None:
    writer = ResultsWriter(tmp_path / "run", {"algo": "fedavg"}, {"run_id": 1})
    writer.add(RoundRecord(1, 0.5, 0.6, 0.1, 1.0, 1.0, 10, personal_accuracy_sampled=0.75,
                           clients_trained=2))  # fmt: skip
    document = json.loads(writer.json_path.read_text())
    assert document["best_personal_accuracy_sampled"] == 0.75
    header, row = (tmp_path / "run" / "rounds.csv").read_text().splitlines()
    assert (
        dict(zip(header.split(","), row.split(","), strict=True))["personal_accuracy_sampled"]
        == "0.75"
    )
    assert "sampled  75.00% (2 trained)" in round_line(writer.rounds[0], 3)


def test_report_can_show_the_sampled_figure_as_p(tmp_path: Path) -> None:
    fake_run(tmp_path, "e", "fedreg", 0)
    [path] = list(tmp_path.glob("*/*/*/*/results.json"))
    document = json.loads(path.read_text())
    for record in document["rounds"]:
        record["personal_accuracy_sampled"] = 0.95
    path.write_text(json.dumps({**document, "best_personal_accuracy_sampled": 0.95}))
    assert "| fedreg | 70.00 | 90.00 | 1 |" in paper_table(collect(tmp_path))
    sampled = paper_table(collect(tmp_path), "sampled")
    assert sampled.splitlines()[0] == "| cell | e G | e P sampled | seeds |"
    assert "| fedreg | 70.00 | 95.00 | 1 |" in sampled
    assert main([str(tmp_path), "--out", str(tmp_path / "r"), "--personal", "sampled"]) == 0
    assert "95.00" in (tmp_path / "r" / "table.md").read_text()


def test_a_failed_client_does_not_count_and_a_resumed_run_reports_the_same(
    grey_dataset: Path, tmp_path: Path
) -> None:
    """Seed 5 samples partitions [2, 3] then [0, 3]; partition 3's round-1 training
    fails, so round 1's figure is partition 2's alone. Killed in round 2 (checkpoint of
    round 1) and resumed: the records equal the uninterrupted run's."""
    config = {
        "algo": "fedavg", "dataset-path": str(grey_dataset), "local-epochs": 1,
        "fraction-train": 0.5, "min-partition-size": 5, "num-server-rounds": 2, "seed": 5,
    }  # fmt: skip
    faults = {(MessageType.TRAIN, 1, 3): lambda msg, reply: error_reply(msg, "RuntimeError")}

    def run(name: str, **options: Any) -> BaseException | None:
        folder = {"results-dir": str(tmp_path / name), "state-dir": str(tmp_path / f"s{name}")}
        return run_server({**config, **folder}, faults=faults, **options)[1]

    assert run("whole") is None
    whole = results(tmp_path / "whole")["rounds"]
    assert [r["sampled_clients"] for r in whole] == [[2, 3], [0, 3]]
    assert [r["clients_trained"] for r in whole] == [1, 3]
    assert whole[0]["personal_accuracy_sampled"] == whole[0]["client_accuracies"]["2"]
    for record in whole:
        assert 0.0 <= record["personal_accuracy_sampled"] <= 1.0
    assert isinstance(run("part", run_id=2, kill_after=(MessageType.TRAIN, 2, 1)), ServerKilled)
    assert results(tmp_path / "part")["run"]["status"] == "running"  # as a SIGKILL left it
    [folder] = list((tmp_path / "part").glob("*/"))
    state = json.loads((folder / "checkpoint" / "state.json").read_text())
    assert state["round"] == 1 and state["strategy_state"]["trained_partitions"] == [2]
    config["resume"] = str(folder)
    assert run("part", run_id=3) is None
    keys = ("sampled_clients", "clients_trained", "personal_accuracy_sampled")
    resumed = results(tmp_path / "part")["rounds"]
    assert [[r[k] for k in keys] for r in resumed] == [[r[k] for k in keys] for r in whole]
