"""A client's private state on disk, versioned by round: what a restore may use, what it
discards, and what it does with files a crash or a bad disk left behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import RecordDict

from fedreg_app.client_state import MANIFEST, VersionedState, version_name
from fedreg_app.records import from_record, to_record
from tests.inprocess import results, run_server


def record(value: float) -> Any:
    return to_record({"w": np.full(3, value, dtype=np.float32)})


def value_of(state: RecordDict, name: str) -> float:
    return float(from_record(state[name])["w"][0])


def test_restore_takes_the_newest_version_up_to_the_round_and_drops_the_rest(
    tmp_path: Path,
) -> None:
    versions = VersionedState(tmp_path / "partition-0")
    for server_round in (1, 2, 3):
        state = RecordDict()
        versions.restore(state, server_round - 1)
        state["head_p"] = record(server_round)
        assert versions.commit(state, server_round)
    state = RecordDict({"head_p": record(99.0)})  # memory of a killed attempt: ignored
    restored = VersionedState(tmp_path / "partition-0").restore(state, 2)
    assert (restored.round, restored.records, restored.reset) == (2, ["head_p"], [])
    assert value_of(state, "head_p") == 2.0
    # round 3 was a killed attempt's (stale), round 1 is superseded: both are gone
    assert sorted(p.name for p in (tmp_path / "partition-0").iterdir()) == [version_name(2)]


def test_a_version_without_manifest_or_a_staging_folder_is_a_partial_write(
    tmp_path: Path,
) -> None:
    versions = VersionedState(tmp_path)
    state = RecordDict({"head_p": record(1.0)})
    versions.commit(state, 1)
    (tmp_path / version_name(2)).mkdir()  # killed before its manifest
    (tmp_path / version_name(2) / "head_p.npz").write_bytes(b"half")
    (tmp_path / ".staging-abc").mkdir()
    fresh = RecordDict()
    assert versions.restore(fresh, 5).round == 1 and value_of(fresh, "head_p") == 1.0
    assert sorted(p.name for p in tmp_path.iterdir()) == [version_name(1)]


def test_a_corrupt_record_is_moved_aside_and_starts_afresh(tmp_path: Path) -> None:
    versions = VersionedState(tmp_path)
    versions.commit(RecordDict({"head_p": record(1.0), "other": record(2.0)}), 1)
    target = tmp_path / version_name(1) / "head_p.npz"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    target.write_bytes(bytes(data))
    state = RecordDict()
    restored = versions.restore(state, 1)
    assert restored.reset == ["head_p"] and restored.records == ["other"]
    assert "head_p" not in state and value_of(state, "other") == 2.0
    assert len(list(tmp_path.glob("round-000001-head_p.npz.corrupt-*"))) == 1


def test_an_unchanged_record_is_linked_not_rewritten(tmp_path: Path) -> None:
    versions = VersionedState(tmp_path)
    versions.commit(RecordDict({"head_p": record(1.0), "fixed": record(5.0)}), 1)
    state = RecordDict()
    versions.restore(state, 1)
    assert not versions.commit(state, 2)  # nothing changed: no new version
    state["head_p"] = record(2.0)
    assert versions.commit(state, 2)
    first, second = tmp_path / version_name(1), tmp_path / version_name(2)
    assert (first / "fixed.npz").stat().st_ino == (second / "fixed.npz").stat().st_ino
    manifest = json.loads((second / MANIFEST).read_text())
    assert set(manifest["records"]) == {"head_p", "fixed"} and manifest["round"] == 2


def test_a_corrupt_private_head_is_counted_in_the_round_record(
    grey_dataset: Path, tmp_path: Path
) -> None:
    """FedReG's head_p of one client damaged on disk between two runs of a resume: the
    client starts that head afresh, and the round says so."""
    config = {
        "algo": "fedreg", "dataset-path": str(grey_dataset), "local-epochs": 1,
        "fraction-train": 0.5, "min-partition-size": 5, "seed": 5, "num-server-rounds": 1,
        "results-dir": str(tmp_path / "results"), "state-dir": str(tmp_path / "state"),
    }  # fmt: skip
    run_server(config)
    [head] = sorted((tmp_path / "state").glob("runs/*/partition-*/round-000001/head_p.npz"))[:1]
    head.write_bytes(head.read_bytes()[:40])  # truncated
    [run_folder] = list((tmp_path / "results").glob("*/"))
    _, stopped = run_server({**config, "num-server-rounds": 2, "resume": str(run_folder)},
                            run_id=2)  # fmt: skip
    assert stopped is None
    document = results(tmp_path / "results")
    assert document["rounds"][1]["state_resets"] == 1
    assert list(head.parent.parent.glob("*.corrupt-*"))


def test_released_records_leave_memory_and_come_back_from_disk(tmp_path: Path) -> None:
    """After a commit the node's records are dropped from ``context.state`` (in simulation
    Flower keeps every node's state in one process); the next restore reads them back,
    and a record nobody changed is still recognised as unchanged."""
    versions = VersionedState(tmp_path)
    state = RecordDict()
    versions.restore(state, 0)
    state["head_p"], state["fixed"] = record(1.0), record(5.0)
    assert versions.commit(state, 1)
    versions.release(state)
    assert len(state) == 0
    again = VersionedState(tmp_path)
    assert sorted(again.restore(state, 1).records) == ["fixed", "head_p"]
    assert value_of(state, "head_p") == 1.0 and value_of(state, "fixed") == 5.0
    assert not again.commit(state, 2)  # restored and untouched: no new version
    state["head_p"] = record(2.0)
    assert again.commit(state, 2)
    again.release(state)
    assert len(state) == 0 and value_of(_restored(tmp_path, 2), "head_p") == 2.0


def _restored(folder: Path, upto: int) -> RecordDict:
    state = RecordDict()
    VersionedState(folder).restore(state, upto)
    return state
