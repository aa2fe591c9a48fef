"""State that outlives a process: node state and data caches on disk, the server's
checkpoint and resume, sampling when devices drop out."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from clients.rebalance import _CACHE, cached_rebalanced
from fedreg_app.core import data as data_module
from fedreg_app.core.checkpoint import Checkpoint, clients_record
from fedreg_app.core.config import ConfigError, RunConfig
from fedreg_app.core.data import PartitionKey, data_cache_folder, node_data
from fedreg_app.core.metrics import (
    ResultsWriter,
    RoundRecord,
    kept_rounds_problem,
    mark_stopped,
    relayout_results,
)
from fedreg_app.core.partition_map import PartitionMap
from fedreg_app.core.persist import (
    RUN_FOLDER_LOCK,
    FolderInUseError,
    UnsafeLockError,
    folder_holder,
    hold_folder,
    load_arrays,
    release_folder,
    save_arrays,
)
from fedreg_app.registry import load_config
from fedreg_tools.runner_session import RUNNER_LOCK, exclusive_out
from strategies.fedavg import FedAvgStrategy
from strategies.feddyn import FedDynStrategy
from tests.test_clients import tensors


def test_arrays_round_trip_and_pickles_are_refused(tmp_path: Path) -> None:
    arrays = {"base.0.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.asarray(3)}
    save_arrays(tmp_path / "a.npz", arrays)
    loaded = load_arrays(tmp_path / "a.npz")
    assert loaded.keys() == arrays.keys() and all(
        np.array_equal(loaded[k], arrays[k]) for k in arrays
    )
    np.savez(tmp_path / "evil.npz", x=np.array([{"code": 1}], dtype=object))
    with pytest.raises(ValueError, match="allow_pickle"):
        load_arrays(tmp_path / "evil.npz")
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary file left behind


def test_node_data_is_decoded_once_then_read_from_disk(
    grey_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config({"dataset-path": str(grey_dataset), "min-partition-size": 5})
    key = PartitionKey.from_config(config, 3)
    cache = data_cache_folder(tmp_path, key)
    info, first = node_data(key, 1, cache)

    def no_decoding(*args):
        raise AssertionError("decoded again")

    monkeypatch.setattr(data_module, "load_client_data", no_decoding)
    monkeypatch.setattr(data_module, "load_info", no_decoding)
    info_again, again = node_data(key, 1, cache)
    assert info_again == info
    assert torch.equal(again.train.x, first.train.x) and torch.equal(again.test.y, first.test.y)
    other = PartitionKey.from_config(load_config({**config.given, "seed": 1}), 3)
    assert data_cache_folder(tmp_path, other) != cache  # another partitioning, another folder


def test_rebalanced_set_is_reused_from_disk(tmp_path: Path) -> None:
    train = tensors([30, 4, 0, 9], seed=1)
    path = tmp_path / "rebalanced.npz"
    built = cached_rebalanced(train, 4, "mean", "simple", 5, disk=path)
    _CACHE.clear()  # a new process
    loaded = cached_rebalanced(train, 4, "mean", "simple", 5, disk=path)
    assert loaded is not built and torch.equal(loaded.data.x, built.data.x)
    assert torch.equal(loaded.augmented, built.augmented)
    assert (loaded.threshold, loaded.effective_samples) == (
        built.threshold,
        built.effective_samples,
    )


def test_sampling_continues_identically_after_a_checkpoint(tmp_path: Path) -> None:
    config = RunConfig(seed=3, fraction_train=0.3)
    uninterrupted = FedAvgStrategy(config)
    uninterrupted.set_partitions(PartitionMap(10, {p: p for p in range(10)}))
    expected = [uninterrupted.sample_partitions(0) for _ in range(4)]

    first = FedAvgStrategy(config)
    first.set_partitions(PartitionMap(10, {p: p for p in range(10)}))
    done = [first.sample_partitions(0) for _ in range(2)]
    arrays, state = first.state_dict()
    state = json.loads(json.dumps(state))  # as stored in state.json
    resumed = FedAvgStrategy(config)
    resumed.set_partitions(PartitionMap(10, {p: p for p in range(10)}))
    resumed.load_state_dict(arrays, state)
    assert done + [resumed.sample_partitions(0) for _ in range(2)] == expected


def test_sampling_skips_partitions_whose_node_is_gone() -> None:
    strategy = FedAvgStrategy(RunConfig(seed=0, fraction_train=0.5))
    partitions = PartitionMap(6, {p: 100 + p for p in range(6)})
    strategy.set_partitions(partitions)
    assert partitions.forget_gone([100, 101, 103, 105]) == [(2, 102), (4, 104)]
    for _ in range(20):
        sampled = strategy.sample_partitions(0)
        assert len(sampled) == 3 and not {2, 4} & set(sampled)
    partitions.assign(2, 999)  # the device came back with a new node id
    assert any(2 in strategy.sample_partitions(0) for _ in range(20))


def test_feddyn_state_survives_a_checkpoint(tmp_path: Path) -> None:
    strategy = FedDynStrategy(RunConfig(algo="feddyn"))
    strategy.h = {"base.w": np.array([0.5, -1.0], np.float32)}
    arrays, state = strategy.state_dict()
    checkpoint = Checkpoint(4, {"base.w": np.zeros(2, np.float32)}, arrays, state, "key",
                            RunConfig(algo="feddyn").to_run_config())  # fmt: skip
    checkpoint.save(tmp_path)
    loaded, run_folder = Checkpoint.load(tmp_path)
    assert run_folder == tmp_path.resolve() and loaded.round == 4 and loaded.state_key == "key"
    restored = FedDynStrategy(RunConfig(algo="feddyn"))
    restored.load_state_dict(loaded.strategy_arrays, loaded.strategy_state)
    assert np.array_equal(restored.h["base.w"], strategy.h["base.w"])


def test_resume_must_be_the_same_experiment(tmp_path: Path) -> None:
    made_with = RunConfig(algo="fedreg", alpha=0.1, num_server_rounds=5)
    checkpoint = Checkpoint(3, {}, {}, {}, "k", made_with.to_run_config())
    checkpoint.check_compatible(RunConfig(algo="fedreg", alpha=0.1, num_server_rounds=8))
    with pytest.raises(ConfigError, match="alpha=0.5 is not allowed.*alpha=0.1"):
        checkpoint.check_compatible(RunConfig(algo="fedreg", alpha=0.5, num_server_rounds=8))
    # as many rounds as the checkpoint holds: killed after its last round, the resume
    # only completes the run; fewer cannot be what the checkpoint was made for
    checkpoint.check_compatible(RunConfig(algo="fedreg", alpha=0.1, num_server_rounds=3))
    with pytest.raises(ConfigError, match="rounds=2 is not allowed.*round 3; expected at least"):
        checkpoint.check_compatible(RunConfig(algo="fedreg", alpha=0.1, num_server_rounds=2))
    with pytest.raises(ConfigError, match="no checkpoint"):
        Checkpoint.load(tmp_path / "nowhere")


@pytest.mark.parametrize(
    "clients",
    [
        {"num_clients": 2, "split_sizes": [[3, 1]]},  # one partition's sizes for two
        {"num_clients": 0, "split_sizes": None},
        {"num_clients": 1, "split_sizes": [[3, -1]]},
        {"num_clients": 2, "split_sizes": None, "split_digests": ["a" * 64]},  # one for two
        {"num_clients": 1, "split_sizes": None, "split_digests": ["A" * 64]},  # not hex
        {"num_clients": 1, "split_sizes": None, "split_digests": [1]},
        "4",
    ],
)
def test_a_checkpoint_whose_clients_record_is_malformed_is_refused(
    tmp_path: Path, clients: Any
) -> None:
    """state.json is hashed, but a hash recomputed over an edited body still matches: the
    clients record is checked for shape, so the resume's comparison never reads garbage."""
    config = RunConfig(algo="fedavg").to_run_config()
    Checkpoint(3, {}, {}, {}, "k", config, clients).save(tmp_path)
    with pytest.raises(ConfigError, match="has no valid 'clients' record"):
        Checkpoint.load(tmp_path)


def test_a_checkpoint_names_the_partition_whose_data_changed(tmp_path: Path) -> None:
    config = RunConfig(algo="fedavg").to_run_config()
    made = clients_record(3, {0: (30, 10), 1: (45, 15), 2: (9, 3)})
    Checkpoint(3, {}, {}, {}, "k", config, made).save(tmp_path)
    loaded, _ = Checkpoint.load(tmp_path)
    loaded.check_clients(3, {0: (30, 10), 1: (45, 15), 2: (9, 3)})
    loaded.check_clients(3, {})  # a reference algorithm knows no splits
    loaded.check_clients(3)  # the count alone, right after discovery
    with pytest.raises(ConfigError, match=r"partition 1 now has .* \(44, 15\), .* \(45, 15\)"):
        loaded.check_clients(3, {0: (30, 10), 1: (44, 15), 2: (9, 3)})
    with pytest.raises(ConfigError, match="2 clients .* made with 3"):
        loaded.check_clients(2, {0: (30, 10), 1: (45, 15)})


def test_a_checkpoint_names_the_partition_whose_samples_changed_at_the_same_sizes(
    tmp_path: Path,
) -> None:
    """Sizes alone miss data replaced by others of the same sizes (a JPEG copy of a PNG
    dataset, a corrected file): the content digests tell, and name the partition."""
    config = RunConfig(algo="fedavg").to_run_config()
    sizes = {0: (30, 10), 1: (45, 15)}
    digests = {0: "0" * 64, 1: "1" * 64}
    Checkpoint(3, {}, {}, {}, "k", config, clients_record(2, sizes, digests)).save(tmp_path)
    loaded, _ = Checkpoint.load(tmp_path)
    assert loaded.clients is not None and loaded.clients["split_digests"] == ["0" * 64, "1" * 64]
    loaded.check_clients(2, sizes, digests)
    loaded.check_clients(2, sizes)  # a reference algorithm: no digests to compare
    with pytest.raises(ConfigError, match="partition 1 now holds other samples .* 222222222222 "
                       "instead of 111111111111"):  # fmt: skip
        loaded.check_clients(2, sizes, {0: "0" * 64, 1: "2" * 64})
    earlier = clients_record(2, sizes)  # a checkpoint made before digests were recorded
    assert earlier["split_digests"] is None
    Checkpoint(3, {}, {}, {}, "k", config, earlier).save(tmp_path)
    Checkpoint.load(tmp_path)[0].check_clients(2, sizes, {0: "0" * 64, 1: "2" * 64})
    other_scheme = {**clients_record(2, sizes, digests), "digest_scheme": 0}
    Checkpoint(3, {}, {}, {}, "k", config, other_scheme).save(tmp_path)  # not comparable
    Checkpoint.load(tmp_path)[0].check_clients(2, sizes, {0: "0" * 64, 1: "2" * 64})


def test_resumed_results_keep_the_history_up_to_the_checkpoint(tmp_path: Path) -> None:
    writer = ResultsWriter(tmp_path / "run", {"algo": "fedreg"}, {"run_id": 7})
    for k in (1, 2, 3):
        writer.add(RoundRecord(k, 0.1 * k, 0.2 * k, 0.0, 1.0, 1.0, 10))
    writer.finish("failed")
    resumed = ResultsWriter.resume(tmp_path / "run", {"algo": "fedreg"}, {"run_id": 9}, 2)
    assert [r.round for r in resumed.rounds] == [1, 2]  # round 3 had no checkpoint yet
    on_disk = json.loads((tmp_path / "run" / "results.json").read_text())["run"]
    assert resumed.run["status"] == "running", on_disk
    assert "error" not in resumed.run and "finished" not in resumed.run, on_disk
    resumed.add(RoundRecord(3, 0.5, 0.6, 0.0, 1.0, 1.0, 10))
    resumed.finish()
    document = json.loads((tmp_path / "run" / "results.json").read_text())
    assert document["run"]["status"] == "completed" and document["run"]["run_id"] == 7
    assert "error" not in document["run"]  # the interrupted attempt's error is not this one's
    assert document["run"]["resumed"][0]["after_round"] == 2
    assert [r["global_accuracy"] for r in document["rounds"]] == pytest.approx([0.1, 0.2, 0.5])


def test_a_stopped_run_says_so_keeps_its_rounds_and_resumes_to_completed(
    tmp_path: Path,
) -> None:
    """The runner's mark: a killed ServerApp's ``failed`` (its error kept aside) or a
    ``running`` becomes ``stopped`` with the reason and the checkpoint round; a finished
    run and an unreadable file are left alone; a resume clears the mark."""
    writer = ResultsWriter(tmp_path / "run", {"algo": "fedreg"}, {"run_id": 7})
    for k in (1, 2):
        writer.add(RoundRecord(k, 0.1 * k, 0.2 * k, 0.0, 1.0, 1.0, 10))
    writer.finish("Traceback (most recent call last):\n  ...\nConnectionError: gone")
    assert mark_stopped(tmp_path / "run", "stopped by SIGTERM", 2)
    document = json.loads((tmp_path / "run" / "results.json").read_text())
    assert document["run"]["status"] == "stopped"
    assert "error" not in document["run"] and "finished" not in document["run"]
    stopped = document["run"]["stopped"]
    assert (stopped["reason"], stopped["after_round"]) == ("stopped by SIGTERM", 2)
    assert stopped["server_error"] == "ConnectionError: gone"
    assert [r["round"] for r in document["rounds"]] == [1, 2]
    resumed = ResultsWriter.resume(tmp_path / "run", {"algo": "fedreg"}, {"run_id": 9}, 2)
    resumed.add(RoundRecord(3, 0.5, 0.6, 0.0, 1.0, 1.0, 10))
    assert resumed.finish() == "completed"
    run = json.loads((tmp_path / "run" / "results.json").read_text())["run"]
    assert "stopped" not in run and run["resumed"][0]["after_round"] == 2
    assert not mark_stopped(tmp_path / "run", "stopped by SIGTERM", 3)  # finished: kept
    assert json.loads((tmp_path / "run" / "results.json").read_text())["run"] == run
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "results.json").write_text('{"run": {"stat')
    assert not mark_stopped(tmp_path / "torn", "stopped by SIGINT", 1)
    assert not mark_stopped(tmp_path / "absent", "stopped by SIGINT", 1)


def test_results_json_holds_each_round_on_one_line_and_old_files_relay_unchanged(
    tmp_path: Path,
) -> None:
    """A full-scale record was 0.6 MB fully indented: each round is one compact line now,
    the rest indented. An earlier version's file rewritten in this layout parses to the
    same value, so the checkpoint's seal still matches and a resume keeps its rounds; a
    non-finite number is written as null, as before."""
    writer = ResultsWriter(tmp_path / "run", {"algo": "fedreg"}, {"run_id": 7})
    hosts = {str(k): {"hostname": "vm", "ray-actor": f"a{k}"} for k in range(3)}
    for k in (1, 2, 3):
        writer.add(RoundRecord(k, 0.1 * k, float("nan"), 0.0, 1.0, 1.0, 10, client_hosts=hosts))
    seal = writer.seal()
    path = tmp_path / "run" / "results.json"
    text = path.read_text()
    lines = text.splitlines()
    round_lines = [line for line in lines if line.lstrip().startswith('{"round":')]
    assert len(round_lines) == 3 and all(line.startswith("    {") for line in round_lines)
    assert '  "config": {\n    "algo": "fedreg"\n  }' in text  # the rest indented
    document = json.loads(text)
    assert [r["personal_accuracy"] for r in document["rounds"]] == [None, None, None]
    assert document["rounds"][2]["client_hosts"] == hosts
    # an earlier version's layout: fully indented, the same value
    path.write_text(json.dumps(document, indent=2))
    assert relayout_results(path)
    assert path.read_text() == text and json.loads(path.read_text()) == document
    assert not relayout_results(path)  # already in this layout: not rewritten
    assert kept_rounds_problem(json.loads(path.read_text()), 3, seal) is None
    resumed = ResultsWriter.resume(
        tmp_path / "run", {"algo": "fedreg"}, {"run_id": 9}, 3, seal=seal
    )
    assert [r.round for r in resumed.rounds] == [1, 2, 3]
    assert mark_stopped(tmp_path / "run", "stopped by SIGTERM", 3)
    assert sum(line.lstrip().startswith('{"round":') for line in path.read_text().splitlines()) == 3


def test_skewed_participation_favours_some_clients_and_is_seeded() -> None:
    def counts(gamma: float, seed: int) -> np.ndarray:
        strategy = FedAvgStrategy(
            RunConfig(seed=seed, fraction_train=0.2, participation_gamma=gamma)
        )
        strategy.set_partitions(PartitionMap(20, {p: p for p in range(20)}))
        picks = np.zeros(20)
        for _ in range(200):
            picks[strategy.sample_partitions(0)] += 1
        return picks

    uniform, skewed = counts(0.0, 1), counts(0.3, 1)
    assert uniform.max() / uniform.sum() < 0.1  # about 1/20 each
    assert skewed.max() / skewed.sum() > 0.1  # Dirichlet(0.3): a few clients dominate
    assert np.array_equal(skewed, counts(0.3, 1))  # same seed, same draws


def test_node_settings_from_the_node_config() -> None:
    from flwr.app import Context

    from fedreg_app.client_app import NodeSettings

    node = {"partition-id": 2, "num-partitions": 30, "state-dir": "/state/n2", "num-threads": 1}
    settings = NodeSettings.from_context(Context(1, 1, node, RecordDict(), {}))
    assert (settings.partition_id, settings.num_partitions) == (2, 30)
    assert (settings.state_dir, settings.num_threads) == ("/state/n2", 1)
    with pytest.raises(ConfigError, match="partition-id=30 is not allowed"):
        NodeSettings.from_context(Context(1, 1, {**node, "partition-id": 30}, RecordDict(), {}))
    with pytest.raises(ConfigError, match="node config lacks 'num-partitions'"):
        NodeSettings.from_context(Context(1, 1, {"partition-id": 0}, RecordDict(), {}))
    for key, value in (("partition-id", "../x"), ("num-partitions", "many"),
                       ("num-threads", "2.5"), ("partition-id", True)):  # fmt: skip
        with pytest.raises(ConfigError, match=f"node config {key}={value!r} is not allowed"):
            NodeSettings.from_context(Context(1, 1, {**node, key: value}, RecordDict(), {}))
    text = NodeSettings.from_context(Context(1, 1, {**node, "partition-id": "2"}, RecordDict(), {}))
    assert text.partition_id == 2  # --node-config may give numbers as text


def test_a_results_dir_that_is_a_file_is_named_before_any_work(tmp_path: Path) -> None:
    from fedreg_app.core.persist import check_results_dir

    (tmp_path / "taken").write_text("")
    with pytest.raises(ConfigError, match="results-dir='.*taken' is a file, not a folder"):
        check_results_dir(str(tmp_path / "taken"))
    with pytest.raises(ConfigError, match="lies under .*taken, which is a file"):
        check_results_dir(str(tmp_path / "taken" / "results"))
    check_results_dir(str(tmp_path / "new" / "results"))  # missing folders are created


def hold_through(lock_name: str, folder: Path) -> None:
    """Hold ``folder`` as its owner does: a ServerApp its run folder, a runner its --out."""
    if lock_name == RUNNER_LOCK:
        with exclusive_out(folder):
            pass
    else:
        release_folder(hold_folder(folder, lock_name, "a ServerApp (PID 1, run 1)"))


@pytest.mark.parametrize("lock_name", [RUN_FOLDER_LOCK, RUNNER_LOCK])
def test_a_lock_file_that_is_not_a_regular_file_is_refused(tmp_path: Path, lock_name: str) -> None:
    """A FIFO planted as the lock (a ServerApp's run folder, a runner's --out): neither
    the holder nor the probe hangs opening it, and the refusal names the path."""
    os.mkfifo(tmp_path / lock_name)
    with pytest.raises((UnsafeLockError, FolderInUseError), match="not a regular file") as caught:
        hold_through(lock_name, tmp_path)
    assert str(tmp_path / lock_name) in str(caught.value)
    assert folder_holder(tmp_path, lock_name) is None


@pytest.mark.parametrize("lock_name", [RUN_FOLDER_LOCK, RUNNER_LOCK])
def test_a_lock_file_planted_as_a_symlink_is_refused_and_its_target_untouched(
    tmp_path: Path, lock_name: str
) -> None:
    """Holding a folder writes the holder's name into its lock file: through a symlink
    planted there, it overwrote (and on release emptied) the file linked to, or created
    the file a dangling link names."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious data\n")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / lock_name).symlink_to(victim)
    with pytest.raises(FolderInUseError, match=f"{folder / lock_name} is a symlink"):
        hold_through(lock_name, folder)  # (the runner says it as it says a busy --out)
    assert victim.read_text() == "precious data\n"
    assert folder_holder(folder, lock_name) is None  # the probe does not follow it either
    (folder / lock_name).unlink()
    (folder / lock_name).symlink_to(tmp_path / "absent.txt")
    with pytest.raises(FolderInUseError, match="is a symlink"):
        hold_through(lock_name, folder)
    assert not (tmp_path / "absent.txt").exists()
    (folder / lock_name).unlink()
    hold_through(lock_name, folder)  # a plain lock file: held and released as before
    assert (folder / lock_name).read_text() == ""
