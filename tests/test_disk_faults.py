"""Nothing from the disk is trusted: damaged files are injected and must give either a
clear error naming the file (checkpoint, dataset) or a rebuilt cache (derived data),
never a numpy, zipfile, json or pyarrow traceback."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from clients.rebalance import _CACHE, cached_rebalanced
from fedreg_app.core import checkpoint as checkpoint_module
from fedreg_app.core.checkpoint import Checkpoint
from fedreg_app.core.config import ConfigError
from fedreg_app.core.data import (
    DataError,
    PartitionKey,
    TensorData,
    data_cache_folder,
    load_info,
    node_data,
)
from fedreg_app.core.persist import load_checked_arrays, save_arrays, save_json

RUN_CONFIG = {"algo": "fedreg", "seed": 3, "alpha": 0.1}


def checkpoint_of(server_round: int) -> Checkpoint:
    """A checkpoint whose every value depends on the round, so rounds cannot be mixed up."""
    rng = np.random.default_rng(server_round)
    return Checkpoint(
        round=server_round,
        model={"base.w": rng.normal(size=(64, 32)).astype(np.float32), "n": np.asarray(7)},
        strategy_arrays={"h.base.w": np.full(5, float(server_round), np.float32)},
        strategy_state={"rng": {"state": server_round * 10**30}, "seen": {10: 1, 2: 0.5}},
        state_key=f"key-{server_round}",
        run_config=RUN_CONFIG,
    )


def assert_same(loaded: Checkpoint, expected: Checkpoint) -> None:
    assert (loaded.round, loaded.state_key) == (expected.round, expected.state_key)
    assert loaded.strategy_state == json.loads(json.dumps(expected.strategy_state))
    assert loaded.run_config == expected.run_config
    for got, want in ((loaded.model, expected.model), (loaded.strategy_arrays,
                      expected.strategy_arrays)):  # fmt: skip
        assert got.keys() == want.keys()
        assert all(np.array_equal(got[k], want[k]) and got[k].dtype == want[k].dtype for k in got)


def clean_error(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    """The error is ours alone: no numpy/zipfile/json exception chained to it."""
    error = excinfo.value
    assert type(error) in (ConfigError, DataError)
    assert error.__cause__ is None and (error.__suppress_context__ or error.__context__ is None)
    return str(error)


def saved(run: Path, *rounds: int) -> Path:
    for server_round in rounds:
        checkpoint_of(server_round).save(run)
    [folder] = sorted((run / "checkpoint").glob("round-*"))
    return folder


# ------------------------------------------------------------------ checkpoint


def test_checkpoint_is_one_folder_per_round_and_older_rounds_go(tmp_path: Path) -> None:
    folder = saved(tmp_path, 4, 5)
    assert folder.name == "round-000005"
    assert sorted(p.name for p in folder.iterdir()) == ["model.npz", "strategy.npz"]
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == [
        "round-000005",
        "state.json",
    ]
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert state["round"] == 5 and state["folder"] == "round-000005"
    assert set(state["files"]) == {"model.npz", "strategy.npz"}
    loaded, run = Checkpoint.load(tmp_path / "checkpoint")
    assert run == tmp_path.resolve()
    assert_same(loaded, checkpoint_of(5))


def test_truncated_model_is_an_error_naming_it(tmp_path: Path) -> None:
    model = saved(tmp_path, 2) / "model.npz"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    with pytest.raises(ConfigError, match=r"model\.npz has \d+ bytes.*truncated") as excinfo:
        Checkpoint.load(tmp_path)
    message = clean_error(excinfo)
    assert str(model.resolve()) in message and "start the run anew" in message


def test_flipped_bytes_in_the_model_fail_its_hash(tmp_path: Path) -> None:
    model = saved(tmp_path, 2) / "model.npz"
    raw = bytearray(model.read_bytes())
    for i in range(len(raw) // 2, len(raw) // 2 + 40, 4):
        raw[i] ^= 0xFF
    model.write_bytes(bytes(raw))  # same size: only the hash can tell
    with pytest.raises(ConfigError, match=r"model\.npz does not match the sha256") as excinfo:
        Checkpoint.load(tmp_path)
    clean_error(excinfo)


def test_missing_round_file_is_an_error_naming_it(tmp_path: Path) -> None:
    (saved(tmp_path, 2) / "strategy.npz").unlink()
    with pytest.raises(ConfigError, match=r"strategy\.npz is missing") as excinfo:
        Checkpoint.load(tmp_path)
    clean_error(excinfo)


def test_missing_commit_record_with_round_folders_is_an_error(tmp_path: Path) -> None:
    saved(tmp_path, 2)
    (tmp_path / "checkpoint" / "state.json").unlink()
    with pytest.raises(ConfigError, match=r"no complete checkpoint.*state\.json is missing"):
        Checkpoint.load(tmp_path)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda text: text[: len(text) // 2], "not valid JSON"),
        (lambda text: "\x00garbage\xff", "not valid JSON"),
        (lambda text: "[1, 2]", "not a JSON object"),
        (lambda text: text.replace('"round": 2', '"round": 3'), "does not match its sha256"),
    ],
)
def test_damaged_commit_record_is_an_error_naming_it(
    tmp_path: Path, damage: Callable[[str], str], problem: str
) -> None:
    saved(tmp_path, 2)
    state = tmp_path / "checkpoint" / "state.json"
    state.write_text(damage(state.read_text()))
    with pytest.raises(ConfigError, match=rf"state\.json .*{problem}") as excinfo:
        Checkpoint.load(tmp_path)
    assert str(state.resolve()) in clean_error(excinfo)


def test_commit_record_cannot_lead_out_of_the_checkpoint(tmp_path: Path) -> None:
    saved(tmp_path, 2)
    state_path = tmp_path / "checkpoint" / "state.json"
    state = json.loads(state_path.read_text())
    state["folder"] = "../../elsewhere"
    body = {k: v for k, v in state.items() if k != "sha256"}
    save_json(state_path, {**body, "sha256": checkpoint_module._body_hash(body)})
    with pytest.raises(ConfigError, match="names no valid round folder"):
        Checkpoint.load(tmp_path)


class Killed(BaseException):
    """A process killed mid-save: nothing after this point runs, no cleanup either."""


@pytest.mark.parametrize("killed_at", ["strategy.npz", "state.json"])
def test_a_save_killed_midway_leaves_the_previous_round_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, killed_at: str
) -> None:
    saved(tmp_path, 4)
    write_npz, commit = checkpoint_module._write_npz, checkpoint_module.save_json

    def write_until_killed(path: Path, arrays: Mapping[str, np.ndarray]) -> dict:
        if path.name == killed_at:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"PK\x03\x04 half")  # a torn write, as a kill leaves it
            raise Killed
        return write_npz(path, arrays)

    def commit_killed(path: Path, document: object) -> None:
        raise Killed

    monkeypatch.setattr(checkpoint_module, "_write_npz", write_until_killed)
    if killed_at == "state.json":
        monkeypatch.setattr(checkpoint_module, "save_json", commit_killed)
    with pytest.raises(Killed):
        checkpoint_of(5).save(tmp_path)
    assert (tmp_path / "checkpoint" / "round-000005" / "model.npz").is_file()  # half-written
    loaded, _ = Checkpoint.load(tmp_path)
    assert_same(loaded, checkpoint_of(4))  # exactly the previous round

    monkeypatch.setattr(checkpoint_module, "_write_npz", write_npz)
    monkeypatch.setattr(checkpoint_module, "save_json", commit)
    checkpoint_of(5).save(tmp_path)  # the resumed run saves round 5 again
    assert_same(Checkpoint.load(tmp_path)[0], checkpoint_of(5))
    assert [p.name for p in (tmp_path / "checkpoint").glob("round-*")] == ["round-000005"]


def test_saving_the_committed_round_again_never_writes_into_it(tmp_path: Path) -> None:
    saved(tmp_path, 3)
    again = checkpoint_of(3)
    again.state_key = "second"
    again.save(tmp_path)
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert state["folder"] == "round-000003-2"
    assert Checkpoint.load(tmp_path)[0].state_key == "second"


def write_flat_checkpoint(run: Path, checkpoint: Checkpoint) -> Path:
    """The layout of the previous version: three files side by side, no hashes."""
    folder = run / "checkpoint"
    save_arrays(folder / "model.npz", checkpoint.model)
    save_arrays(folder / "strategy.npz", checkpoint.strategy_arrays)
    save_json(folder / "state.json", {
        "round": checkpoint.round, "strategy_state": checkpoint.strategy_state,
        "state_key": checkpoint.state_key, "run_config": checkpoint.run_config,
    })  # fmt: skip
    return folder


def test_flat_checkpoint_of_the_previous_version_still_resumes(tmp_path: Path) -> None:
    folder = write_flat_checkpoint(tmp_path, checkpoint_of(6))
    assert_same(Checkpoint.load(tmp_path)[0], checkpoint_of(6))
    checkpoint_of(7).save(tmp_path)  # the resumed run writes the new layout
    assert sorted(p.name for p in folder.iterdir()) == ["round-000007", "state.json"]
    assert_same(Checkpoint.load(tmp_path)[0], checkpoint_of(7))


@pytest.mark.parametrize("round_", [-1, 0, True, "3"])
def test_a_commit_record_of_no_real_round_is_refused_in_either_layout(
    tmp_path: Path, round_: Any
) -> None:
    """A state.json without `format` (the flat layout of earlier versions, which has no
    hashes) accepted `round: -1`; a resume then "continued" after round -1. In the
    current layout the record's hash is made to match, so that the round itself is what
    is refused (a changed round with the old hash is refused as damaged, below)."""
    for layout in ("flat", "current"):
        folder = tmp_path / layout
        if layout == "flat":
            state_json = write_flat_checkpoint(folder, checkpoint_of(6)) / "state.json"
        else:
            checkpoint_of(6).save(folder)
            state_json = folder / "checkpoint" / "state.json"
        state = json.loads(state_json.read_text())
        state["round"] = round_
        if layout == "current":
            body = {k: v for k, v in state.items() if k != "sha256"}
            state["sha256"] = checkpoint_module._body_hash(body)
        state_json.write_text(json.dumps(state))
        with pytest.raises(ConfigError, match="has no valid 'round'"):
            Checkpoint.load(folder)


def test_a_commit_record_whose_round_was_changed_without_its_hash_is_refused(
    tmp_path: Path,
) -> None:
    checkpoint_of(6).save(tmp_path)
    state_json = tmp_path / "checkpoint" / "state.json"
    state = json.loads(state_json.read_text())
    state_json.write_text(json.dumps({**state, "round": 5}))
    with pytest.raises(ConfigError, match="does not match"):
        Checkpoint.load(tmp_path)


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_flat_checkpoint_is_an_error_naming_the_file(tmp_path: Path, damage: str) -> None:
    model = write_flat_checkpoint(tmp_path, checkpoint_of(6)) / "model.npz"
    raw = bytearray(model.read_bytes())
    if damage == "truncate":
        raw = raw[: len(raw) // 2]
    else:  # inside the array data: only the zip CRC can tell
        raw[len(raw) // 2] ^= 0xFF
    model.write_bytes(bytes(raw))
    with pytest.raises(ConfigError, match=r"model\.npz (is not a readable|has a damaged)") as info:
        Checkpoint.load(tmp_path)
    assert str(model.resolve()) in clean_error(info)


# ------------------------------------------------------------------ dataset files


def key_of(folder: Path) -> PartitionKey:
    return PartitionKey("fake", str(folder.resolve()), 3, 1.0, 0, 5)


def damaged_copy(dataset: Path, tmp_path: Path, split: str, damage: str) -> Path:
    folder = tmp_path / "dataset"
    shutil.copytree(dataset, folder)
    path = folder / f"{split}.parquet"
    raw = bytearray(path.read_bytes())
    if damage == "garbage":
        raw = bytearray(b"this is not parquet\n" * 50)
    elif damage == "truncate":
        raw = raw[: len(raw) // 2]
    else:  # pages damaged, footer intact
        for i in range(len(raw) // 3, len(raw) // 3 + 2000, 7):
            raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))
    return folder


@pytest.mark.parametrize(
    ("split", "damage"), [("train", "garbage"), ("test", "truncate"), ("train", "pages")]
)
def test_damaged_parquet_is_an_error_naming_the_file(
    grey_dataset: Path, tmp_path: Path, split: str, damage: str
) -> None:
    folder = damaged_copy(grey_dataset, tmp_path, split, damage)
    with pytest.raises(DataError, match="not a readable parquet file") as excinfo:
        load_info(key_of(folder))
    message = clean_error(excinfo)
    assert str((folder / f"{split}.parquet").resolve()) in message
    assert "re-download or re-convert it" in message and "Datasets" in message


# ------------------------------------------------------------------ derived caches


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage", [truncate, flip])
def test_damaged_partition_cache_is_moved_aside_and_rebuilt(
    grey_dataset: Path,
    tmp_path: Path,
    damage: Callable[[Path], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    key = key_of(grey_dataset)
    cache = data_cache_folder(tmp_path, key)
    info, first = node_data(key, 1, cache)
    damage(cache / "partition-1.npz")
    (cache / "info.json").write_text('{"num_classes": ')

    info_again, again = node_data(key, 1, cache)
    assert info_again == info
    for got, want in ((again.train, first.train), (again.test, first.test)):
        assert torch.equal(got.x, want.x) and torch.equal(got.y, want.y)
    assert len(list(cache.glob("partition-1.npz.corrupt-*"))) == 1
    assert len(list(cache.glob("info.json.corrupt-*"))) == 1
    rebuilt = load_checked_arrays(cache / "partition-1.npz")  # whole again on disk
    assert np.array_equal(rebuilt["train_x"], first.train.x.numpy())
    assert "partition-1.npz is damaged" in caplog.text and "rebuilding" in caplog.text


def test_partition_cache_with_wrong_arrays_is_rebuilt(grey_dataset: Path, tmp_path: Path) -> None:
    key = key_of(grey_dataset)
    cache = data_cache_folder(tmp_path, key)
    _, first = node_data(key, 0, cache)
    save_arrays(cache / "partition-0.npz", {"train_x": np.zeros(3)})  # readable, but wrong
    _, again = node_data(key, 0, cache)
    assert torch.equal(again.train.x, first.train.x)
    assert list(cache.glob("partition-0.npz.corrupt-*"))


def images(counts: list[int], seed: int = 0) -> TensorData:
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(counts)), counts)
    x = rng.integers(0, 255, size=(labels.size, 1, 12, 12), dtype=np.uint8)
    return TensorData(torch.from_numpy(x), torch.from_numpy(labels.astype(np.int64)))


@pytest.mark.parametrize("damage", [truncate, flip])
def test_damaged_rebalanced_cache_is_moved_aside_and_rebuilt(
    tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    train = images([20, 3, 0, 7])
    path = tmp_path / "state" / "rebalanced-0.npz"
    built = cached_rebalanced(train, 4, "mean", "simple", 5, disk=path)
    damage(path)
    _CACHE.clear()  # a new process
    again = cached_rebalanced(train, 4, "mean", "simple", 5, disk=path)
    assert again is not built
    assert torch.equal(again.data.x, built.data.x) and torch.equal(again.data.y, built.data.y)
    assert torch.equal(again.augmented, built.augmented)
    assert (again.threshold, again.effective_samples) == (built.threshold, built.effective_samples)
    assert len(list(path.parent.glob("rebalanced-0.npz.corrupt-*"))) == 1
    _CACHE.clear()
    from_disk = cached_rebalanced(train, 4, "mean", "simple", 5, disk=path)  # rewritten whole
    assert torch.equal(from_disk.data.x, built.data.x)
    assert len(list(path.parent.glob("*.corrupt-*"))) == 1


def test_a_resume_removes_the_temporary_files_of_writes_its_killed_process_left(
    tmp_path: Path,
) -> None:
    """``write_atomic``'s temporary files, left by a SIGKILL mid-write (see
    ``test_experiments.py::test_a_run_sigkilled_while_writing…``), are deleted when the
    run folder is resumed under its lock; the files of the run are kept."""
    from fedreg_app.core.persist import remove_leftover_temporaries

    checkpoint_of(6).save(tmp_path)
    kept = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    left = [tmp_path / ".results.json.k2x9_q.tmp",
            next(tmp_path.glob("checkpoint/round-*")) / ".model.npz.a81hf0.tmp"]  # fmt: skip
    for path in left:
        path.write_bytes(b'{"run": ')
    (tmp_path / "notes.tmp").write_text("a user's file")  # not a name write_atomic makes
    assert sorted(remove_leftover_temporaries(tmp_path)) == sorted(left)
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == sorted(
        [*kept, tmp_path / "notes.tmp"]
    )
    assert_same(Checkpoint.load(tmp_path)[0], checkpoint_of(6))


def test_a_non_finite_number_is_written_as_null_with_a_warning_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """JSON has no NaN or Infinity: a round whose costs hold them (a clock gone wrong) is
    written as strict JSON, each such number null and named in a warning, so that strict
    readers (browsers, jq) still read results.json."""
    import logging
    import math

    from fedreg_app.core.metrics import ResultsWriter, RoundRecord

    writer = ResultsWriter(tmp_path / "run", {"algo": "fedavg"}, {"run_id": 1})
    record = RoundRecord(1, 0.5, math.nan, None, math.inf, -math.inf, 30)
    record.client_accuracies = {"0": 0.5, "1": math.nan}
    with caplog.at_level(logging.WARNING):
        writer.add(record)

    def no_constants(token: str) -> None:
        raise AssertionError(f"{token} in results.json")

    document = json.loads(writer.json_path.read_text(), parse_constant=no_constants)
    [round_1] = document["rounds"]
    assert (round_1["personal_accuracy"], round_1["train_seconds"], round_1["eval_seconds"]) == (
        None, None, None)  # fmt: skip
    assert round_1["client_accuracies"] == {"0": 0.5, "1": None}
    assert round_1["global_accuracy"] == 0.5 and round_1["num_train_examples"] == 30
    warned = caplog.text
    for where in ("rounds[0].personal_accuracy", "rounds[0].train_seconds",
                  "rounds[0].client_accuracies.1"):  # fmt: skip
        assert f"{where} is" in warned, warned


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


def _lead_out(path: Path) -> None:
    state = json.loads(path.read_text())
    body = {k: v for k, v in state.items() if k != "sha256"} | {"folder": "../../elsewhere"}
    save_json(path, {**body, "sha256": checkpoint_module._body_hash(body)})


@pytest.mark.parametrize(
    ("damaged", "damage"),
    [
        ("round/model.npz", _truncate),
        ("round/model.npz", _flip),
        ("round/strategy.npz", Path.unlink),
        ("state.json", Path.unlink),
        ("state.json", lambda p: p.write_text("\x00garbage\xff")),
        ("state.json", lambda p: p.write_text(p.read_text().replace('"round": 2', '"round": 3'))),
        ("state.json", _lead_out),
    ],
)
def test_a_damaged_checkpoint_is_refused_naming_the_file_and_what_to_do_untouched(
    tmp_path: Path, damaged: str, damage: Callable[[Path], None]
) -> None:
    """Whatever the damage, the resume is refused with a message that names the damaged
    file and says what to do, and the run folder is left byte for byte as it was."""
    round_folder = saved(tmp_path, 2)
    path = (round_folder / damaged.removeprefix("round/") if damaged.startswith("round/")
            else tmp_path / "checkpoint" / damaged)  # fmt: skip
    damage(path)
    before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    with pytest.raises(ConfigError) as excinfo:
        Checkpoint.load(tmp_path)
    message = clean_error(excinfo)
    assert str(path.resolve()) in message, message
    assert "start the run anew" in message, message
    assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == before


def test_a_rebalanced_set_built_for_other_data_or_parameters_is_not_used(tmp_path: Path) -> None:
    """A stored set checked for damage only would let two partitions' files swapped (or a
    copy from another node) be read as each client's own, and FedReG would train its
    global head on the other client's samples while still declaring its own e_k. Each
    file names what it was built from; another train split, other parameters, or a file of an
    earlier version without that name, is moved aside and the set is built again."""
    mine, theirs = images([20, 3, 0, 7]), images([5, 9, 9, 1], seed=1)
    folder = tmp_path / "state"
    built = cached_rebalanced(mine, 4, "mean", "simple", 5, disk=folder / "rebalanced-0.npz")
    cached_rebalanced(theirs, 4, "mean", "simple", 5, disk=folder / "rebalanced-1.npz")
    (folder / "rebalanced-0.npz").rename(folder / "swap.npz")
    (folder / "rebalanced-1.npz").rename(folder / "rebalanced-0.npz")
    _CACHE.clear()  # a new process
    again = cached_rebalanced(mine, 4, "mean", "simple", 5, disk=folder / "rebalanced-0.npz")
    assert torch.equal(again.data.x, built.data.x) and torch.equal(again.data.y, built.data.y)
    assert again.effective_samples == built.effective_samples
    assert len(list(folder.glob("rebalanced-0.npz.corrupt-*"))) == 1
    _CACHE.clear()
    other_seed = cached_rebalanced(mine, 4, "mean", "simple", 6, disk=folder / "rebalanced-0.npz")
    assert len(list(folder.glob("rebalanced-0.npz.corrupt-*"))) == 2  # another seed's file
    assert not torch.equal(other_seed.data.x, built.data.x)
    arrays = dict(np.load(folder / "rebalanced-0.npz"))
    np.savez(folder / "rebalanced-0.npz", **{k: v for k, v in arrays.items() if k != "identity"})
    _CACHE.clear()  # a file of an earlier version, which named nothing
    cached_rebalanced(mine, 4, "mean", "simple", 6, disk=folder / "rebalanced-0.npz")
    assert len(list(folder.glob("rebalanced-0.npz.corrupt-*"))) == 3


def test_records_get_the_mode_open_would_give_them_and_private_state_stays_private(
    tmp_path: Path,
) -> None:
    """Records get the umask's mode, not ``mkstemp``'s 0600 (readable by their owner
    alone), so a colleague on a shared machine can read the results; clients' state and
    checkpoints stay their owner's."""
    import os

    from fedreg_app.core.metrics import ResultsWriter
    from fedreg_app.core.persist import file_creation_mask

    previous = os.umask(0o027)
    try:
        assert file_creation_mask() == 0o027
        writer = ResultsWriter(tmp_path / "run", {"algo": "fedavg"}, {"num_clients": 2})
        (tmp_path / "plain.json").write_text("{}")
        save_json(tmp_path / "state.json", {"private": 1})
    finally:
        os.umask(previous)
    mode = writer.json_path.stat().st_mode & 0o777
    assert mode == 0o640 == (tmp_path / "plain.json").stat().st_mode & 0o777
    assert (tmp_path / "state.json").stat().st_mode & 0o777 == 0o600
