"""FedReG's options where the sources leave it open: the schedule of
the E local epochs over the two steps, what step 1 updates, and the threshold's global
reading (paper §3.4); and the switches of where FedReG differs from its baselines: the
personal prediction, head_p's gradient into the base, head_p's start, each step's lr; and
the paper's future work (§6): an automatic threshold, FedRoD's balanced softmax and
FedDyn's regulariser combined with FedReG."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import MessageType, RecordDict
from torch.nn import functional as F  # noqa: N812 - the usual name

import clients.base
import clients.rebalance as rebalance
import fedreg_app.core.training as training
from clients.base import ClientSetup, optimizer_record
from clients.feddyn import CORRECTION
from clients.fedreg import (
    KEPT_HEAD_G,
    ORIGINAL_STREAM,
    REBALANCED_STREAM,
    FedReGClient,
    FedReGOptions,
    Step,
    fitted_global_weight,
)
from clients.rebalance import (
    auto_threshold,
    build_rebalanced,
    class_threshold,
    is_global_threshold,
    partition_train_sizes,
)
from fedreg_app.core.config import ConfigError
from fedreg_app.core.data import PartitionKey, TensorData, client_splits
from fedreg_app.core.models import BASE, HEAD_G, HEAD_P, build_model
from fedreg_app.core.protocol import (
    EFFECTIVE_EXAMPLES,
    NUM_PROCESSED,
    PERSONAL_CORRECT,
    PERSONAL_GLOBAL_WEIGHT,
)
from fedreg_app.core.records import from_record, to_record
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
    from fedreg_app.core.data import node_data

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
    from fedreg_app.core.data import data_cache_folder
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


# --- 4. FedReG's differences from its baselines, one switch each --------------------


class BeforeTheSwitches(FedReGClient):
    """FedReG as it ran before these switches, spelled out: step 1's loss on
    head_g(z) + head_p(z), the base class's personal head, model and learning rate."""

    def original_step(self):
        trainable, loss_fn = super().original_step()
        model = self.model
        if model.head_p is None:  # ablation (b): the global model's loss
            return trainable, loss_fn

        def logits(x):
            z = model.base(x)
            return model.head_g(z) + model.head_p(z)

        return trainable, self.cross_entropy(logits)

    def round_steps(self):
        model, steps = self.model, []
        if self.options.original_step:
            steps.append(Step(*self.original_step(), self.data.train, ORIGINAL_STREAM))
        data = self.second_step_data()
        steps.append(Step(model.parameters_of(BASE, HEAD_G), self.cross_entropy(model), data,
                          REBALANCED_STREAM))  # fmt: skip
        return steps

    new_model = clients.base.ClientProcedure.new_model
    personal_head = clients.base.ClientProcedure.personal_head
    personal_head_is = clients.base.ClientProcedure.personal_head_is
    stream_lr = clients.base.ClientProcedure.stream_lr


SWITCH_DEFAULTS = {"fedreg-personal": "sum", "fedreg-private-detach": False,
                   "fedreg-private-init": "copy", "fedreg-step1-lr": 0.0,
                   "fedreg-step2-lr": 0.0, "fedreg-global-loss": "ce",
                   "fedreg-dyn-alpha": 0.0}  # fmt: skip


def three_rounds_and_evaluate(kind: type[FedReGClient], **config) -> tuple[dict, RecordDict, list]:
    """Rounds 1 to 3 on one client, then its evaluation in round 4 on another global
    model: its weights, state, and every reply's metrics and counts."""
    state, replies = RecordDict(), []
    for server_round in (1, 2, 3):
        client = kind(make_setup(state, **config))
        replies.append(client.train(global_arrays(server_round), server_round).metrics)
    replies.append(kind(make_setup(state, **config)).evaluate(global_arrays(9), 4))
    return everything(client), state, replies


@pytest.mark.parametrize(
    "variant",
    [{"optimizer-state": "persistent"}, {"optimizer-state": "fresh"},
     {"fedreg-schedule": "sequential", "fedreg-step1": "pseudocode"},
     {"fedreg-private-head": False}, {"fedreg-original-step": False}],
)  # fmt: skip
def test_the_switches_defaults_train_and_evaluate_as_before_bit_for_bit(variant) -> None:
    config = {"local-epochs": 2, **variant}
    ours = three_rounds_and_evaluate(FedReGClient, **SWITCH_DEFAULTS, **config)
    before = three_rounds_and_evaluate(BeforeTheSwitches, **config)
    assert same(ours[0], before[0])
    assert set(ours[1]) == set(before[1])  # no record added by the defaults
    for name in ours[1]:
        assert same(from_record(ours[1][name]), from_record(before[1][name])), name
    assert ours[2] == before[2]


def test_the_switches_defaults_and_values_are_checked() -> None:
    options = FedReGClient(make_setup()).options
    assert FedReGOptions.declared() | SWITCH_DEFAULTS == FedReGOptions.declared()
    assert (options.personal, options.private_detach, options.private_init) == (
        "sum", False, "copy")  # fmt: skip
    assert (options.step1_lr, options.step2_lr) == (0.0, 0.0)
    for key, value in (("fedreg-global-loss", "focal"), ("fedreg-dyn-alpha", -0.1),
                       ("fedreg-personal", "global"), ("fedreg-private-init", "zeros"),
                       ("fedreg-step1-lr", -0.01), ("fedreg-step2-lr", "fast"),
                       ("fedreg-private-detach", "yes")):  # fmt: skip
        with pytest.raises(ConfigError, match=key):
            load_config({key: value})


def one_batch(client: FedReGClient) -> tuple[torch.Tensor, torch.Tensor]:
    """16 train samples, normalised as training reads them."""
    x = client.data.train.x[:16].float() / 127.5 - 1
    return x.to(client.device), client.data.train.y[:16]


def trained_client(state: RecordDict | None = None, **config) -> FedReGClient:
    client = FedReGClient(make_setup(state, **config))
    client.train(global_arrays(), 1)
    return client


def test_private_personal_model_is_head_p_on_the_base_in_training_and_evaluation() -> None:
    state = RecordDict()
    trained_client(state, **{"fedreg-personal": "private"})
    client = FedReGClient(make_setup(state, **{"fedreg-personal": "private"}))
    counts = client.evaluate(global_arrays(1), 2)  # the new global model, head_p restored
    model = client.model
    x = client.data.test.x.float() / 127.5 - 1
    with torch.no_grad():
        expected = model.head_p(model.base(x))
        base, head = client.personal_parts()
        assert torch.equal(head(base(x)), expected)
        assert not torch.allclose(expected, model.head_g(model.base(x)) + expected)
    assert counts[PERSONAL_CORRECT] == int((expected.argmax(1) == client.data.test.y).sum())
    # step 1's loss is the cross-entropy of head_p(z) alone: head_g gets no gradient
    x, y = one_batch(client)
    _, loss_fn = client.original_step()
    loss_fn(x, y).backward()
    expected_loss = F.cross_entropy(model.head_p(model.base(x)), y)
    assert torch.equal(loss_fn(x, y), expected_loss)
    assert all(p.grad is None for p in model.parameters_of(HEAD_G))
    assert all(p.grad is not None for p in model.parameters_of(BASE, HEAD_P))


def test_private_personal_with_the_pseudocode_step1_leaves_head_g_to_step2() -> None:
    client = Recording(make_setup(**{"fedreg-personal": "private", "fedreg-step1": "pseudocode"}))
    client.train(global_arrays(), 1)
    (_, _, before1, after1), (_, _, before2, after2) = client.calls
    assert same(group(before1, HEAD_G), group(after1, HEAD_G))
    assert not same(group(before2, HEAD_G), group(after2, HEAD_G))


def test_kept_global_trains_as_sum_and_keeps_head_g_as_training_left_it() -> None:
    kept = two_rounds(FedReGClient, **{"fedreg-personal": "kept-global", "local-epochs": 2})
    summed = two_rounds(FedReGClient, **{"local-epochs": 2})
    assert same(kept[0], summed[0]) and kept[2] == summed[2]
    assert set(kept[1]) == set(summed[1]) | {KEPT_HEAD_G}
    for name in summed[1]:
        assert same(from_record(kept[1][name]), from_record(summed[1][name])), name
    assert same(from_record(kept[1][KEPT_HEAD_G]), group(kept[0], HEAD_G))


def test_kept_global_evaluates_head_p_with_the_clients_own_head_g() -> None:
    config = {"fedreg-personal": "kept-global"}
    state = RecordDict()
    trained = FedReGClient(make_setup(state, **config))
    sent = trained.train(global_arrays(), 1).arrays
    client = FedReGClient(make_setup(state, **config))
    received = global_arrays(1)
    counts = client.evaluate(received, 2)
    model = client.model
    assert same(model.group_state(HEAD_G), group(received, HEAD_G))  # global eval's head
    x = client.data.test.x.float() / 127.5 - 1
    own = build_model(INFO, 2, 0)
    own.load_group_state(sent, BASE, HEAD_G)
    with torch.no_grad():
        z = model.base(x)
        expected = own.head_g(z) + model.head_p(z)
        assert torch.equal(client.personal_head(z), expected)
        assert not torch.allclose(expected, model.head_g(z) + model.head_p(z))
    assert counts[PERSONAL_CORRECT] == int((expected.argmax(1) == client.data.test.y).sum())
    assert KEPT_HEAD_G in state  # evaluation changes no state
    assert same(from_record(state[KEPT_HEAD_G]), group(sent, HEAD_G))


def test_kept_global_on_a_client_that_never_trained_uses_the_received_head_g() -> None:
    kept = FedReGClient(make_setup(**{"fedreg-personal": "kept-global"}))
    summed = FedReGClient(make_setup())
    assert kept.evaluate(global_arrays(3), 1) == summed.evaluate(global_arrays(3), 1)
    assert kept.kept_head_g is None
    z = torch.randn(5, 384)
    assert torch.equal(kept.personal_head(z), summed.personal_head(z))


def test_weighted_and_learned_train_as_sum() -> None:
    summed = two_rounds(FedReGClient, **{"local-epochs": 2})
    for personal in ("weighted", "learned"):
        mixed = two_rounds(FedReGClient, **{"fedreg-personal": personal, "local-epochs": 2})
        assert same(mixed[0], summed[0]) and mixed[2] == summed[2], personal
        assert set(mixed[1]) == set(summed[1]), personal


def test_weighted_evaluates_head_p_plus_lambda_times_the_received_head_g() -> None:
    config = {"fedreg-personal": "weighted", "fedreg-personal-weight": 0.25}
    state = RecordDict()
    trained_client(state, **config)
    client = FedReGClient(make_setup(state, **config))
    counts = client.evaluate(global_arrays(1), 2)
    model = client.model
    x = client.data.test.x.float() / 127.5 - 1
    with torch.no_grad():
        z = model.base(x)
        expected = 0.25 * model.head_g(z) + model.head_p(z)
        assert torch.equal(client.personal_head(z), expected)
    assert client.global_weight == 0.25 and counts[PERSONAL_GLOBAL_WEIGHT] == 0.25
    assert counts[PERSONAL_CORRECT] == int((expected.argmax(1) == client.data.test.y).sum())
    assert PERSONAL_GLOBAL_WEIGHT not in FedReGClient(make_setup()).evaluate(global_arrays(1), 2)


def test_learned_evaluates_with_the_weight_fitted_on_the_train_split() -> None:
    state = RecordDict()
    trained_client(state, **{"fedreg-personal": "learned"})
    client = FedReGClient(make_setup(state, **{"fedreg-personal": "learned"}))
    counts = client.evaluate(global_arrays(1), 2)
    model = client.model
    train_x = client.data.train.x.float() / 127.5 - 1
    with torch.no_grad():
        z = model.base(train_x)
        weight = fitted_global_weight(model.head_p(z), model.head_g(z), client.data.train.y)
        assert client.global_weight == weight == counts[PERSONAL_GLOBAL_WEIGHT]
        test_z = model.base(client.data.test.x.float() / 127.5 - 1)
        expected = weight * model.head_g(test_z) + model.head_p(test_z)
        assert torch.allclose(client.personal_head(test_z), expected)
    assert counts[PERSONAL_CORRECT] == int((expected.argmax(1) == client.data.test.y).sum())


def test_the_fitted_weight_is_the_cross_entropys_minimum_over_nonnegative_weights() -> None:
    generator = torch.Generator().manual_seed(0)
    private, shared = (
        torch.randn(400, 10, generator=generator),
        torch.randn(400, 10, generator=generator),
    )
    # labels drawn from softmax(private + 0.6 shared): the minimum lies near 0.6
    labels = torch.multinomial(torch.softmax(private + 0.6 * shared, 1), 1, generator=generator)[
        :, 0
    ]
    weight = fitted_global_weight(private, shared, labels)

    def loss(w: float) -> float:
        return float(F.cross_entropy((private + w * shared).double(), labels))

    assert 0.4 < weight < 0.8
    assert all(loss(weight) <= loss(weight + d) + 1e-12 for d in (-1e-3, 1e-3, -0.1, 0.1))
    # a global head that only hurts: the projection keeps λ at 0
    assert fitted_global_weight(private, -shared - 3 * F.one_hot(labels, 10), labels) == 0.0
    assert fitted_global_weight(private[:0], shared[:0], labels[:0]) == 1.0


def test_the_personal_weight_must_not_be_negative() -> None:
    with pytest.raises(ConfigError, match="fedreg-personal-weight"):
        load_config({"algo": "fedreg", "fedreg-personal-weight": -0.5})


def test_a_kept_head_g_of_the_wrong_shape_is_refused() -> None:
    state = RecordDict()
    trained_client(state, **{"fedreg-personal": "kept-global"})
    arrays = from_record(state[KEPT_HEAD_G])
    name = next(iter(arrays))
    state[KEPT_HEAD_G] = to_record({**arrays, name: np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match=f"{KEPT_HEAD_G}.*{name}"):
        FedReGClient(make_setup(state, **{"fedreg-personal": "kept-global"})).evaluate(
            global_arrays(), 2
        )


def step1_gradients(**config) -> dict[str, torch.Tensor]:
    """Every parameter's gradient of step 1's loss on one batch."""
    client = FedReGClient(make_setup(**config))
    client.load_global(global_arrays())
    x, y = one_batch(client)
    _, loss_fn = client.original_step()
    loss_fn(x, y).backward()
    return {n: p.grad.clone() for n, p in client.model.named_parameters() if p.grad is not None}


def test_private_detach_takes_head_ps_gradient_out_of_the_base() -> None:
    detached = step1_gradients(**{"fedreg-private-detach": True})
    attached = step1_gradients()
    # head_p's own gradient is the same; the base's is head_g's term alone
    for name in detached:
        if name.startswith(HEAD_P + "."):
            assert torch.equal(detached[name], attached[name]), name
    client = FedReGClient(make_setup())
    client.load_global(global_arrays())
    model = client.model
    x, y = one_batch(client)
    z = model.base(x)
    F.cross_entropy(model.head_g(z) + model.head_p(z).detach(), y).backward()
    for name, param in model.named_parameters():
        if name.startswith(BASE + "."):
            assert torch.allclose(detached[name], param.grad, rtol=1e-5, atol=1e-7), name
            assert not torch.allclose(attached[name], param.grad, rtol=1e-3), name


def test_private_detach_with_the_private_head_alone_leaves_the_base_to_step2() -> None:
    """head_p(z.detach()) is then step 1's only term: the base gets no gradient and does
    not move in step 1, head_p does; without the detach the base moves."""
    config = {"fedreg-personal": "private", "local-epochs": 2}
    for detach in (True, False):
        client = Recording(make_setup(**config, **{"fedreg-private-detach": detach}))
        client.train(global_arrays(), 1)
        for stream, _, before, after in client.calls:
            moved = {g: not same(group(before, g), group(after, g)) for g in (BASE, HEAD_P)}
            if stream == 1:
                assert moved == {BASE: not detach, HEAD_P: True}
            else:
                assert moved == {BASE: True, HEAD_P: False}


def test_random_private_init_is_seeded_the_same_on_every_client_and_not_head_g() -> None:
    def initial(seed: int = 0, counts=(40, 3, 0, 9), init: str = "random") -> dict:
        torch.manual_seed(123 + seed + len(counts))  # the global generator plays no part
        client = FedReGClient(make_setup(counts=counts, seed=seed,
                                         **{"fedreg-private-init": init}))  # fmt: skip
        client.restore_private()  # a client's first time: the initial head
        return client.model.group_state(BASE, HEAD_G, HEAD_P)

    copied, drawn = initial(init="copy"), initial()
    renamed = {k.replace(HEAD_P + ".", HEAD_G + ".", 1): v for k, v in group(drawn, HEAD_P).items()}
    assert same(group(copied, HEAD_P), {k.replace(HEAD_G, HEAD_P, 1): v
                                        for k, v in group(copied, HEAD_G).items()})  # fmt: skip
    assert renamed.keys() == group(drawn, HEAD_G).keys()
    assert all(not np.array_equal(renamed[k], group(drawn, HEAD_G)[k]) for k in renamed)
    assert same(group(drawn, BASE), group(copied, BASE))  # only head_p changes
    assert same(group(drawn, HEAD_G), group(copied, HEAD_G))
    assert same(drawn, initial(counts=(1, 20, 30, 0)))  # another client, the same head_p
    other_seed = initial(seed=1)
    assert not same(group(other_seed, HEAD_P), group(drawn, HEAD_P))
    assert same(other_seed, initial(seed=1))
    # PyTorch's Linear initialisation: weights and bias uniform in +-1/sqrt(fan_in)
    for key, value in group(drawn, HEAD_P).items():
        layer = key.rsplit(".", 1)[0]
        bound = 1 / np.sqrt(group(drawn, HEAD_P)[layer + ".weight"].shape[1])
        assert np.abs(value).max() <= bound
        assert value.ndim == 1 or np.abs(value).max() > 0.95 * bound  # weights fill it


def test_random_private_init_changes_nothing_without_a_private_head() -> None:
    config = {"fedreg-private-head": False}
    drawn = FedReGClient(make_setup(**config, **{"fedreg-private-init": "random"}))
    copied = FedReGClient(make_setup(**config))
    assert drawn.model.head_p is None
    assert same(drawn.train(global_arrays(), 1).arrays, copied.train(global_arrays(), 1).arrays)


@pytest.mark.parametrize("optimizer_state", ["persistent", "fresh"])
def test_each_steps_lr_replaces_the_runs_lr_in_its_step_only(optimizer_state: str) -> None:
    """{lr 0.03, both steps 0.01} is {lr 0.01}; {step 1 at 0.03} is {lr 0.03, step 2 at
    0.01}: each key sets its own step's rate and nothing else, momentum kept or not."""
    config = {"local-epochs": 2, "optimizer-state": optimizer_state}
    both = two_rounds(FedReGClient, **config, lr=0.03,
                      **{"fedreg-step1-lr": 0.01, "fedreg-step2-lr": 0.01})  # fmt: skip
    plain = two_rounds(FedReGClient, **config, lr=0.01)
    first = two_rounds(FedReGClient, **config, lr=0.01, **{"fedreg-step1-lr": 0.03})
    second = two_rounds(FedReGClient, **config, lr=0.03, **{"fedreg-step2-lr": 0.01})
    for a, b in ((both, plain), (first, second)):
        assert same(a[0], b[0]) and a[2] == b[2]
        assert set(a[1]) == set(b[1])
        for name in a[1]:
            assert same(from_record(a[1][name]), from_record(b[1][name])), name
    assert not same(first[0], plain[0])


def test_a_steps_lr_moves_only_its_step() -> None:
    """One pass of each step from the same weights: step 1 at 0.03 moves base and head_p
    three times as far as at 0.01 (the first step of SGD with momentum is lr * grad)."""
    deltas = {}
    for lr in (0.01, 0.03):
        client = Recording(make_setup(**{"fedreg-step1-lr": lr, "batch-size": 64,
                                         "drop-last": False}))  # fmt: skip
        client.train(global_arrays(), 1)
        _, _, before, after = client.calls[0]
        deltas[lr] = {k: after[k] - before[k] for k in before if not k.startswith(HEAD_G)}
    for key, small in deltas[0.01].items():
        np.testing.assert_allclose(deltas[0.03][key], 3 * small, rtol=1e-3, atol=1e-6)


def test_the_switches_run_through_a_federation_and_resume_to_the_same_run(
    grey_dataset: Path, tmp_path: Path
) -> None:
    """Through the real ServerApp and ClientApp, the kept head_g in the client's state on
    disk: killed in the last round's evaluation and resumed, the run is the whole one."""
    from tests.algorithm_runs import ROUNDS, run_config
    from tests.inprocess import client_states, results
    from tests.test_algorithm_runs import assert_same_run, kill_and_resume, run_whole

    config = {**run_config("fedreg", grey_dataset, tmp_path), "eval-every": 1,
              "fedreg-personal": "kept-global", "fedreg-private-detach": True,
              "fedreg-private-init": "random", "fedreg-step1-lr": 0.02,
              "fedreg-step2-lr": 0.005, "fedreg-global-loss": "balanced-softmax",
              "fedreg-dyn-alpha": 0.01, "threshold": "auto"}  # fmt: skip
    run_whole(tmp_path, config)
    kill_and_resume(tmp_path, config, [(MessageType.EVALUATE, ROUNDS, 1)])
    assert_same_run(tmp_path)
    whole = results(tmp_path / "whole")
    assert whole["config"]["fedreg-personal"] == "kept-global"
    states = client_states(tmp_path / "sw")
    assert any(KEPT_HEAD_G in str(name) for name in states)


# --- 5. The paper's future work (§6): our variants ---------------------------------


@pytest.mark.parametrize(
    ("counts", "t"),
    [([900, 50, 30, 20], 100), ([250, 250, 250, 250], 250), ([5], 5), ([1, 1, 10], 4),
     ([60, 0, 2, 2], 8)],
)  # fmt: skip
def test_auto_threshold_is_the_largest_t_up_to_the_mean_with_half_originals(counts, t) -> None:
    # [900, 50, 30, 20]: t = 100 keeps 100 + 50 + 30 + 20 = 200 originals of 400; t = 101
    # keeps 201 of 404, under half. Balanced classes get their mean.
    assert class_threshold(torch.tensor(counts), "auto") == t


def test_auto_threshold_holds_its_definition_on_random_clients() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        present = rng.integers(1, 500, size=rng.integers(1, 11))
        t, mean = auto_threshold(present), int(np.floor(present.mean() + 0.5))
        share = np.minimum(present, t).sum() / (present.size * t)
        above = np.minimum(present, t + 1).sum() / (present.size * (t + 1))
        assert 1 <= t <= mean and share >= 0.5
        assert t == mean or above < 0.5


def test_auto_threshold_trains_fewer_rebalanced_samples_on_a_skewed_client() -> None:
    counts = (60, 2, 0, 2)  # mean 21; auto 8: (8 + 2 + 2) / (3 * 8) = 1/2
    sizes = {}
    for threshold in ("mean", "auto"):
        client = FedReGClient(make_setup(counts=counts, threshold=threshold))
        sizes[threshold] = (len(client.rebalanced().data), client.effective_samples())
    assert sizes == {"mean": (3 * 21, 21 + 2 + 2), "auto": (3 * 8, 8 + 2 + 2)}


def head_g_bias_gradient(global_loss: str) -> torch.Tensor:
    """The gradient of step 2's loss on head_g's last bias, over the whole rebalanced set."""
    client = FedReGClient(make_setup(**{"fedreg-global-loss": global_loss}))
    client.load_global(global_arrays())
    data = client.rebalanced().data
    x, y = data.x.float() / 127.5 - 1, data.y
    client.model.zero_grad()
    client.step2_loss(data)(x, y).backward()
    return client.model.head_g[-1].bias.grad.clone()


def test_balanced_softmax_in_step2_leaves_the_absent_class_alone() -> None:
    """The client lacks class 2: cross-entropy pushes its logit down, FedRoD's balanced
    softmax with the rebalanced counts (every present class at t) leaves it at zero and
    is otherwise the cross-entropy of the present classes."""
    ce, balanced = head_g_bias_gradient("ce"), head_g_bias_gradient("balanced-softmax")
    assert ce[2] > 1e-3
    assert balanced[2].abs() < 1e-12
    assert not torch.allclose(ce[[0, 1, 3]], balanced[[0, 1, 3]])


def test_dyn_alpha_keeps_feddyns_correction_and_pulls_toward_the_global_model() -> None:
    start = global_arrays()
    moved = {}
    for alpha in (0.0, 1.0):
        setup = make_setup(**{"fedreg-dyn-alpha": alpha, "local-epochs": 2})
        result = FedReGClient(setup).train(start, 1)
        moved[alpha] = sum(float(((result.arrays[k] - start[k]) ** 2).sum()) for k in start)
        if alpha == 0:
            assert CORRECTION not in setup.state
            continue
        correction = from_record(setup.state[CORRECTION])
        assert correction.keys() == result.arrays.keys() == start.keys()
        for key, value in correction.items():  # g_k = 0 - alpha (w_k - w_g)
            np.testing.assert_allclose(value, -alpha * (result.arrays[key] - start[key]), atol=1e-6)
        second = FedReGClient(setup).train(start, 2)  # starts from the stored correction
        assert not same(second.arrays, result.arrays)
    assert moved[1.0] < moved[0.0]


def test_dyn_alpha_server_subtracts_h_from_fedregs_weighted_average() -> None:
    from fedreg_app.core.config import RunConfig
    from fedreg_app.core.partition_map import PartitionMap
    from fedreg_app.core.protocol import NUM_EXAMPLES
    from strategies.fedreg import FedReGStrategy

    options = FedReGOptions(dyn_alpha=0.5)
    strategy = FedReGStrategy(RunConfig(algo="fedreg", options=options))
    strategy.set_partitions(PartitionMap(4, {p: p for p in range(4)}))
    strategy._current = {"base.w": np.array([1.0, 2.0], dtype=np.float32),
                         "head_g.b": np.array([0.0], dtype=np.float32)}  # fmt: skip
    updates = [
        ({"base.w": np.array([2.0, 2.0], np.float32), "head_g.b": np.array([1.0], np.float32)},
         {NUM_EXAMPLES: 1, EFFECTIVE_EXAMPLES: 1}),
        ({"base.w": np.array([4.0, 0.0], np.float32), "head_g.b": np.array([3.0], np.float32)},
         {NUM_EXAMPLES: 3, EFFECTIVE_EXAMPLES: 1}),
    ]  # fmt: skip
    result = strategy.aggregate_updates(1, updates)
    # base: average by |D_k| (1, 3) = (3.5, 0.5); drift (1, 0) + (3, -2) = (4, -2);
    # h = -0.5 (4, -2) / 4 = (-0.5, 0.25); w = (3.5 + 1, 0.5 - 0.5)
    np.testing.assert_allclose(strategy.h["base.w"], [-0.5, 0.25])
    np.testing.assert_allclose(result["base.w"], [4.5, 0.0])
    # head_g: average by e_k (1, 1) = 2; drift 1 + 3 = 4; h = -0.5; w = 2 + 1
    np.testing.assert_allclose(result["head_g.b"], [3.0])
    arrays, state = strategy.state_dict()
    assert set(arrays) == {"base.w", "head_g.b"}
    restored = FedReGStrategy(RunConfig(algo="fedreg", options=options))
    restored.load_state_dict(arrays, state)
    assert same(restored.h, strategy.h)


def test_without_dyn_alpha_the_server_is_fedregs_weighted_average() -> None:
    from fedreg_app.core.config import RunConfig
    from strategies.base import weighted_average_by_group
    from strategies.fedreg import FedReGStrategy

    strategy = FedReGStrategy(RunConfig(algo="fedreg"))
    updates = [(global_arrays(seed), {"num-examples": 1 + seed, EFFECTIVE_EXAMPLES: 2 - seed})
               for seed in (0, 1)]  # fmt: skip
    ours = strategy.aggregate_updates(1, updates)
    assert same(ours, weighted_average_by_group(updates, strategy.group_weights))
    assert strategy.h == {} and strategy.state_dict()[0] == {}


def test_a_run_records_the_clients_mean_weight_of_the_received_head(
    grey_dataset: Path, tmp_path: Path
) -> None:
    from fedreg_app.core.metrics import record_problem
    from tests.inprocess import results, run_server

    base = {"algo": "fedreg", "dataset-path": str(grey_dataset), "local-epochs": 1,
            "fraction-train": 1.0, "min-partition-size": 5, "num-server-rounds": 2,
            "seed": 5}  # fmt: skip
    for personal, expected in (("weighted", 0.5), ("learned", None), ("sum", "absent")):
        folder = tmp_path / personal
        run_server({**base, "fedreg-personal": personal, "results-dir": str(folder)})
        document = results(folder)
        assert record_problem(document) is None, personal
        weights = [r["personal_global_weight"] for r in document["rounds"]]
        if expected == "absent":
            assert weights == [None, None]
        elif expected is None:  # fitted per client: a mean of numbers >= 0
            assert all(isinstance(w, float) and w >= 0 for w in weights), weights
        else:
            assert weights == [expected, expected]
