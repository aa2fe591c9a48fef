"""The environment a run's figures depend on is recorded, kept across resumes, and a
replay in another one says why it may not be bit-identical."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from fedreg_app.core.environment import (
    CODE_PACKAGES,
    NUMERIC_KEYS,
    PROJECT_ROOT,
    code_fingerprint,
    cpu_model,
    describe_environment,
    environment_note,
)
from fedreg_app.core.metrics import ResultsWriter, RoundRecord
from fedreg_app.server_app import server_device
from fedreg_tools import replay
from fedreg_tools.replay import main
from tests.inprocess import results, run_server
from tests.test_replay import refigured, round_record

HERE = describe_environment()
#: A CPU capability other than this machine's: a literal one reads as "same" on a machine
#: that reports it (on an AVX2 AMD EPYC, "AVX2" would not be another kind)
OTHER_CAPABILITY = "AVX512" if HERE["cpu_capability"] == "AVX2" else "AVX2"


def test_the_description_names_this_torch_and_cpu_kind() -> None:
    assert HERE["torch"] == torch.__version__
    assert HERE["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert set(NUMERIC_KEYS) <= set(HERE)
    assert json.loads(json.dumps(HERE)) == HERE  # goes into results.json as it is


def test_cpu_model_reads_cpuinfo_and_survives_its_absence(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU @ 2.0GHz\nflags\t: avx\n")
    assert cpu_model(cpuinfo) == "Test CPU @ 2.0GHz"
    assert cpu_model(tmp_path / "absent")  # falls back to the platform module, never raises


def test_a_note_names_each_key_that_differs_and_none_when_all_agree() -> None:
    assert environment_note(dict(HERE), HERE) is None
    assert environment_note({**HERE, "flwr": "0.0"}, HERE) is None  # not a numeric key
    note = environment_note({**HERE, "cpu_capability": OTHER_CAPABILITY, "torch": "2.13.0"}, HERE)
    assert note is not None
    assert f"cpu_capability {OTHER_CAPABILITY!r} -> {HERE['cpu_capability']!r}" in note
    assert f"torch '2.13.0' -> {HERE['torch']!r}" in note
    assert "(cpu " not in note and "; cpu " not in note  # the model name agreed
    assert "names no environment" in environment_note(None, HERE)


def test_the_code_fingerprint_follows_the_apps_sources_and_nothing_else(tmp_path: Path) -> None:
    """A copy of the app's packages has this checkout's fingerprint; files that are not
    Python source do not change it; one changed byte in a client's source does."""
    fingerprint = code_fingerprint.__wrapped__  # uncached: the files change under one path
    assert HERE["code"] == code_fingerprint() and len(HERE["code"]) == 16
    for package in CODE_PACKAGES:
        for path in (PROJECT_ROOT / package).rglob("*.py"):
            copy = tmp_path / path.relative_to(PROJECT_ROOT)
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(path.read_bytes())
    assert fingerprint(tmp_path) == HERE["code"]
    (tmp_path / "clients" / "notes.txt").write_text("not code")
    (tmp_path / "clients" / "__pycache__").mkdir(exist_ok=True)
    (tmp_path / "clients" / "__pycache__" / "fedreg.cpython-311.pyc").write_bytes(b"\0")
    assert fingerprint(tmp_path) == HERE["code"]
    source = tmp_path / "clients" / "fedreg.py"
    source.write_text(source.read_text().replace("def ", "def  ", 1))
    assert fingerprint(tmp_path) != HERE["code"]


def test_a_replay_by_other_code_says_so_and_an_older_record_is_not_judged() -> None:
    note = environment_note({**HERE, "code": "0123456789abcdef"}, HERE)
    assert note == (
        f"made by other code (code '0123456789abcdef' -> {HERE['code']!r}): figures are "
        "expected to match only where the changes since leave training and evaluation alone"
    )
    older = {k: v for k, v in HERE.items() if k != "code"}  # before records kept the code
    assert environment_note(older, HERE) is None


def test_a_resume_keeps_the_first_environment_and_records_its_own(tmp_path: Path) -> None:
    """The rounds kept from the first attempt were made in its environment: a resume on
    another machine must not relabel them, and records its own beside its round."""
    first = {**HERE, "cpu_capability": OTHER_CAPABILITY}
    writer = ResultsWriter(tmp_path / "run", {}, {"run_id": 1, "environment": first})
    writer.add(RoundRecord(1, 0.1, 0.2, 0.0, 1.0, 1.0, 10))
    resumed = ResultsWriter.resume(tmp_path / "run", {}, {"run_id": 2, "environment": HERE}, 1)
    resumed.add(RoundRecord(2, 0.1, 0.2, 0.0, 1.0, 1.0, 10))
    resumed.finish()
    run = json.loads((tmp_path / "run" / "results.json").read_text())["run"]
    assert run["environment"] == first
    assert run["resumed"][0]["environment"] == HERE and run["resumed"][0]["after_round"] == 1
    # a record from before environments were kept does not borrow the resume's
    old = ResultsWriter(tmp_path / "old", {}, {"run_id": 3})
    old.add(RoundRecord(1, 0.1, 0.2, 0.0, 1.0, 1.0, 10))
    ResultsWriter.resume(tmp_path / "old", {}, {"run_id": 4, "environment": HERE}, 1).finish()
    run = json.loads((tmp_path / "old" / "results.json").read_text())["run"]
    assert "environment" not in run and run["resumed"][0]["environment"] == HERE
    # stopped before its first round: every round is the resumed attempt's
    ResultsWriter(tmp_path / "early", {}, {"run_id": 5, "environment": first})
    ResultsWriter.resume(tmp_path / "early", {}, {"run_id": 6, "environment": HERE}, 0).finish()
    assert (
        json.loads((tmp_path / "early" / "results.json").read_text())["run"]["environment"] == HERE
    )


def write_record(path: Path, run: dict) -> Path:
    document = {
        "config": {"algo": "fedavg", "num-server-rounds": 2},
        "run": {"num_clients": 4, "status": "completed", **run},
        "rounds": [round_record(1), round_record(2)],
    }
    path.mkdir(parents=True)
    (path / "results.json").write_text(json.dumps(refigured(document)))
    return path / "results.json"


def test_replay_says_when_the_record_was_made_elsewhere(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Same rounds replayed (exit 0) in three cases: the note appears only where the
    recorded environment differs or is missing, and names the first attempt or the resume."""
    rounds = [round_record(1), round_record(2)]
    monkeypatch.setattr(replay, "run_until_round", lambda *_, **__: (rounds, {"status": "running"}))
    same = write_record(tmp_path / "same", {"environment": HERE})
    assert main([str(same), "--rounds", "2", "--out", str(tmp_path / "r1")]) == 0
    assert "environment" not in capsys.readouterr().out
    other = {**HERE, "cpu_capability": OTHER_CAPABILITY}
    elsewhere = write_record(
        tmp_path / "elsewhere",
        {"environment": HERE, "resumed": [{"run_id": 5, "after_round": 1, "environment": other}]},
    )
    assert main([str(elsewhere), "--rounds", "2", "--out", str(tmp_path / "r2")]) == 0
    printed = capsys.readouterr().out
    assert (
        "replay: note: rounds after 1: recorded in another environment (cpu_capability "
        f"{OTHER_CAPABILITY!r}" in printed
    )
    assert printed.count("another environment") == 1
    unknown = write_record(tmp_path / "unknown", {})
    assert main([str(unknown), "--rounds", "2", "--out", str(tmp_path / "r3")]) == 0
    assert "replay: note: the record names no environment" in capsys.readouterr().out


def hosts(kinds: dict[int, str]) -> dict[str, dict[str, str]]:
    """``client_hosts`` of a round: partition -> what its reply said, by CPU capability."""
    return {
        str(partition): {"hostname": "board", "torch": HERE["torch"], "cpu-capability": kind}
        for partition, kind in kinds.items()
    }


def test_replay_says_when_clients_trained_elsewhere(tmp_path: Path, capsys, monkeypatch) -> None:
    """A deployed run's devices (or a Ray cluster's machines) recorded in ``client_hosts``:
    a note names the partitions whose updates came from another CPU kind in the replayed
    rounds, none when every client ran as this machine does, and a later round's device
    is not counted for a replay of round 1."""
    rounds = [round_record(1), round_record(2)]
    monkeypatch.setattr(replay, "run_until_round", lambda *_, **__: (rounds, {"status": "running"}))
    here = HERE["cpu_capability"]

    def record(name: str, first: dict[int, str], second: dict[int, str]) -> Path:
        path = write_record(tmp_path / name, {"environment": HERE})
        document = json.loads(path.read_text())
        document["rounds"][0]["client_hosts"] = hosts(first)
        document["rounds"][1]["client_hosts"] = hosts(second)
        path.write_text(json.dumps(document))
        return path

    same = record("same", {0: here, 1: here}, {2: here, 3: "NEON"})
    assert main([str(same), "--rounds", "1", "--out", str(tmp_path / "r1")]) == 0
    assert "environment" not in capsys.readouterr().out
    assert main([str(same), "--rounds", "2", "--out", str(tmp_path / "r2")]) == 0
    printed = capsys.readouterr().out
    assert "replay: note: clients of rounds 1..2 trained in another environment" in printed
    assert "cpu-capability 'NEON' (partitions 3)" in printed
    assert here not in printed.split("another environment", 1)[1]
    # a simulation recorded elsewhere: its clients ran as its ServerApp did, one note
    simulated = record("simulated", {0: "NEON", 1: "NEON"}, {2: "NEON"})
    document = json.loads(simulated.read_text())
    document["run"]["environment"] = {**HERE, "cpu_capability": "NEON"}
    simulated.write_text(json.dumps(document))
    assert main([str(simulated), "--rounds", "2", "--out", str(tmp_path / "r3")]) == 0
    printed = capsys.readouterr().out
    assert "recorded in another environment" in printed and "clients of rounds" not in printed
    # --against: the same rounds, the clients on other kinds in the two records
    moved = record("moved", {0: "NEON", 1: here}, {2: here, 3: here})
    assert main([str(same), "--against", str(moved), "--rounds", "1"]) == 0
    printed = capsys.readouterr().out
    assert "clients of rounds 1..1 trained in other environments in the two records" in printed
    (tmp_path / "copy").mkdir()  # a file against itself is refused: against its copy
    (tmp_path / "copy" / "results.json").write_bytes(same.read_bytes())
    assert main([str(same), "--against", str(tmp_path / "copy")]) == 0
    assert "environment" not in capsys.readouterr().out
    # --against: the other record was resumed on another CPU kind after its first round
    resumed = json.loads(same.read_text())
    other = {**HERE, "cpu_capability": "NEON"}
    resumed["run"]["resumed"] = [{"run_id": 9, "after_round": 1, "environment": other}]
    (tmp_path / "resumed").mkdir()
    (tmp_path / "resumed" / "results.json").write_text(json.dumps(resumed))
    assert main([str(same), "--against", str(tmp_path / "resumed")]) == 0
    assert f"cpu_capability {here!r} -> 'NEON'" in capsys.readouterr().out


def test_a_run_records_its_environment_and_each_clients_torch_cpu_kind_and_device(
    grey_dataset: Path, tmp_path: Path
) -> None:
    """The real ServerApp and ClientApp handlers, in this process: the results file says
    where the ServerApp ran, and each trained client's reply where it ran."""
    run_config = {
        "algo": "fedavg", "dataset-path": str(grey_dataset), "local-epochs": 1,
        "fraction-train": 0.5, "min-partition-size": 5, "num-server-rounds": 1, "seed": 5,
        "results-dir": str(tmp_path / "results"),
    }  # fmt: skip
    _, stopped = run_server(run_config)
    assert stopped is None
    document = results(tmp_path / "results")
    assert document["run"]["environment"] == HERE
    [round1] = document["rounds"]
    assert len(round1["client_hosts"]) == 2
    for host in round1["client_hosts"].values():
        assert host["torch"] == torch.__version__
        assert host["cpu-capability"] == HERE["cpu_capability"]
        assert host["device"] == (HERE["cuda_device"] or "cpu")  # device "auto"


@pytest.mark.parametrize(("evaluation", "expected"), [("clients", "cpu"), ("server", "cuda")])
def test_the_serverapp_keeps_its_model_on_the_device_only_when_it_evaluates_there(
    evaluation: str, expected: str
) -> None:
    """With clients evaluating the global model, the ServerApp's model only holds arrays:
    it stays on the CPU even where the run's device is a GPU (no CUDA context in the
    ServerApp); where the ServerApp evaluates, it goes to the run's device."""
    assert server_device("cuda", evaluation).type == expected
    assert server_device("cpu", evaluation).type == "cpu"


def test_ray_workers_run_at_normal_priority_unless_the_environment_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray starts its workers at niceness 15 by default: below every process that wakes
    up during a simulation. The ClientApp's import sets 0 for the Ray a simulation process
    starts after it; an operator's own value stays."""
    from fedreg_app.core.environment import (
        RAY_WORKER_NICENESS,
        run_ray_workers_at_normal_priority,
    )

    monkeypatch.delenv(RAY_WORKER_NICENESS, raising=False)
    run_ray_workers_at_normal_priority()
    assert os.environ[RAY_WORKER_NICENESS] == "0"
    monkeypatch.setenv(RAY_WORKER_NICENESS, "10")
    run_ray_workers_at_normal_priority()
    assert os.environ[RAY_WORKER_NICENESS] == "10"
