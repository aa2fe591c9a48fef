"""``fedreg-replay``: a recorded run's first rounds, run again, give the same figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedreg_app.core.environment import describe_environment
from fedreg_app.core.figures import summarised_figures
from fedreg_app.core.metrics import BEST_OF
from fedreg_tools import replay
from fedreg_tools.experiments import main as run_experiment
from fedreg_tools.launcher import ClientResources
from fedreg_tools.overrides import declared_run_config
from fedreg_tools.replay import (
    Recording,
    compare_rounds,
    main,
    max_abs_diff,
    read_recording,
    replay_config,
    summary_line,
)
from tests.test_experiments import tiny_config

DECLARED = declared_run_config()


def round_record(number: int, g: float | None = 0.5, p: float | None = 0.6) -> dict[str, Any]:
    return {
        "round": number,
        "global_accuracy": g,
        "personal_accuracy": p,
        "personal_accuracy_answered": p,
        "client_accuracies": None if p is None else {"0": p, "1": p, "3": p},
        "sampled_clients": [0, 1],
        "num_train_examples": 40,
        "train_seconds": 1.5,
        "eval_seconds": 0.5,
    }


def results_file(tmp_path: Path, rounds: int = 3, **config: Any) -> Path:
    """A run's record of ``rounds`` rounds: ``completed`` when that is all it plans."""
    config = {"algo": "fedavg", "num-server-rounds": rounds, **config}
    finished = config["num-server-rounds"] == rounds
    document = {
        "config": config,
        "run": {"num_clients": 4, "status": "completed" if finished else "running"},
        "rounds": [round_record(n) for n in range(1, rounds + 1)],
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps(refigured(document)))
    return path


def refigured(document: dict[str, Any]) -> dict[str, Any]:
    """The run-level best figures recomputed from the rounds, as the writer states them:
    an edit made with care (a reader checks them against the rounds)."""
    for best, field in BEST_OF.items():
        present = [r[field] for r in document["rounds"] if r.get(field) is not None]
        document[best] = max(present, default=None)
    document.update(summarised_figures(document["rounds"]))
    return document


def error_of(argv: list[str], capsys) -> str:
    """The message of a command line refused before any work (exit status 2)."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


# ------------------------------------------------------------- validation
def test_a_file_that_is_not_json_or_lacks_keys_is_refused_by_name(tmp_path: Path, capsys) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert "is not JSON" in error_of([str(broken)], capsys)
    broken.write_text(json.dumps({"config": {}, "rounds": []}))
    assert "missing key(s) run" in error_of([str(broken)], capsys)
    broken.write_text(json.dumps({"config": {}, "run": {}, "rounds": []}))
    assert "config.algo is missing" in error_of([str(broken)], capsys)
    broken.write_text(json.dumps({"config": {"algo": "fedavg"}, "run": {}, "rounds": []}))
    assert "run.num_clients is None" in error_of([str(broken)], capsys)
    assert "cannot be read" in error_of([str(tmp_path / "absent.json")], capsys)


def test_a_round_record_without_a_compared_field_is_named(tmp_path: Path) -> None:
    path = results_file(tmp_path)
    document = json.loads(path.read_text())
    del document["rounds"][1]["sampled_clients"]
    path.write_text(json.dumps(document))
    with pytest.raises(replay.ConfigError, match="round 2 has no sampled_clients"):
        read_recording(path)


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        ({"global_accuracy": "0.9"}, "round 2: global_accuracy is '0.9'; expected a fraction"),
        ({"personal_accuracy": 7.5}, "round 2: personal_accuracy is 7.5"),
        ({"round": 3}, "rounds[1] is not the record of round 2"),
        ({"client_accuracies": {"0": "0.6"}}, "round 2: client_accuracies['0'] is '0.6'"),
        ({"client_accuracies": {"0": float("nan")}}, "round 2: client_accuracies['0'] is nan"),
        ({"sampled_clients": "all"}, "round 2: sampled_clients is 'all'"),
        ({"num_train_examples": -40}, "round 2: num_train_examples is -40"),
    ],
)
def test_a_record_with_a_value_out_of_range_is_refused_not_compared(
    tmp_path: Path, capsys, edit, problem
) -> None:
    """A hand-edited record compared as it stood gave `max_abs_diff=0` beside a text
    accuracy: refused before any comparison, naming the round and the key, the same check
    a report makes."""
    path = results_file(tmp_path)
    document = json.loads(path.read_text())
    document["rounds"][1].update(edit)
    path.write_text(json.dumps(document))
    (tmp_path / "other").mkdir()
    other = results_file(tmp_path / "other")
    assert problem in error_of([str(path), "--against", str(other)], capsys)
    assert problem in error_of([str(other), "--against", str(path)], capsys)


def test_a_record_in_another_seeds_or_cells_folder_is_refused_before_running(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """A record that says seed 7, or FedAvg, in ``fedreg/seed0`` was replayed as that
    other run and ended ``identical=false`` with nothing said why: refused by name, as
    a report refuses it, before anything runs."""
    monkeypatch.setattr(replay, "run_until_round", lambda *_, **__: pytest.fail("ran something"))
    seed0 = tmp_path / "e" / "fedreg" / "seed0"
    seed0.mkdir(parents=True)
    path = results_file(seed0, algo="fedreg", seed=7)
    assert "config.seed is 7 but the file lies in seed0" in error_of([str(path)], capsys)
    path = results_file(seed0, algo="fedavg", seed=0)
    assert "config.algo is 'fedavg' but the file lies in cell 'fedreg'" in error_of(
        [str(path)], capsys
    )
    monkeypatch.chdir(seed0)  # given by a relative path, from inside the seed folder
    assert "config.algo is 'fedavg'" in error_of(["results.json"], capsys)
    mine = tmp_path / "my-results" / "seed0"  # a seed<k> folder of a user's own layout
    mine.mkdir(parents=True)
    other = results_file(mine, algo="fedavg", seed=3)
    assert read_recording(other).config["seed"] == 3  # not the runner's: not judged


def test_against_the_same_file_is_refused(tmp_path: Path, capsys) -> None:
    """A record compared with itself (the same path, or a link to it) is always
    identical: refused, not reported as a reproduction."""
    path = results_file(tmp_path)
    link = tmp_path / "link.json"
    link.symlink_to(path)
    for other in (path, link):
        assert "the same file as" in error_of([str(path), "--against", str(other)], capsys)


def test_a_file_that_is_not_text_or_holds_a_bad_recorded_value_is_named(
    tmp_path: Path, capsys
) -> None:
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(b"\xff\xfe\x00garbage")
    assert f"{garbage}: is not JSON" in error_of([str(garbage), "--rounds", "1"], capsys)
    path = results_file(tmp_path, lr="fast")
    err = error_of([str(path), "--rounds", "1", "--out", str(tmp_path / "o")], capsys)
    assert f"the config recorded in {path.resolve()}: lr='fast' is not allowed" in err


@pytest.mark.parametrize("rounds", ["0", "4"])
def test_rounds_outside_the_recorded_ones_are_refused(tmp_path: Path, capsys, rounds) -> None:
    recorded = results_file(tmp_path, **{"num-server-rounds": 5})  # stopped after round 3
    err = error_of([str(recorded), "--rounds", rounds], capsys)
    assert f"--rounds={rounds} is not allowed: expected 1..3" in err
    (tmp_path / "none").mkdir()
    empty = results_file(tmp_path / "none", rounds=0, **{"num-server-rounds": 5})
    assert "records no round yet; nothing to replay" in error_of([str(empty)], capsys)
    assert "num-server-rounds=5" in err


def test_a_recorded_dataset_path_that_is_gone_asks_for_set(tmp_path: Path, capsys) -> None:
    gone = tmp_path / "fashion_mnist"
    path = results_file(tmp_path, **{"dataset-path": str(gone)})
    err = error_of([str(path), "--rounds", "1", "--out", str(tmp_path / "out")], capsys)
    assert f"dataset-path={str(gone)!r} (recorded in" in err
    assert "--set dataset-path=/path/to/fashion_mnist" in err
    assert list((tmp_path / "out").iterdir()) == []  # no work, nothing left behind


def test_only_input_locations_and_launch_keys_may_be_set(tmp_path: Path, capsys) -> None:
    err = error_of([str(results_file(tmp_path)), "--set", "lr=0.1"], capsys)
    assert "--set lr" in err and "dataset-path, init-model, cuda-graphs" in err
    # cuda-graphs: replaying an eager GPU record with graphs checks they change nothing
    recorded = results_file(tmp_path, **{"drop-last": True})
    config, _ = replay_config(read_recording(recorded), {"cuda-graphs": True},
                              tmp_path / "out", DECLARED)  # fmt: skip
    assert config["cuda-graphs"] is True
    with pytest.raises(replay.ConfigError, match="cuda-graphs=True is not allowed"):
        replay_config(read_recording(results_file(tmp_path)),  # ran before drop-last: false
                      {"cuda-graphs": True}, tmp_path / "out", DECLARED)  # fmt: skip


def test_a_key_this_app_does_not_declare_is_refused(tmp_path: Path, capsys) -> None:
    err = error_of([str(results_file(tmp_path, **{"learning-rate": 0.1}))], capsys)
    assert "learning-rate" in err and "another version of the app" in err


def test_the_replay_runs_the_recorded_config_in_fresh_folders(
    grey_dataset: Path, tmp_path: Path
) -> None:
    data = grey_dataset
    path = results_file(tmp_path, **{
        "dataset-path": "/nowhere/fashion_mnist", "state-dir": "/old/state",
        "resume": "/old/run", "results-dir": "/old", "num-server-rounds": 7,
    })  # fmt: skip
    config, notes = replay_config(read_recording(path), {"dataset-path": str(data)},
                                  tmp_path / "out", DECLARED)  # fmt: skip
    assert config["num-server-rounds"] == 7  # not shortened: schedules depend on it
    assert config["resume"] == ""
    assert config["results-dir"] == str(tmp_path / "out" / "results")
    assert config["state-dir"] == str(tmp_path / "out" / "state")
    assert config["dataset-path"] == str(data.resolve())
    assert any(n.startswith("lr is not recorded") for n in notes)
    # FedAvg's record: other algorithms' keys change nothing, and are not named
    assert not any(n.startswith(("ft-epochs", "fedreg-personal", "prox-mu")) for n in notes)


def test_the_replay_names_the_recorded_algorithms_own_keys_it_lacks(tmp_path: Path) -> None:
    path = results_file(tmp_path, algo="fedreg")
    _, notes = replay_config(read_recording(path), {}, tmp_path / "out", DECLARED)
    assert any(n.startswith("fedreg-personal is not recorded") for n in notes)
    assert not any(n.startswith("ft-epochs") for n in notes)


# ------------------------------------------------------------- comparison
def test_identical_rounds_have_no_difference() -> None:
    rounds = [round_record(1), round_record(2, g=None, p=None)]
    differences = compare_rounds(rounds, json.loads(json.dumps(rounds)), 2)
    assert differences == [] and max_abs_diff(differences) == 0.0
    line = summary_line(2, differences, 0.0, Path("/r/results.json"))
    assert line == "replay: rounds=2 identical=true max_abs_diff=0 source=/r/results.json"


def test_each_differing_field_is_named_with_its_round() -> None:
    recorded = [round_record(1), round_record(2), round_record(3)]
    replayed = [round_record(1), round_record(2, g=0.25), round_record(3)]
    replayed[2]["client_accuracies"]["10"] = 0.5
    replayed[2]["sampled_clients"] = [0, 2]
    differences = compare_rounds(recorded, replayed, 3)
    assert [(d.round, d.field) for d in differences] == [
        (2, "global_accuracy"), (3, "client_accuracies[10]"), (3, "sampled_clients"),
    ]  # fmt: skip
    assert max_abs_diff(differences) == pytest.approx(0.25)
    line = summary_line(3, differences, 0.25, Path("r.json"))
    assert "identical=false max_abs_diff=0.25 differing_rounds=2,3 source=r.json" in line


def test_a_round_evaluated_in_one_run_only_or_not_replayed_differs() -> None:
    recorded = [round_record(1, g=None, p=None), round_record(2)]
    replayed = [round_record(1)]
    differences = compare_rounds(recorded, replayed, 2)
    assert {(d.round, d.field) for d in differences} == {
        (1, "global_accuracy"), (1, "personal_accuracy"), (1, "personal_accuracy_answered"),
        (1, "client_accuracies"), (2, "round"),
    }  # fmt: skip
    assert max_abs_diff(differences) == 0.0  # nothing to subtract: the table says it
    assert compare_rounds(recorded, replayed, 1)  # round 2 is not asked for, round 1 is


def test_the_answering_clients_g_and_the_sampled_p_are_compared_where_both_record_them() -> None:
    """In a degraded round with global evaluation on the clients, G is None on both sides
    and the answering clients' G is the round's only global figure: it was not compared,
    so a replay with another aggregate there said identical=true."""
    recorded = [{**round_record(1, g=None), "global_accuracy_answered": 0.8,
                 "personal_accuracy_sampled": 0.9}]  # fmt: skip
    replayed = [{**recorded[0], "global_accuracy_answered": 0.7,
                 "personal_accuracy_sampled": 0.5}]  # fmt: skip
    differences = compare_rounds(recorded, replayed, 1)
    assert [d.field for d in differences] == [
        "global_accuracy_answered", "personal_accuracy_sampled"
    ]  # fmt: skip
    assert max_abs_diff(differences) == pytest.approx(0.4)
    older = [round_record(1, g=None)]  # a record from before these fields: not judged
    assert compare_rounds(older, replayed, 1) == []


def test_a_bit_level_difference_counts() -> None:
    recorded, replayed = [round_record(1, g=0.1 + 0.2)], [round_record(1, g=0.3)]
    [difference] = compare_rounds(recorded, replayed, 1)
    assert difference.field == "global_accuracy" and 0 < difference.abs_diff < 1e-15


# ------------------------------------------------------------------- e2e
@pytest.mark.e2e
def test_a_real_run_replays_identically_and_a_tampered_record_does_not(
    grey_dataset: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """FedReG (clients keep a private head and optimizers) on 4 clients for 3 rounds,
    recorded by fedreg-experiment; its first 2 rounds, run again, are bit-identical. The
    same replayed rounds against a copy whose round 2 global accuracy was changed: exit 1,
    that round named."""
    config = tiny_config(tmp_path, grey_dataset, algo="fedreg", rounds=3, seeds=1)
    assert run_experiment([str(config), "--out", str(tmp_path / "runs")]) == 0
    [source] = (tmp_path / "runs" / "tiny" / "fedreg" / "seed0").glob("*/results.json")
    capsys.readouterr()
    assert main([str(source), "--rounds", "2", "--out", str(tmp_path / "replay")]) == 0
    printed = capsys.readouterr().out
    assert f"replay: rounds=2 identical=true max_abs_diff=0 source={source}" in printed
    # recorded and replayed here: nothing to warn about
    assert json.loads(source.read_text())["run"]["environment"] == describe_environment()
    assert "environment" not in printed
    [replayed] = (tmp_path / "replay").glob("replay-*/results/*/results.json")
    rounds = json.loads(replayed.read_text())["rounds"]
    assert json.loads(replayed.read_text())["config"]["num-server-rounds"] == 3
    assert len(rounds) in (2, 3)  # stopped once round 2 was checkpointed

    tampered = json.loads(source.read_text())
    tampered["rounds"][1]["global_accuracy"] += 0.125
    copy = tmp_path / "tampered" / "results.json"
    copy.parent.mkdir()
    copy.write_text(json.dumps(refigured(tampered)))
    # The same machinery again would replay the same rounds: reuse them (saves a run).
    monkeypatch.setattr(replay, "run_until_round", lambda *_, **__: (rounds, {"status": "running"}))
    assert main([str(copy), "--rounds", "2", "--out", str(tmp_path / "again")]) == 1
    printed = capsys.readouterr().out
    assert "| 2 | global_accuracy |" in printed
    assert "replay: rounds=2 identical=false max_abs_diff=0.125 differing_rounds=2 " in printed
    assert printed.rstrip().endswith(f"source={copy.resolve()}")


def test_recording_is_read_from_a_run_folder(tmp_path: Path) -> None:
    path = results_file(tmp_path)
    recording = read_recording(tmp_path)
    assert isinstance(recording, Recording) and recording.path == path.resolve()
    assert recording.num_clients == 4 and len(recording.rounds) == 3


# ------------------------------------------------------------ --against
def second_file(tmp_path: Path, rounds: int = 3, **config: Any) -> Path:
    folder = tmp_path / "other"
    folder.mkdir()
    return results_file(folder, rounds=rounds, **config)


def test_against_compares_every_round_both_record_without_running(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Two recordings of one config, the second longer and written elsewhere: the rounds
    both hold are compared, nothing is run, exit 0 with the summary line."""
    monkeypatch.setattr(replay, "run_until_round", lambda *_, **__: pytest.fail("ran something"))
    first = results_file(tmp_path, rounds=3, **{"num-server-rounds": 5, "results-dir": "/a",
                                                "state-dir": "/a/s"})  # fmt: skip
    other = second_file(tmp_path, rounds=5, **{"results-dir": "/b", "resume": "/b/run"})
    assert main([str(first), "--against", str(other.parent)]) == 0
    printed = capsys.readouterr().out
    assert "| round | global first | global other |" in printed
    assert printed.count("| yes |") == 3
    assert printed.rstrip().endswith(
        f"replay: rounds=3 identical=true max_abs_diff=0 source={first.resolve()} "
        f"against={other.resolve()}"
    )


def test_against_names_the_round_and_field_that_differ(tmp_path: Path, capsys) -> None:
    first = results_file(tmp_path, rounds=3)
    other = second_file(tmp_path, rounds=3)
    document = json.loads(other.read_text())
    document["rounds"][2]["client_accuracies"]["3"] = 0.25
    other.write_text(json.dumps(document))
    assert main([str(first), "--against", str(other), "--rounds", "3"]) == 1
    printed = capsys.readouterr().out
    assert "| 3 | client_accuracies[3] | 0.6 | 0.25 | 0.35 |" in printed
    assert "identical=false max_abs_diff=0.35 differing_rounds=3 " in printed
    assert main([str(first), "--against", str(other), "--rounds", "2"]) == 0


def test_against_refuses_runs_of_different_configs_by_key(tmp_path: Path, capsys) -> None:
    first = results_file(tmp_path, seed=0, lr=0.01)
    other = second_file(tmp_path, seed=1, lr=0.01)
    err = error_of([str(first), "--against", str(other)], capsys)
    assert "configs differ (seed=0 vs 1)" in err and "lr" not in err
    # two runs apart only in how their steps were launched are one config's: compared
    first = results_file(tmp_path, **{"cuda-graphs": False})
    (tmp_path / "graphed").mkdir()
    other = results_file(tmp_path / "graphed", **{"cuda-graphs": True})
    assert main([str(first), "--against", str(other)]) == 0
    assert "identical=true" in capsys.readouterr().out


def test_against_refuses_another_number_of_clients_set_and_out(tmp_path: Path, capsys) -> None:
    first = results_file(tmp_path)
    other = second_file(tmp_path)
    document = json.loads(other.read_text())
    document["run"]["num_clients"] = 5
    other.write_text(json.dumps(document))
    err = error_of([str(first), "--against", str(other)], capsys)
    assert "run.num_clients differs: 4 in" in err
    extras = (["--set", "dataset-path=/x"], ["--out", str(tmp_path / "o")],
              ["--client-gpus", "0.5"])  # fmt: skip
    for extra in extras:
        err = error_of([str(first), "--against", str(first), *extra], capsys)
        assert "--set, --out and --client-gpus do not apply" in err


def test_against_notes_keys_only_one_run_records(tmp_path: Path, capsys) -> None:
    first = results_file(tmp_path, **{"eval-batch-size": 256})
    other = second_file(tmp_path)
    assert main([str(first), "--against", str(other)]) == 0
    assert f"replay: note: eval-batch-size is recorded only in {first.resolve()} (256)" in (
        capsys.readouterr().out
    )
    err = error_of([str(first), "--against", str(other), "--rounds", "4"], capsys)
    assert "--rounds=4 is not allowed: expected 1..3" in err
    (tmp_path / "empty").mkdir()
    empty = results_file(tmp_path / "empty", rounds=0, **{"num-server-rounds": 3})
    err = error_of([str(first), "--against", str(empty)], capsys)
    assert f"{empty.resolve()} records no round yet" in err


def test_against_notes_runs_that_read_other_data(tmp_path: Path, capsys) -> None:
    """The same config on other samples (a dataset re-encoded at its path): the rounds
    differ because of the data, and the note says so; the same digest, or a record made
    before digests were written, gives no note."""
    first, other = results_file(tmp_path), second_file(tmp_path)
    for path, digest in ((first, "a" * 64), (other, "b" * 64)):
        document = json.loads(path.read_text())
        document["run"]["data_digest"] = digest
        path.write_text(json.dumps(document))
    assert main([str(first), "--against", str(other)]) == 0
    assert "replay: note: the two runs read other data (data_digest aaaaaaaaaaaa vs " \
        "bbbbbbbbbbbb" in capsys.readouterr().out  # fmt: skip
    assert replay.data_notes({"data_digest": "a" * 64}, {"data_digest": "a" * 64}) == []
    assert replay.data_notes({}, {"data_digest": "b" * 64}) == []
    # runs begun from other init-model files (the records name the file's sha256)
    [note] = replay.data_notes({"init_model_sha256": "c" * 64}, {"init_model_sha256": "d" * 64})
    assert "other init-model files (sha256 cccccccccccc vs dddddddddddd)" in note
    assert replay.data_notes({"init_model_sha256": "c" * 64}, {}) == []


# ------------------------------------------------------------ GPU records
def with_devices(path: Path, device: str) -> Path:
    """The record's clients said they computed on ``device`` in every round."""
    document = json.loads(path.read_text())
    for record in document["rounds"]:
        record["client_hosts"] = {"0": {"torch": "2.11.0", "device": device}}
    path.write_text(json.dumps(document))
    return path


def test_a_gpu_record_replayed_on_cpus_says_how_to_replay_it_on_the_gpu(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """A record made with --client-gpus (client_hosts: "NVIDIA H200") replayed without it:
    the clients compute on the CPU here, and the note says what to add."""
    source = with_devices(results_file(tmp_path), "NVIDIA H200")
    rounds = json.loads(source.read_text())["rounds"]
    given: dict[str, Any] = {}

    def fake_run(*args: Any, **options: Any) -> tuple[list, dict]:
        given.update(options)
        return rounds, {"status": "running"}

    monkeypatch.setattr(replay, "run_until_round", fake_run)
    assert main([str(source), "--rounds", "2"]) == 0
    printed = capsys.readouterr().out
    assert "clients of rounds 1..2 computed on NVIDIA H200" in printed
    assert "add --client-gpus (e.g. 0.1)" in printed
    assert given["resources"] == ClientResources()
    # On a Ray cluster with GPUs (RAY_ADDRESS): the share reaches the simulation, no note.
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert main([str(source), "--rounds", "2", "--client-gpus", "0.25"]) == 0
    assert "computed on NVIDIA H200" not in capsys.readouterr().out
    assert given["resources"] == ClientResources(1, 0.25)


def test_client_gpus_on_a_record_made_on_cpus_is_noted(tmp_path: Path) -> None:
    recording = read_recording(with_devices(results_file(tmp_path), "cpu"))
    [note] = replay.device_notes(recording, 2, ClientResources(1, 0.5))
    assert "computed on the CPU; with --client-gpus" in note
    assert replay.device_notes(recording, 2, ClientResources()) == []
    (tmp_path / "old").mkdir()
    said_nothing = read_recording(results_file(tmp_path / "old"))  # made before `device`
    assert replay.device_notes(said_nothing, 2, ClientResources(1, 0.5)) == []


def test_replay_refuses_client_gpus_without_a_gpu_before_running(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    import torch

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(replay, "run_until_round", lambda *_, **__: pytest.fail("ran"))
    source = with_devices(results_file(tmp_path), "NVIDIA H200")
    err = error_of([str(source), "--client-gpus", "0.1"], capsys)
    assert "--client-gpus=0.1 asks for a GPU for each client" in err
    assert "--client-gpus=2.5 is not allowed" in error_of(
        [str(source), "--client-gpus", "2.5"], capsys
    )


FAILED_RUN = {"status": "failed", "error": "OSError: disk full"}


@pytest.mark.parametrize(
    ("replayed", "run", "said", "exit_code", "differing"),
    [
        ([], {}, "the replay wrote no results.json; see ", 3, "1,2"),
        ([round_record(1)], FAILED_RUN,
         "the replay ended after round 1 (failed: OSError: disk full)", 3, "2"),
        ([round_record(1, g=0.25)], FAILED_RUN, "the replay ended after round 1", 1, "1,2"),
    ],
)  # fmt: skip
def test_a_replay_that_ends_early_is_not_reported_as_a_numeric_difference(
    tmp_path: Path, capsys, monkeypatch, replayed: list, run: dict, said: str,
    exit_code: int, differing: str,
) -> None:  # fmt: skip
    """A replay whose start failed (a FAB Flower refused) does not print `identical=false
    max_abs_diff=0` and exit 1, as if its figures differed: the summary says how far it
    got (`replayed=K`) and it exits 3; a round it did replay that differs still exits 1."""
    source = results_file(tmp_path)
    monkeypatch.setattr(replay, "run_until_round", lambda *_, **__: (replayed, run))
    assert main([str(source), "--rounds", "2", "--out", str(tmp_path / "out")]) == exit_code
    captured = capsys.readouterr()
    assert said in captured.err
    line = captured.out.rstrip().splitlines()[-1]
    assert line.startswith(f"replay: rounds=2 replayed={len(replayed)} identical=false ")
    assert f"differing_rounds={differing} " in line
