"""FedReG's options where the sources leave it open: the schedule of
the E local epochs over the two steps, what step 1 updates, and the threshold's global
reading (paper §3.4)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

import clients.base
import clients.rebalance as rebalance
import fedreg_app.training as training
from clients.base import ClientSetup, optimizer_record
from clients.fedreg import FedReGClient
from clients.rebalance import (
    build_rebalanced,
    class_threshold,
    is_global_threshold,
    partition_train_sizes,
)
from fedreg_app.config import ConfigError
from fedreg_app.data import PartitionKey, TensorData, client_splits
from fedreg_app.models import BASE, HEAD_G, HEAD_P, build_model
from fedreg_app.protocol import EFFECTIVE_EXAMPLES, NUM_PROCESSED
from fedreg_app.records import from_record
from fedreg_app.registry import load_config
from tests.test_clients import INFO, global_arrays, group, make_setup, same


def everything(client: FedReGClient) -> dict[str, np.ndarray]:
    return client.model.group_state(BASE, HEAD_G, HEAD_P)


class EarlierFedReG(FedReGClient):
    """The round as versions before 0.2.0 ran it: E epochs of step 1, then E of step 2,
    each one ``fit`` call of the base class (its own optimizer handling)."""

    def train(self, global_arrays, server_round):
        self.load_global(global_arrays)
        self.restore_private()
        epochs, processed = self.config.local_epochs, 0
        if self.options.original_step:
            processed += self.fit(
                *self.original_step(), self.data.train, epochs, server_round, stream=1
            )
        processed += self.fit(
            self.model.parameters_of(BASE, HEAD_G),
            self.cross_entropy(self.model),
            self.second_step_data(),
            epochs,
            server_round,
            stream=2,
        )
        self.save_private()
        return self.train_metrics(processed, **{EFFECTIVE_EXAMPLES: self.effective_samples()})


class Recording(FedReGClient):
    """Every ``fit`` call: its stream, its epochs, and the groups before and after."""

    def __init__(self, setup: ClientSetup) -> None:
        super().__init__(setup)
        self.calls: list[tuple[int, int, dict, dict]] = []

    def fit(self, trainable, loss_fn, data, epochs, server_round, stream=0, **kwargs):
        before = everything(self)
        processed = super().fit(trainable, loss_fn, data, epochs, server_round, stream, **kwargs)
        self.calls.append((stream, epochs, before, everything(self)))
        return processed


def two_rounds(kind: type[FedReGClient], **config) -> tuple[dict, RecordDict, list]:
    """Rounds 1 and 2 on one client (its state carried), from different global models."""
    state, metrics = RecordDict(), []
    for server_round in (1, 2):
        client = kind(make_setup(state, **config))
        result = client.train(global_arrays(server_round), server_round)
        metrics.append(result if isinstance(result, dict) else result.metrics)
    return everything(client), state, metrics


# --- 1. the local schedule ------------------------------------------------------------


@pytest.mark.parametrize(
    ("optimizer_state", "variant"),
    [("persistent", {}), ("fresh", {}), ("persistent", {"fedreg-private-head": False}),
     ("fresh", {"fedreg-original-step": False})],
)  # fmt: skip
def test_sequential_schedule_is_the_earlier_round_bit_for_bit(optimizer_state, variant) -> None:
    config = {"local-epochs": 2, "optimizer-state": optimizer_state, **variant}
    ours, our_state, our_metrics = two_rounds(
        FedReGClient, **{"fedreg-schedule": "sequential", **config}
    )
    earlier, earlier_state, earlier_metrics = two_rounds(EarlierFedReG, **config)
    assert same(ours, earlier)
    assert our_metrics == earlier_metrics
    assert set(our_state) == set(earlier_state)
    for name in our_state:  # head_p and the kept momentum alike
        assert same(from_record(our_state[name]), from_record(earlier_state[name])), name


def test_one_epoch_interleaved_is_sequential() -> None:
    config = {"local-epochs": 1}
    interleaved = two_rounds(FedReGClient, **{"fedreg-schedule": "interleaved", **config})
    sequential = two_rounds(FedReGClient, **{"fedreg-schedule": "sequential", **config})
    assert same(interleaved[0], sequential[0])


@pytest.mark.parametrize("optimizer_state", ["persistent", "fresh"])
def test_with_one_step_the_schedules_agree_so_a_step_has_one_shuffle_and_optimizer(
    optimizer_state: str,
) -> None:
    """Ablation (d) has step 2 only: E passes of one ``fit`` each (interleaved) must be
    E epochs of one ``fit`` (sequential) — the same shuffles, one after the other, and
    momentum carried from pass to pass, kept across rounds or not."""
    config = {"local-epochs": 3, "optimizer-state": optimizer_state, "fedreg-original-step": False}
    interleaved = two_rounds(FedReGClient, **{"fedreg-schedule": "interleaved", **config})
    sequential = two_rounds(FedReGClient, **{"fedreg-schedule": "sequential", **config})
    assert same(interleaved[0], sequential[0])


def test_the_interleaved_schedule_alternates_one_pass_of_each_step() -> None:
    interleaved = Recording(make_setup(**{"local-epochs": 3}))
    interleaved.train(global_arrays(), 1)
    assert [(stream, epochs) for stream, epochs, _, _ in interleaved.calls] == [(1, 1), (2, 1)] * 3
    sequential = Recording(make_setup(**{"local-epochs": 3, "fedreg-schedule": "sequential"}))
    sequential.train(global_arrays(), 1)
    assert [(stream, epochs) for stream, epochs, _, _ in sequential.calls] == [(1, 3), (2, 3)]


def test_defaults_are_interleaved_and_prose() -> None:
    options = FedReGClient(make_setup()).options
    assert (options.schedule, options.step1) == ("interleaved", "prose")
    for key, value in (("fedreg-schedule", "alternating"), ("fedreg-step1", "code")):
        with pytest.raises(ConfigError, match=key):
            load_config({key: value})


def record_orders(monkeypatch) -> list[tuple[int, torch.Tensor]]:
    """The shuffled order of every pass (data size, permutation), without changing it."""
    orders: list[tuple[int, torch.Tensor]] = []
    original = training.batches

    def batches(data, batch_size, generator, device, drop_last=False):
        if generator is not None:
            copy = torch.Generator().set_state(generator.get_state())
            orders.append((len(data), torch.randperm(len(data), generator=copy)))
        return original(data, batch_size, generator, device, drop_last)

    monkeypatch.setattr(training, "batches", batches)
    return orders


def test_each_pass_has_its_own_seeded_order_the_same_under_both_schedules(monkeypatch) -> None:
    orders = record_orders(monkeypatch)
    FedReGClient(make_setup(**{"local-epochs": 3})).train(global_arrays(), 1)
    interleaved = list(orders)
    orders.clear()
    FedReGClient(make_setup(**{"local-epochs": 3, "fedreg-schedule": "sequential"})).train(
        global_arrays(), 1
    )
    sequential = list(orders)
    # original data: 52 samples; rebalanced: 3 classes x t = 17
    assert [n for n, _ in interleaved] == [52, 51] * 3
    assert [n for n, _ in sequential] == [52] * 3 + [51] * 3
    for step in (0, 1):
        passes = [order for _, order in interleaved[step::2]]
        for a in range(3):
            for b in range(a + 1, 3):
                assert not torch.equal(passes[a], passes[b])  # a new order every epoch
        expected = [order for _, order in sequential[3 * step : 3 * step + 3]]
        assert all(torch.equal(p, e) for p, e in zip(passes, expected, strict=True))
    orders.clear()
    FedReGClient(make_setup(**{"local-epochs": 3})).train(global_arrays(), 2)
    assert not torch.equal(orders[0][1], interleaved[0][1])  # and every round


def test_fresh_optimizers_are_one_per_step_over_the_round(monkeypatch) -> None:
    used: list = []  # the optimizer of every fit call, in order (objects, not ids)
    original = training.train_epochs

    def train_epochs(model, trainable, *args, optimizer=None, **kwargs):
        used.append(optimizer)
        return original(model, trainable, *args, optimizer=optimizer, **kwargs)

    monkeypatch.setattr(clients.base, "train_epochs", train_epochs)
    state = RecordDict()
    client = FedReGClient(make_setup(state, **{"local-epochs": 3, "optimizer-state": "fresh"}))
    client.train(global_arrays(), 1)
    first, second = used[0], used[1]
    assert first is not None and second is not None and first is not second
    assert all(opt is first for opt in used[0::2]) and all(opt is second for opt in used[1::2])
    assert not any(name.startswith("optimizer-") for name in state)  # nothing kept
    used.clear()
    client.train(global_arrays(), 2)  # a new round: new optimizers
    assert all(opt is not first and opt is not second for opt in used)


def test_persistent_optimizers_carry_each_steps_momentum_into_the_state() -> None:
    state = RecordDict()
    FedReGClient(make_setup(state, **{"local-epochs": 2})).train(global_arrays(), 1)
    assert optimizer_record(1) in state and optimizer_record(2) in state
    step1 = {name for name in state[optimizer_record(1)]}
    assert any(n.startswith("head_p.") for n in step1)
    assert not any(n.startswith("head_g.") for n in step1)


# --- 2. what step 1 updates -------------------------------------------------------------


@pytest.mark.parametrize("step1", ["prose", "pseudocode"])
def test_step1_moves_head_g_only_in_the_pseudocode_reading(step1: str) -> None:
    client = Recording(make_setup(**{"fedreg-step1": step1}))
    client.train(global_arrays(), 1)
    (stream1, _, before1, after1), (stream2, _, before2, after2) = client.calls
    assert (stream1, stream2) == (1, 2)
    assert not same(group(before1, BASE), group(after1, BASE))
    assert not same(group(before1, HEAD_P), group(after1, HEAD_P))
    head_g_kept = same(group(before1, HEAD_G), group(after1, HEAD_G))
    assert head_g_kept == (step1 == "prose")
    # step 2 is the same either way: base and head_g move, head_p does not
    assert same(group(before2, HEAD_P), group(after2, HEAD_P))
    assert not same(group(before2, HEAD_G), group(after2, HEAD_G))


def test_step1_reading_counts_head_g_among_the_trained_parameters() -> None:
    prose = FedReGClient(make_setup()).round_steps()[0]
    code = FedReGClient(make_setup(**{"fedreg-step1": "pseudocode"})).round_steps()[0]
    assert len(code.trainable) == len(prose.trainable) + len(
        build_model(INFO, 2, 0).parameters_of(HEAD_G)
    )


def test_without_a_private_head_the_step1_reading_changes_nothing() -> None:
    config = {"fedreg-private-head": False}
    prose = FedReGClient(make_setup(**config)).train(global_arrays(), 1)
    code = FedReGClient(make_setup(**{"fedreg-step1": "pseudocode", **config})).train(
        global_arrays(), 1
    )
    assert same(prose.arrays, code.arrays)


# --- 3. the threshold -------------------------------------------------------------------

CLASS_COUNTS = torch.tensor([30, 0, 5, 12, 0, 1, 0, 0, 0, 8])  # 56 samples, 5 classes
CLIENT_SIZES = (56, 120, 30, 74)  # every client's train size; this client is the first


@pytest.mark.parametrize(
    ("threshold", "expected_t"),
    [
        ("mean", 11),  # 56 / 5 = 11.2: the client's own size over its classes
        ("median", 8),
        ("max", 30),
        ("secmin", 5),
        ("global-mean", 14),  # mean size 70, over 5 classes
        ("global-median", 13),  # (56 + 74) / 2 = 65, / 5
        ("global-max", 24),  # 120 / 5
        ("global-secmin", 11),  # second smallest size 56 / 5 = 11.2
        ("9", 9),
    ],
)
def test_per_client_and_global_thresholds_give_t_sizes_and_effective_samples(
    threshold: str, expected_t: int
) -> None:
    t = class_threshold(CLASS_COUNTS, threshold, CLIENT_SIZES)
    assert t == expected_t
    x = torch.randint(0, 256, (56, 1, 28, 28), dtype=torch.uint8)
    ys = torch.cat([torch.full((int(n),), c) for c, n in enumerate(CLASS_COUNTS)]).long()
    built = build_rebalanced(TensorData(x, ys), 10, threshold, "simple", 0, CLIENT_SIZES)
    assert built.threshold == t
    assert len(built.data) == 5 * t
    assert torch.equal(built.data.class_counts(10), torch.where(CLASS_COUNTS > 0, t, 0))
    effective = sum(min(int(n), t) for n in CLASS_COUNTS)
    assert built.effective_samples == effective == int((~built.augmented).sum())


def test_expected_rebalanced_sizes_and_effective_samples_spelled_out() -> None:
    cases = {"mean": (11, 55, 11 + 5 + 11 + 1 + 8), "global-mean": (14, 70, 14 + 5 + 12 + 1 + 8),
             "global-max": (24, 120, 24 + 5 + 12 + 1 + 8)}  # fmt: skip
    for threshold, (t, size, effective) in cases.items():
        assert class_threshold(CLASS_COUNTS, threshold, CLIENT_SIZES) == t
        assert 5 * t == size
        assert rebalance.effective_samples(CLASS_COUNTS, t) == effective


def test_the_per_client_mean_is_the_global_formula_with_the_clients_own_size() -> None:
    """Q = D / C with D = |D_k|: the mean of the non-zero class counts."""
    assert class_threshold(CLASS_COUNTS, "mean") == class_threshold(
        CLASS_COUNTS, "global-mean", [56] * 4
    )


def test_a_global_threshold_needs_the_sizes_and_is_validated() -> None:
    with pytest.raises(ValueError, match="train sizes of all clients"):
        class_threshold(CLASS_COUNTS, "global-mean")
    assert is_global_threshold("global-median") and not is_global_threshold("mean")
    assert not is_global_threshold(12)
    assert load_config({"threshold": "global-mean"}).threshold == "global-mean"
    with pytest.raises(ConfigError, match="threshold"):
        load_config({"threshold": "global-average"})


def test_a_client_without_its_partitioning_names_what_a_global_threshold_needs() -> None:
    client = FedReGClient(make_setup(threshold="global-mean"))
    with pytest.raises(ValueError, match="partition_key"):
        client.train(global_arrays(), 1)


def partition_key(dataset: Path, num_partitions: int = 4) -> PartitionKey:
    config = load_config({"dataset-path": str(dataset), "min-partition-size": 5, "alpha": 0.5})
    return PartitionKey.from_config(config, num_partitions)


def test_every_partitions_train_size_is_what_its_split_holds(grey_dataset: Path) -> None:
    key = partition_key(grey_dataset)
    sizes = partition_train_sizes(key)
    assert sizes == tuple(len(client_splits(key, pid)["train"]) for pid in range(4))
    assert 296 <= sum(sizes) <= 300  # 75% of the 400-image pool, test sizes rounded up


def test_a_client_computes_the_global_threshold_from_the_partitioning(
    grey_dataset: Path, tmp_path: Path, monkeypatch
) -> None:
    from fedreg_app.data import node_data

    key = partition_key(grey_dataset)
    sizes = [len(client_splits(key, pid)["train"]) for pid in range(4)]
    config = load_config({"dataset-path": str(grey_dataset), "min-partition-size": 5,
                          "alpha": 0.5, "local-epochs": 1, "threshold": "global-mean"})  # fmt: skip
    info, data = node_data(key, 2, None)
    setup = ClientSetup(config, info, data, RecordDict(), cache=tmp_path, partition_key=key)
    client = FedReGClient(setup)
    counts = data.train.class_counts(info.num_classes)
    classes = int((counts > 0).sum())
    t = int(np.floor(np.mean(sizes) / classes + 0.5))
    assert client.threshold() == t
    result = client.train(build_model(info, 2, 0).group_state(BASE, HEAD_G), 1)
    assert result.metrics[EFFECTIVE_EXAMPLES] == int(torch.clamp(counts, max=t).sum())
    assert client.rebalanced().threshold == t and len(client.rebalanced().data) == classes * t
    whole = [n - n % config.batch_size for n in (len(data.train), classes * t)]  # drop-last
    assert result.metrics[NUM_PROCESSED] == sum(whole)
    # The sizes are kept in the node's cache folder: a later process reads them there.
    assert json.loads((tmp_path / "train-sizes.json").read_text()) == sizes

    def no_dataset(_key):
        raise AssertionError("the partitioning was computed again")

    monkeypatch.setattr(rebalance, "_partition_train_sizes", no_dataset)
    assert partition_train_sizes(key, tmp_path) == tuple(sizes)
    # A damaged file is moved aside and computed again.
    monkeypatch.undo()
    (tmp_path / "train-sizes.json").write_text("[1, 2")
    assert partition_train_sizes(key, tmp_path) == tuple(sizes)
    assert json.loads((tmp_path / "train-sizes.json").read_text()) == sizes


def test_a_federation_runs_with_the_global_threshold(grey_dataset: Path, tmp_path: Path) -> None:
    """Through the real ClientApp: the node's ClientSetup carries its partitioning, so
    each client finds every train size itself (kept in its state-dir's data folder)."""
    from fedreg_app.data import data_cache_folder
    from tests.inprocess import results, run_server

    config = {"algo": "fedreg", "dataset-path": str(grey_dataset), "local-epochs": 1,
              "min-partition-size": 5, "alpha": 0.5, "num-server-rounds": 1,
              "threshold": "global-mean", "results-dir": str(tmp_path / "results"),
              "state-dir": str(tmp_path / "state")}  # fmt: skip
    _, stopped = run_server(config)
    assert stopped is None
    assert len(results(tmp_path / "results")["rounds"]) == 1
    key = partition_key(grey_dataset)
    stored = data_cache_folder((tmp_path / "state").resolve(), key) / "train-sizes.json"
    assert json.loads(stored.read_text()) == list(partition_train_sizes(key))
