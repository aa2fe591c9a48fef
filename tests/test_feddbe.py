"""FedDBE: the client's bias (PRBM), the mean regularisation (MR), and the global mean
the server fixes once and keeps through a checkpoint."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Message, RecordDict

from clients.base import TrainResult
from clients.feddbe import (
    BIAS_KEY,
    BIAS_RECORD,
    MEAN_KEY,
    FedDBEClient,
    FedDBEOptions,
    mean_regulariser,
)
from fedreg_app.core.checkpoint import Checkpoint
from fedreg_app.core.config import ConfigError, RunConfig
from fedreg_app.core.models import BASE, EXTRA, HEAD_G, SplitModel, build_model, initial_model
from fedreg_app.core.protocol import NUM_EXAMPLES, NUM_PROCESSED
from fedreg_app.core.records import from_record
from fedreg_app.registry import load_config
from strategies.feddbe import FedDBEStrategy
from tests.inprocess import train_reply
from tests.test_clients import INFO, group, same
from tests.test_clients import make_setup as make_any_setup

COUNTS = (12, 3, 0, 5)  # small on purpose: 20 samples, 2 whole batches of 8 an epoch


def make_setup(state: RecordDict | None = None, **config):
    """A FedDBE client's setup (``algo='feddbe'``: its options are FedDBE's)."""
    return make_any_setup(state, COUNTS, **{"algo": "feddbe", **config})


def server_model(seed: int = 0) -> SplitModel:
    """The server's initial model at the clients' head-depth 2: the ConvNet plus
    ``extra.mr.mean``."""
    model = build_model(INFO, 2, seed)
    FedDBEStrategy.add_modules(RunConfig(), model)
    return model


def sent(global_mean: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """A training message's arrays: base and head, and g once the server has fixed it."""
    arrays = server_model().group_state(BASE, HEAD_G)
    return arrays if global_mean is None else {**arrays, MEAN_KEY: global_mean}


def bias_of(client: FedDBEClient) -> np.ndarray:
    return client.bias.detach().numpy().copy()


def copied(state: RecordDict) -> RecordDict:
    return RecordDict({name: copy.deepcopy(record) for name, record in state.items()})


@dataclass(frozen=True)
class Trained:
    """One training: the state it updated, its procedure, its reply, the bias it began with."""

    state: RecordDict
    client: FedDBEClient
    result: TrainResult
    bias_before: np.ndarray


def train(state: RecordDict, server_round: int, arrays: dict, **config) -> Trained:
    """A fresh procedure (as for each message) trains ``server_round`` from ``state``."""
    client = FedDBEClient(make_setup(state, **config))
    client.restore_private()
    before = bias_of(client)
    return Trained(state, client, client.train(arrays, server_round), before)


@pytest.fixture(scope="module")
def round_one() -> Trained:
    """A client's training before g exists (trained once for the module: shared CPU)."""
    return train(RecordDict(), 1, sent())


@pytest.fixture(scope="module")
def global_mean(round_one: Trained) -> np.ndarray:
    """A g away from the client's own mean feature."""
    return (0.5 * round_one.result.arrays[MEAN_KEY]).astype(np.float32)


@pytest.fixture(scope="module")
def round_two(round_one: Trained, global_mean: np.ndarray) -> Trained:
    """The same client's next training, with g."""
    return train(copied(round_one.state), 2, sent(global_mean))


# ------------------------------------------------------------------ the client
def test_before_the_global_mean_a_client_trains_plainly_and_replies_its_running_mean(
    round_one: Trained,
) -> None:
    reply = round_one.result.arrays
    assert set(reply) == set(sent()) | {MEAN_KEY}  # base, head and m_k; never the bias
    np.testing.assert_array_equal(reply[MEAN_KEY], round_one.client.running_mean.numpy())
    assert reply[MEAN_KEY].shape == (384,) and np.abs(reply[MEAN_KEY]).sum() > 0
    assert not same(group(reply, BASE), group(sent(), BASE))  # it trained
    # the bias starts at zero and is not trained without g
    assert not round_one.bias_before.any() and not bias_of(round_one.client).any()
    assert round_one.result.metrics[NUM_EXAMPLES] == 20
    assert round_one.result.metrics[NUM_PROCESSED] == 16


def test_with_the_global_mean_the_bias_trains_is_kept_and_never_sent(
    round_two: Trained,
) -> None:
    assert not round_two.bias_before.any()  # round one left it at zero
    bias = bias_of(round_two.client)
    assert np.abs(bias).sum() > 0
    assert set(round_two.result.arrays) == set(sent())  # base and head only
    kept = from_record(round_two.state[BIAS_RECORD])
    assert set(kept) == {BIAS_KEY}
    np.testing.assert_array_equal(kept[BIAS_KEY], bias)
    # a later message's procedure starts from the kept bias, whatever the server sends
    later = FedDBEClient(make_setup(copied(round_two.state)))
    later.load_global(sent())
    later.restore_private()
    np.testing.assert_array_equal(bias_of(later), bias)


def test_a_running_mean_is_an_average_of_batch_means_reset_at_each_training(
    round_one: Trained,
) -> None:
    """m_k <- (1 - momentum) m_k + momentum * batch mean; a new training starts it at zero
    (here from 100s, with the same reply as the fresh client's: same seed, same weights)."""
    client = FedDBEClient(make_setup(**{"feddbe-momentum": 0.25}))
    batches = [torch.randn(8, 384) for _ in range(3)]
    expected = torch.zeros(384)
    for features in batches:
        expected = 0.75 * expected + 0.25 * features.mean(dim=0)
        tracked = client.track_mean(features)
    torch.testing.assert_close(client.running_mean, expected)
    torch.testing.assert_close(tracked, expected)

    again = FedDBEClient(make_setup(RecordDict()))
    again.running_mean.fill_(100.0)
    result = again.train(sent(), server_round=1)
    for key, value in round_one.result.arrays.items():
        np.testing.assert_array_equal(result.arrays[key], value, err_msg=key)


def test_the_same_seed_gives_the_same_weights_and_bias_with_dbe(
    round_one: Trained, round_two: Trained, global_mean: np.ndarray
) -> None:
    again = train(copied(round_one.state), 2, sent(global_mean))
    for key, value in round_two.result.arrays.items():
        np.testing.assert_array_equal(again.result.arrays[key], value, err_msg=key)
    np.testing.assert_array_equal(bias_of(again.client), bias_of(round_two.client))


def test_mr_is_zero_at_the_global_mean_and_its_gradient_points_toward_it() -> None:
    g = torch.randn(384)
    assert mean_regulariser(g, g).item() == 0.0
    running = (g + torch.randn(384)).requires_grad_()
    mean_regulariser(running, g).backward()
    torch.testing.assert_close(running.grad, (running - g).detach() / 384)
    stepped = running.detach() - 100.0 * running.grad  # one descent step
    assert torch.dist(stepped, g) < torch.dist(running.detach(), g)


def test_mr_pulls_the_clients_mean_feature_toward_the_global_mean(
    round_one: Trained, round_two: Trained, global_mean: np.ndarray
) -> None:
    """The same round without MR (kappa 0) and with it (the default kappa): with MR the
    mean of the client's train features after training is much nearer to g."""
    g = torch.as_tensor(global_mean)
    without = train(copied(round_one.state), 2, sent(global_mean), **{"feddbe-kappa": 0.0})
    distance = {
        name: torch.dist(t.client.base_features(t.client.data.train).x.mean(dim=0), g).item()
        for name, t in (("without", without), ("with", round_two))
    }
    assert distance["with"] < 0.5 * distance["without"], distance


def test_personal_prediction_adds_the_bias_the_global_model_has_none(
    round_two: Trained,
) -> None:
    client = round_two.client
    features = torch.randn(5, 384)
    bias = client.bias.detach()
    with torch.no_grad():
        personal = client.personal_head(features)
        torch.testing.assert_close(personal, client.model.head_g(features + bias))
        config = load_config({"algo": "feddbe", "head-depth": 2})
        arrays = {**client.model.group_state(BASE, HEAD_G), MEAN_KEY: np.zeros(384, np.float32)}
        base, head = FedDBEStrategy.global_parts(config, server_model(), arrays)
        torch.testing.assert_close(head(features), client.model.head_g(features))
        assert not torch.allclose(personal, head(features))
    assert not client.personal_head_is(head)  # evaluation runs both heads


def test_a_message_with_other_extra_entries_is_refused() -> None:
    client = FedDBEClient(make_setup())
    with pytest.raises(KeyError, match="expected at most"):
        client.load_global({**sent(), BIAS_KEY: np.zeros(384, np.float32)})


def test_the_keys_are_checked() -> None:
    assert FedDBEOptions.declared() == {"feddbe-kappa": 50.0, "feddbe-momentum": 1.0}
    for key, value in (("feddbe-kappa", -1.0), ("feddbe-momentum", 0.0)):
        with pytest.raises(ConfigError, match=key):
            load_config({"algo": "feddbe", key: value})


# ------------------------------------------------------------------ the server
def make_strategy(**config) -> FedDBEStrategy:
    run_config = load_config({"algo": "feddbe", **config})
    strategy = FedDBEStrategy(run_config)
    strategy.prepare_model(initial_model(INFO, run_config))
    strategy._current = {k: v.numpy().copy() for k, v in strategy.model.state_dict().items()}
    return strategy


def replies(strategy: FedDBEStrategy, server_round: int, means: list) -> list[Message]:
    """Two clients (10 and 30 samples) with shifted weights and, where given, m_k."""
    shared = strategy.expected_reply_arrays(server_round)
    out = []
    for partition, (examples, mean) in enumerate(zip((10, 30), means, strict=True)):
        arrays = {k: v + partition + 1 for k, v in shared.items() if k != MEAN_KEY}
        counts = {NUM_EXAMPLES: examples, NUM_PROCESSED: examples}
        out.append(train_reply(partition, {**arrays, **mean}, **counts))
    return out


def fix_the_mean(strategy: FedDBEStrategy, server_round: int) -> np.ndarray:
    """Aggregate a round whose replies carry m_k; returns the new global arrays."""
    means = [{MEAN_KEY: np.full(192, v, np.float32)} for v in (1.0, 5.0)]
    aggregated, _ = strategy.aggregate_train(server_round, replies(strategy, server_round, means))
    strategy._current = from_record(aggregated)
    return strategy._current[MEAN_KEY]


def test_the_server_fixes_g_from_the_first_round_and_sends_it_from_then_on() -> None:
    strategy = make_strategy()
    assert MEAN_KEY in strategy.expected_reply_arrays(1)
    assert EXTRA not in {k.split(".")[0] for k in strategy.arrays_to_send(strategy._current, 1)}
    g = fix_the_mean(strategy, 1)
    np.testing.assert_allclose(g, (10 * 1.0 + 30 * 5.0) / 40)  # the |D_k|-weighted mean
    assert strategy.mean_round == 1 and strategy.report() == {"global_mean_round": 1}
    # round 2: replies without m_k, g sent and never averaged again
    assert MEAN_KEY not in strategy.expected_reply_arrays(2)
    assert set(FedDBEStrategy.reply_entries(strategy.config, None, strategy._current, 2)) == set(
        strategy.expected_reply_arrays(2)
    )
    np.testing.assert_array_equal(strategy.arrays_to_send(strategy._current, 2)[MEAN_KEY], g)
    aggregated, _ = strategy.aggregate_train(2, replies(strategy, 2, [{}, {}]))
    after = from_record(aggregated)
    np.testing.assert_array_equal(after[MEAN_KEY], g)
    assert not np.array_equal(after["base.0.weight"], strategy._current["base.0.weight"])


def test_a_first_round_that_aggregates_nothing_leaves_g_to_the_next() -> None:
    strategy = make_strategy(**{"min-train-replies": 2})
    assert strategy.aggregate_train(1, []) == (None, None)
    assert strategy.mean_round is None and MEAN_KEY in strategy.expected_reply_arrays(2)
    fix_the_mean(strategy, 2)
    assert strategy.mean_round == 2


def test_g_and_its_round_survive_a_checkpoint_round_trip(tmp_path: Path) -> None:
    strategy = make_strategy()
    g = fix_the_mean(strategy, 1)
    arrays, state = strategy.state_dict()
    Checkpoint(1, strategy._current, arrays, state, "key", {"algo": "feddbe"}).save(tmp_path)
    loaded, _ = Checkpoint.load(tmp_path)
    resumed = make_strategy()
    resumed.load_state_dict(loaded.strategy_arrays, loaded.strategy_state)
    assert resumed.mean_round == 1
    assert resumed.group_weights == {BASE: NUM_EXAMPLES, HEAD_G: NUM_EXAMPLES}
    np.testing.assert_array_equal(resumed.arrays_to_send(loaded.model, 2)[MEAN_KEY], g)
    assert MEAN_KEY not in resumed.expected_reply_arrays(2, loaded.model)
