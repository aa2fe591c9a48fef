"""TensorBoard event files (``tensorboard = true``): read back with
TensorBoard's own reader, they hold exactly results.json's per-round figures, also after
an interrupted run is resumed (the rounds run again replace the interrupted attempt's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedreg_app.core.config import ConfigError
from fedreg_app.core.metrics import ResultsWriter, RoundRecord
from fedreg_app.core.tensorboard_log import EVENT_FILES, SCALARS

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def events_of(run_folder: Path) -> dict[str, dict[int, float]]:
    """{tag: {round: value}} as TensorBoard reads the run's event files; a tag written
    twice for one round would show as two events, which the caller checks against."""
    reader = event_accumulator.EventAccumulator(str(run_folder))
    reader.Reload()
    scalars: dict[str, dict[int, float]] = {}
    for tag in reader.Tags()["scalars"]:
        events = reader.Scalars(tag)
        steps = [e.step for e in events]
        assert len(steps) == len(set(steps)), f"{tag}: a round written twice: {steps}"
        scalars[tag] = {e.step: e.value for e in events}
    return scalars


def assert_events_match_results(run_folder: Path) -> None:
    """Every scalar of every round in results.json is in the event files, with the same
    value (TensorBoard stores float32), and nothing else is."""
    rounds = json.loads((run_folder / "results.json").read_text())["rounds"]
    events = events_of(run_folder)
    expected: dict[str, dict[int, float]] = {}
    for record in rounds:
        for tag, field_name in SCALARS.items():
            if record[field_name] is not None:
                expected.setdefault(tag, {})[record["round"]] = float(record[field_name])
    assert set(events) == set(expected)
    for tag, values in expected.items():
        assert set(events[tag]) == set(values), tag
        for step, value in values.items():
            assert events[tag][step] == pytest.approx(value, rel=1e-6, abs=1e-7), (tag, step)


def a_round(number: int, accuracy: float | None) -> RoundRecord:
    return RoundRecord(round=number, global_accuracy=accuracy, personal_accuracy=accuracy,
                       personal_accuracy_std=0.01, train_seconds=1.5 * number,
                       eval_seconds=0.5, num_train_examples=100, bytes_to_clients=4096 * number,
                       clients_trained=number)  # fmt: skip


def test_the_events_follow_the_rounds_and_a_resume_replaces_a_round_run_again(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "run"
    writer = ResultsWriter(folder, {"tensorboard": True}, {"run_id": 1}, tensorboard=True)
    for number, accuracy in ((1, None), (2, 0.5), (3, 0.61)):  # round 1 not evaluated
        writer.add(a_round(number, accuracy))
    writer.finish()
    assert events_of(folder)["accuracy/global"] == {2: 0.5, 3: pytest.approx(0.61)}
    assert_events_match_results(folder)
    # The run was checkpointed after round 2 only: round 3 runs again, differently.
    resumed = ResultsWriter.resume(folder, {"tensorboard": True}, {"run_id": 2}, 2,
                                   tensorboard=True)  # fmt: skip
    resumed.add(a_round(3, 0.7))
    resumed.finish()
    assert events_of(folder)["accuracy/global"][3] == pytest.approx(0.7)
    assert_events_match_results(folder)


def test_without_the_key_no_event_files_are_written(tmp_path: Path) -> None:
    writer = ResultsWriter(tmp_path / "run", {}, {"run_id": 1})
    writer.add(a_round(1, 0.5))
    assert not list((tmp_path / "run").glob(EVENT_FILES))


def test_a_federated_run_writes_events_equal_to_its_results(
    grey_dataset: Path, tmp_path: Path
) -> None:
    """Through the real ServerApp and ClientApp (in this process), FedReG for 3 rounds
    with evaluation every 2: the event files equal results.json."""
    from tests.inprocess import run_server

    config: dict[str, Any] = {
        "algo": "fedreg", "dataset-path": str(grey_dataset), "local-epochs": 1,
        "fraction-train": 0.5, "min-partition-size": 5, "num-server-rounds": 3,
        "eval-every": 2, "tensorboard": True, "results-dir": str(tmp_path / "results"),
    }  # fmt: skip
    _, stopped = run_server(config)
    assert stopped is None
    [folder] = list((tmp_path / "results").glob("*/"))
    assert_events_match_results(folder)
    assert set(events_of(folder)["accuracy/personal"]) == {2, 3}


def test_events_of_a_killed_and_resumed_run_equal_its_results(
    grey_dataset: Path, tmp_path: Path
) -> None:
    """The server dies in round 3's training (as under SIGKILL); the resumed run's event
    files hold each round once, equal to results.json and to an uninterrupted run's."""
    from tests.inprocess import ServerKilled, results, run_server

    def config(where: Path, **extra: Any) -> dict[str, Any]:
        return {"algo": "fedavg", "dataset-path": str(grey_dataset), "local-epochs": 1,
                "fraction-train": 0.5, "min-partition-size": 5, "num-server-rounds": 3,
                "tensorboard": True, "results-dir": str(where / "results"),
                "state-dir": str(where / "state"), **extra}  # fmt: skip

    _, stopped = run_server(config(tmp_path / "a"), kill_after=("train", 3, 1))
    assert isinstance(stopped, ServerKilled)
    assert results(tmp_path / "a" / "results")["run"]["status"] == "running"  # as a SIGKILL left it
    [folder] = list((tmp_path / "a" / "results").glob("*/"))
    _, stopped = run_server(config(tmp_path / "a", resume=str(folder)), run_id=2)
    assert stopped is None
    assert_events_match_results(folder)
    run_server(config(tmp_path / "b"))
    [whole] = list((tmp_path / "b" / "results").glob("*/"))
    assert events_of(folder) == events_of(whole) | {
        tag: events_of(folder)[tag] for tag in events_of(folder) if tag.startswith("time/")
    }


def test_tensorboard_missing_is_a_config_error_naming_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import builtins

    from fedreg_app.core.tensorboard_log import require_tensorboard

    real_import = builtins.__import__

    def without_tensorboard(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith(("tensorboard", "torch.utils.tensorboard")):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_tensorboard)
    with pytest.raises(ConfigError, match=r"tensorboard=true needs the tensorboard package"):
        require_tensorboard()
