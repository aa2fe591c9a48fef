"""A client's private state on disk, versioned by round: what a restore may use, what it
discards, and what it does with files a crash or a bad disk left behind."""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

from clients.fedbabu_deviation import FINETUNE_PHASE
from fedreg_app import client_app
from fedreg_app.core.client_state import MANIFEST, NO_USABLE_VERSION, VersionedState, version_name
from fedreg_app.core.models import BASE, HEAD_G, initial_model
from fedreg_app.core.protocol import (
    ARRAYS,
    COMPUTE_SECONDS,
    CONFIG,
    HANDLER_SECONDS,
    METRICS,
    SERVER_ROUND,
    SETUP_SECONDS,
    STATE_HELD,
    STATE_KEY,
    STATE_RESETS,
    STATE_ROUND,
    STATE_SECONDS,
)
from fedreg_app.core.records import from_record, to_record
from tests.inprocess import as_a_task, over_the_wire, results, run_server


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


def test_evaluation_keeps_the_version_a_resume_of_its_round_needs(tmp_path: Path) -> None:
    """Evaluation in round 3 sees round 3's state, but the server's checkpoint is round
    2's until round 3 ends: a kill then runs round 3 again, whose training needs the
    version before 3. Were evaluation to delete it as superseded, the resumed client
    would start afresh. Evaluation keeps it; the next round's message drops it."""
    folder = tmp_path / "partition-0"
    for server_round in (1, 3):  # sampled in rounds 1 and 3
        state = RecordDict()
        VersionedState(folder).restore(state, server_round - 1)
        state["head_p"] = record(server_round)
        assert VersionedState(folder).commit(state, server_round)
    evaluated = RecordDict()
    assert VersionedState(folder).restore(evaluated, 3, checkpointed=2).round == 3
    assert value_of(evaluated, "head_p") == 3.0
    assert sorted(p.name for p in folder.iterdir()) == [version_name(1), version_name(3)]
    uninterrupted = shutil.copytree(folder, tmp_path / "copy")
    resumed = RecordDict()  # a kill now: round 3's training again, from round 1's state
    restored = VersionedState(folder).restore(resumed, 2)
    assert (restored.round, restored.reset) == (1, []) and value_of(resumed, "head_p") == 1.0
    # no kill: the next round's training starts from round 3's state; round 1's goes
    assert VersionedState(uninterrupted).restore(RecordDict(), 3).round == 3
    assert sorted(p.name for p in uninterrupted.iterdir()) == [version_name(3)]


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
    partition = int(head.parent.parent.name.removeprefix("partition-"))
    [named] = document["rounds"][1]["state_reset_records"]  # which, not only how many
    assert (named["partition"], named["records"]) == (partition, ["head_p"])
    assert list(head.parent.parent.glob("*.corrupt-*"))


def test_the_runner_keeps_set_aside_state_files_in_the_run_folder(tmp_path: Path) -> None:
    """The runner deletes a finished run's state folder; the files its clients set aside
    as corrupt move into the run folder first, under the same paths."""
    from fedreg_tools.runner_session import SET_ASIDE, keep_set_aside

    state, run = tmp_path / "state", tmp_path / "run"
    aside = state / "runs" / "key" / "partition-3" / "round-000001-head_p.npz.corrupt-20261207"
    aside.parent.mkdir(parents=True)
    aside.write_bytes(b"damaged")
    (state / "runs" / "key" / "partition-3" / "fine.npz").write_bytes(b"ok")
    kept = keep_set_aside(state, run)
    assert kept == [run / SET_ASIDE / aside.relative_to(state)]
    assert kept[0].read_bytes() == b"damaged" and not aside.exists()


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


# ------------------------------------------------------------ through the ClientApp
def node_context(run_config: dict[str, Any], partition_id: int = 0) -> Context:
    """A node's context as Flower hands it to the ClientApp (a fresh one per message,
    as a deployed node's process gets)."""
    as_a_task()
    return Context(run_id=1, node_id=1000 + partition_id, state=RecordDict(),
                   run_config=dict(run_config),
                   node_config={"partition-id": partition_id, "num-partitions": 4})  # fmt: skip


def train_message(
    context: Context,
    server_round: Any,
    records: dict[str, Any] | None = None,
    groups: tuple[str, ...] = (BASE, HEAD_G),
    config: dict[str, Any] | None = None,
) -> Message:
    """A train message as the server sends it (the initial model's ``groups``), over the
    wire; ``server_round`` and any further ``records`` go in as given, crafted or not."""
    setup = client_app.client_setup(context)
    model = initial_model(setup.info, setup.config)
    content = RecordDict(
        {
            ARRAYS: to_record(model.group_state(*groups)),
            **(records or {}),
            CONFIG: ConfigRecord(
                {SERVER_ROUND: server_round, STATE_KEY: "run-1", **(config or {})}
            ),  # fmt: skip
        }
    )
    return over_the_wire(Message(content, message_type=MessageType.TRAIN, dst_node_id=1000))


def node_config(dataset: Path, state_dir: Path) -> dict[str, Any]:
    """A run whose clients keep state on disk (FedAvg's: its optimizer's momentum)."""
    return {"algo": "fedavg", "dataset-path": str(dataset), "local-epochs": 1,
            "min-partition-size": 5, "seed": 5, "state-dir": str(state_dir)}  # fmt: skip


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` with its bytes (None for a folder)."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes()
            for p in sorted(folder.rglob("*"))}  # fmt: skip


STATE_LOGGER = "fedreg_app.core.client_state"


def state_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == STATE_LOGGER]


def trained(run_config: dict[str, Any], server_round: int, partition_id: int = 0) -> Message:
    context = node_context(run_config, partition_id)
    return client_app.train(train_message(context, server_round), context)


def test_a_reply_says_how_long_its_state_and_its_setup_took_within_the_handler(
    grey_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler's parts are timed apart: reading and writing the private state (here
    slowed by 0.2 s in each direction), setting up, and the procedure's own work; the three
    together are no more than the whole handler."""
    from fedreg_app.core import client_state

    slow = 0.2
    for name in ("restore", "commit"):
        original = getattr(client_state.VersionedState, name)

        def delayed(self, *args, _original=original, **kwargs):
            time.sleep(slow)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(client_state.VersionedState, name, delayed)
    metrics = trained(node_config(grey_dataset, tmp_path / "state"), 1).content[METRICS]
    assert 2 * slow <= metrics[STATE_SECONDS] < 2 * slow + 1.0
    assert metrics[SETUP_SECONDS] > 0 and metrics[COMPUTE_SECONDS] > 0
    parts = metrics[STATE_SECONDS] + metrics[SETUP_SECONDS] + metrics[COMPUTE_SECONDS]
    assert parts <= metrics[HANDLER_SECONDS]
    without_disk = {k: v for k, v in node_config(grey_dataset, tmp_path).items()
                    if k != "state-dir"}  # fmt: skip
    assert trained(without_disk, 1).content[METRICS][STATE_SECONDS] == 0.0


@pytest.mark.parametrize("crafted", [0, -1, 2.9, "3", True])
def test_a_message_whose_round_is_not_an_integer_from_1_is_refused_untouched(
    grey_dataset: Path, tmp_path: Path, crafted: Any
) -> None:
    """The round names the private-state versions to keep and to write: 0 deleted every
    saved version, -1 the newer ones, 2.9 and "3" were truncated or parsed, True was
    round 1. Each is refused before the node's state dir is read or written."""
    run_config = node_config(grey_dataset, tmp_path / "state")
    for server_round in (1, 2):
        trained(run_config, server_round)
    before = snapshot(tmp_path / "state")
    assert any("round-000002" in path for path in before)
    context = node_context(run_config)
    message = train_message(context, crafted)
    with pytest.raises(ValueError, match=f"{SERVER_ROUND}={crafted!r}"):
        client_app.train(message, context)
    assert snapshot(tmp_path / "state") == before


@pytest.mark.parametrize("crafted", ["false", "true", 0, 1, 1.0])
def test_a_deviation_phase_that_is_not_a_bool_is_refused_through_the_message_untouched(
    grey_dataset: Path, tmp_path: Path, crafted: Any
) -> None:
    """FedBABU with deviation tracking reads from the server whether the fine-tune phase
    has begun. A string "false" read as truthy would switch the node to training its
    head; an int or a float must not be taken on trust either. Sent over the wire in a
    train message, each is refused naming the key, before the node's state is read or
    written."""
    run_config = {**node_config(grey_dataset, tmp_path / "state"),
                  "algo": "fedbabu-deviation"}  # fmt: skip
    context = node_context(run_config)
    client_app.train(
        train_message(context, 1, groups=(BASE,), config={FINETUNE_PHASE: False}), context
    )
    before = snapshot(tmp_path / "state")
    assert any("round-000001" in path for path in before)
    context = node_context(run_config)
    message = train_message(context, 2, groups=(BASE,), config={FINETUNE_PHASE: crafted})
    with pytest.raises(ValueError, match=f"{FINETUNE_PHASE}={crafted!r}"):
        client_app.train(message, context)
    assert snapshot(tmp_path / "state") == before


def test_a_state_every_version_of_which_is_newer_than_asked_counts_as_a_reset(
    grey_dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A client trained rounds 1-3 (versions 2 and 3 are kept), then a server resumed
    from round 1's checkpoint asks for round 2: the state of round 1 is gone. The client
    starts afresh, and the reply counts it in ``state-resets``, with a warning."""
    run_config = node_config(grey_dataset, tmp_path / "state")
    for server_round in (1, 2, 3):
        assert trained(run_config, server_round).content[METRICS][STATE_RESETS] == 0
    with caplog.at_level(logging.WARNING, logger=STATE_LOGGER):
        reply = trained(run_config, 2)
    assert reply.content[METRICS][STATE_RESETS] == 1
    [warning] = state_warnings(caplog)
    assert "rounds [2, 3]" in warning and "round 1," in warning


def test_a_state_begun_in_the_killed_round_starts_afresh_uncounted(
    grey_dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A client first sampled in round 3, whose server was killed before round 3's
    checkpoint: round 3 runs again and the client's only version (3) is newer than
    asked, but it had no state before round 3: starting afresh is exact, not a reset.
    The same for a version newer than a usable one."""
    run_config = node_config(grey_dataset, tmp_path / "state")
    trained(run_config, 3, partition_id=1)
    assert list((tmp_path / "state").glob(f"runs/*/partition-1/{version_name(3)}"))
    with caplog.at_level(logging.WARNING, logger=STATE_LOGGER):
        assert trained(run_config, 3, partition_id=1).content[METRICS][STATE_RESETS] == 0
        for server_round in (1, 2, 2):  # round 2 again: version 2 discarded, 1 restored
            assert trained(run_config, server_round).content[METRICS][STATE_RESETS] == 0
    assert not state_warnings(caplog)


def test_a_version_that_does_not_say_when_its_state_began_counts_when_lost(
    tmp_path: Path,
) -> None:
    """A manifest without ``since`` (written before it, or damaged): the state may have
    existed from round 1, so losing every version is counted, never assumed away."""
    versions = VersionedState(tmp_path)
    versions.commit(RecordDict({"head_p": record(4.0)}), 4)
    manifest = tmp_path / version_name(4) / MANIFEST
    assert json.loads(manifest.read_text())["since"] == 4
    assert versions.restore(RecordDict(), 3).reset == []  # began in round 4: exact
    versions.commit(RecordDict({"head_p": record(4.0)}), 4)
    document = json.loads(manifest.read_text())
    del document["since"]
    manifest.write_text(json.dumps(document))
    state = RecordDict()
    assert versions.restore(state, 3).reset == [NO_USABLE_VERSION] and not state
    assert not list(tmp_path.iterdir())


def honest_arrays(context: Context, groups: tuple[str, ...] = (BASE, HEAD_G)) -> dict:
    setup = client_app.client_setup(context)
    return initial_model(setup.info, setup.config).group_state(*groups)


def message_with(context: Context, server_round: int, arrays: dict,
                 config: dict[str, Any] | None = None,
                 message_type: str = MessageType.TRAIN, **records: Any) -> Message:  # fmt: skip
    """A message carrying exactly ``arrays`` (crafted or not) and ``records``."""
    content = RecordDict({ARRAYS: to_record(arrays), **records, CONFIG: ConfigRecord(
        {SERVER_ROUND: server_round, STATE_KEY: "run-1", **(config or {})})})  # fmt: skip
    return over_the_wire(Message(content, message_type=message_type, dst_node_id=1000))


@pytest.mark.parametrize("algo", ["fedreg", "feddyn", "fedavg"])
def test_a_round_that_leaves_non_finite_state_is_not_kept_and_the_next_round_trains(
    grey_dataset: Path, tmp_path: Path, algo: str
) -> None:
    """A global model of finite but huge values (1e30) makes training overflow. A client
    that saved the NaN it produced as its private state (FedReG's head_p and momentum,
    FedDyn's correction) would fail, or train on NaN, in every round after. The round is
    refused with a message saying so, nothing of it is saved, and the next honest round
    trains from the last sound state."""
    run_config = {**node_config(grey_dataset, tmp_path / "state"), "algo": algo}
    context = node_context(run_config)
    client_app.train(message_with(context, 1, honest_arrays(context)), context)
    before = snapshot(tmp_path / "state")
    huge = {k: v * np.float32(1e30) for k, v in honest_arrays(context).items()}
    context = node_context(run_config)
    with pytest.raises(ValueError, match="round 2 left NaN or infinite values in"):
        client_app.train(message_with(context, 2, huge), context)
    assert snapshot(tmp_path / "state") == before
    context = node_context(run_config)
    reply = client_app.train(message_with(context, 2, honest_arrays(context)), context)
    assert all(np.isfinite(v).all() for v in from_record(reply.content[ARRAYS]).values())
    assert reply.content[METRICS][STATE_RESETS] == 0


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda v: v[:1].copy(), "got float32"),
        (lambda v: np.full_like(v, np.nan), "holds NaN or infinite values"),
        (lambda v: v.astype(np.float64), "got float64"),
    ],
)
def test_a_feddyn_correction_or_momentum_of_the_wrong_kind_on_disk_is_refused(
    grey_dataset: Path, tmp_path: Path, damage: Any, problem: str
) -> None:
    """FedDyn's correction and the optimizer's momentum are read back from the node's
    disk, where a consistent manifest does not make them right: a wrong shape broadcast
    silently into the loss, a NaN was trained on. Each is checked against its parameter
    as the model's own entries are, and refused naming the record."""
    from clients.feddyn import CORRECTION

    run_config = {**node_config(grey_dataset, tmp_path / "state"), "algo": "feddyn"}
    context = node_context(run_config)
    client_app.train(message_with(context, 1, honest_arrays(context)), context)
    for record in (CORRECTION, "optimizer-0"):
        [folder] = list((tmp_path / "state").glob("runs/*/partition-0"))
        versions = VersionedState(folder)
        state = RecordDict()
        versions.restore(state, 1)
        assert record in state, list(state)
        arrays = from_record(state[record])
        state[record] = to_record({k: damage(v) for k, v in arrays.items()})
        versions.commit(state, 1)  # rewritten with a consistent manifest
        context = node_context(run_config)
        with pytest.raises(ValueError, match=f"client state '{record}'.*{problem}"):
            client_app.train(message_with(context, 2, honest_arrays(context)), context)
        state[record] = to_record(arrays)
        versions.commit(state, 1)


@pytest.mark.parametrize(
    ("algo", "config", "crafted", "problem"),
    [
        ("fedseq-vanilla", {}, lambda a: {}, "missing keys"),
        (
            "fedseq-vanilla",
            {},
            lambda a: {k: v for k, v in a.items() if k.startswith("head_g")},
            "unexpected keys",
        ),
        ("fedbabu-deviation", {FINETUNE_PHASE: False}, lambda a: {}, "expected the groups"),
        (
            "fedbabu-deviation",
            {FINETUNE_PHASE: True},
            lambda a: {k: v for k, v in a.items() if k.startswith(BASE)},
            "expected the groups",
        ),
        ("fedbabu-deviation", {FINETUNE_PHASE: False}, lambda a: a, "expected the groups"),
    ],
)
def test_a_train_message_without_the_arrays_its_phase_trains_is_refused_untouched(
    grey_dataset: Path, tmp_path: Path, algo: str, config: dict, crafted: Any, problem: str
) -> None:
    """FedSeq's layer phase and FedBABU with deviation tracking load only what was sent:
    a message missing the layers (or the base, or the head of the fine-tune phase) had
    the client train them from its seeded initial weights and save that momentum."""
    run_config = {**node_config(grey_dataset, tmp_path / "state"), "algo": algo,
                  "num-server-rounds": 10}  # fmt: skip
    context = node_context(run_config)
    first = (
        honest_arrays(context, (BASE,))
        if algo == "fedbabu-deviation"
        else {k: v for k, v in honest_arrays(context).items() if k.startswith("base.0.")}
    )
    client_app.train(message_with(context, 1, first, {FINETUNE_PHASE: False}), context)
    before = snapshot(tmp_path / "state")
    context = node_context(run_config)
    with pytest.raises(KeyError, match=problem):
        client_app.train(message_with(context, 2, crafted(honest_arrays(context)), config),
                         context)  # fmt: skip
    assert snapshot(tmp_path / "state") == before


@pytest.mark.parametrize(
    ("key", "crafted"),
    [(STATE_KEY, v) for v in (True, 1.5, 3)] + [(STATE_HELD, v) for v in (True, -1, 3, 1.0, "1")],
)
def test_a_crafted_state_key_or_state_held_is_refused_untouched(
    grey_dataset: Path, tmp_path: Path, key: str, crafted: Any
) -> None:
    """A ``state-key`` of ``True`` or ``1.5`` was made a string: the node's state went to
    ``runs/True`` and its personalization silently started afresh, uncounted. A
    ``state-held`` (which of its versions the server knows of) that is no round up to the
    message's (here 2) is refused too, before the state is read."""
    run_config = node_config(grey_dataset, tmp_path / "state")
    context = node_context(run_config)
    client_app.train(message_with(context, 1, honest_arrays(context)), context)
    before = snapshot(tmp_path / "state")
    context = node_context(run_config)
    message = message_with(context, 2, honest_arrays(context), {key: crafted})
    with pytest.raises(ValueError, match=f"{key}={crafted!r}"):
        client_app.train(message, context)
    assert snapshot(tmp_path / "state") == before


def test_a_client_reports_the_version_it_holds_and_counts_one_the_server_knows_but_it_lacks(
    grey_dataset: Path, tmp_path: Path
) -> None:
    """Each reply says the newest version the node holds (``state-round``); told of a
    version it does not have (its state-dir was wiped, or it is a new node for the
    partition), the client counts the reset and starts afresh."""
    run_config = node_config(grey_dataset, tmp_path / "state")
    context = node_context(run_config)
    first = client_app.train(message_with(context, 1, honest_arrays(context)), context)
    assert first.content[METRICS][STATE_ROUND] == 1 and first.content[METRICS][STATE_RESETS] == 0
    context = node_context(run_config)
    kept = client_app.train(message_with(context, 2, honest_arrays(context), {STATE_HELD: 1}),
                            context)  # fmt: skip
    assert kept.content[METRICS][STATE_ROUND] == 2 and kept.content[METRICS][STATE_RESETS] == 0
    shutil.rmtree(tmp_path / "state")  # the node's state-dir wiped
    context = node_context(run_config)
    lost = client_app.train(message_with(context, 3, honest_arrays(context), {STATE_HELD: 2}),
                            context)  # fmt: skip
    assert lost.content[METRICS][STATE_RESETS] == 1 and lost.content[METRICS][STATE_ROUND] == 3


def test_a_node_without_a_state_dir_that_takes_a_partition_over_counts_the_lost_state(
    grey_dataset: Path, tmp_path: Path
) -> None:
    """A node without a state-dir keeps its state in memory only; given a partition whose
    state the server knows of on another node's disk, it starts afresh: counted, and it
    reports that it holds none on disk, so the server asks no more. A node that already
    holds records in memory counts nothing."""
    run_config = {**node_config(grey_dataset, tmp_path / "unused"), "state-dir": ""}
    context = node_context(run_config)
    taken = client_app.train(message_with(context, 3, honest_arrays(context), {STATE_HELD: 2}),
                             context)  # fmt: skip
    assert taken.content[METRICS][STATE_RESETS] == 1 and taken.content[METRICS][STATE_ROUND] == 0
    kept = client_app.train(message_with(context, 4, honest_arrays(context), {STATE_HELD: 2}),
                            context)  # fmt: skip  # the same node, its records in memory now
    assert kept.content[METRICS][STATE_RESETS] == 0
    fresh = node_context(run_config)
    plain = client_app.train(message_with(fresh, 5, honest_arrays(fresh)), fresh)
    assert STATE_ROUND not in plain.content[METRICS]  # nothing asked, nothing said


def test_other_crafted_server_messages_are_refused_naming_what_is_wrong(
    grey_dataset: Path, tmp_path: Path
) -> None:
    """A weights query of "false" (a truthy string), an evaluation whose global arrays
    override what was sent, a message without the model: each refused, named."""
    from fedreg_app.core.protocol import GLOBAL_ARRAYS, QUERY, WEIGHTS_QUERY

    run_config = {**node_config(grey_dataset, tmp_path / "state"), "algo": "fedper"}
    context = node_context(run_config)
    query = Message(RecordDict({QUERY: ConfigRecord({WEIGHTS_QUERY: "false"})}),
                    message_type=MessageType.QUERY, dst_node_id=1000)  # fmt: skip
    with pytest.raises(ValueError, match=f"{WEIGHTS_QUERY}='false'"):
        client_app.query(over_the_wire(query), context)
    client_app.train(message_with(context, 1, honest_arrays(context, (BASE,))), context)
    context = node_context(run_config)
    whole = honest_arrays(context)
    zeroed = {k: np.zeros_like(v) for k, v in whole.items()}
    evaluation = message_with(context, 1, honest_arrays(context, (BASE,)),
                              message_type=MessageType.EVALUATE,
                              **{GLOBAL_ARRAYS: to_record(zeroed)})  # fmt: skip
    with pytest.raises(ValueError, match=f"{GLOBAL_ARRAYS}: keys .*base.0.weight.* also in"):
        client_app.evaluate(evaluation, context)
    bare = Message(RecordDict({CONFIG: ConfigRecord({SERVER_ROUND: 2})}),
                   message_type=MessageType.TRAIN, dst_node_id=1000)  # fmt: skip
    with pytest.raises(ValueError, match=f"no {ARRAYS!r} record"):
        client_app.train(over_the_wire(bare), node_context(run_config))


def test_big_endian_arrays_train_as_this_machines_own(grey_dataset: Path, tmp_path: Path) -> None:
    """Arrays of the other byte order (a big-endian sender) are the same numbers: torch
    could not read them and raised without naming the key."""
    run_config = node_config(grey_dataset, tmp_path / "a")
    context = node_context(run_config)
    native = client_app.train(message_with(context, 1, honest_arrays(context)), context)
    swapped = {k: v.astype(v.dtype.newbyteorder(">")) for k, v in honest_arrays(context).items()}
    run_config = node_config(grey_dataset, tmp_path / "b")
    context = node_context(run_config)
    other = client_app.train(message_with(context, 1, swapped), context)
    mine, theirs = from_record(native.content[ARRAYS]), from_record(other.content[ARRAYS])
    assert mine.keys() == theirs.keys()
    assert all(np.array_equal(mine[k], theirs[k]) for k in mine)
