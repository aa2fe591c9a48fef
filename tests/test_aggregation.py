"""Server aggregation: FedReG weights base by |D_k| and head_g by e_k (paper eq. 4-5)."""

from __future__ import annotations

import numpy as np
import pytest

from clients.fedreg import EFFECTIVE_EXAMPLES
from fedreg_app.core.config import RunConfig
from fedreg_app.core.models import initial_model
from fedreg_app.core.partition_map import PartitionMap
from fedreg_app.core.protocol import NUM_EXAMPLES
from fedreg_app.registry import ALGORITHMS, load_config
from strategies.base import aggregation_weights, sample_size, weighted_average_by_group
from strategies.fedavg import FedAvgStrategy
from strategies.fedreg import FedReGStrategy
from tests.test_clients import INFO


def update(base: float, head: float, n: int, e: int):
    arrays = {
        "base.0.weight": np.full((2, 2), base, dtype=np.float32),
        "head_g.0.bias": np.full((3,), head, dtype=np.float32),
    }
    return arrays, {NUM_EXAMPLES: n, EFFECTIVE_EXAMPLES: e}


UPDATES = [
    update(1.0, 10.0, n=100, e=20),
    update(3.0, 20.0, n=300, e=60),
    update(5.0, 40.0, n=600, e=20),
]


def test_fedreg_weights_each_group_by_its_own_count() -> None:
    weights = aggregation_weights(UPDATES, FedReGStrategy(RunConfig()).group_weights)
    assert weights["base"] == pytest.approx([0.1, 0.3, 0.6])
    assert weights["head_g"] == pytest.approx([0.2, 0.6, 0.2])
    for shares in weights.values():
        assert sum(shares) == pytest.approx(1.0)


def test_fedreg_aggregate_matches_hand_computed_values() -> None:
    strategy = FedReGStrategy(RunConfig())
    result = strategy.aggregate_updates(1, UPDATES)
    # base: 0.1*1 + 0.3*3 + 0.6*5 = 4.0 ; head_g: 0.2*10 + 0.6*20 + 0.2*40 = 22.0
    np.testing.assert_allclose(result["base.0.weight"], 4.0)
    np.testing.assert_allclose(result["head_g.0.bias"], 22.0)
    assert result["base.0.weight"].dtype == np.float32


def test_fedavg_weights_everything_by_train_size() -> None:
    result = FedAvgStrategy(RunConfig(algo="fedavg")).aggregate_updates(1, UPDATES)
    np.testing.assert_allclose(result["base.0.weight"], 4.0)
    # head: 0.1*10 + 0.3*20 + 0.6*40 = 31.0
    np.testing.assert_allclose(result["head_g.0.bias"], 31.0)


def test_private_head_received_by_the_server_is_refused() -> None:
    arrays, metrics = update(1.0, 1.0, 1, 1)
    arrays["head_p.0.bias"] = np.zeros(3, dtype=np.float32)
    with pytest.raises(KeyError, match="head_p"):
        weighted_average_by_group([(arrays, metrics)], FedReGStrategy(RunConfig()).group_weights)


def test_zero_total_weight_is_an_error() -> None:
    with pytest.raises(ValueError, match="sum to 0"):
        aggregation_weights([update(1, 1, n=0, e=0)], FedReGStrategy(RunConfig()).group_weights)


def test_sampling_is_seeded_and_the_same_for_every_algorithm() -> None:
    def draws(strategy_type, seed: int) -> list[list[int]]:
        strategy = strategy_type(RunConfig(seed=seed))
        strategy.set_partitions(PartitionMap(20, {p: 1000 + p for p in range(20)}))
        return [strategy.sample_partitions(0) for _ in range(5)]

    assert draws(FedReGStrategy, 0) == draws(FedAvgStrategy, 0)
    assert draws(FedReGStrategy, 0) != draws(FedReGStrategy, 1)
    assert all(len(d) == 5 and len(set(d)) == 5 for d in draws(FedReGStrategy, 0))


def test_sample_size() -> None:
    assert sample_size(20, 0.25) == 5
    assert sample_size(100, 0.2) == 20
    assert sample_size(100, 0.29) == 29
    assert sample_size(3, 0.1) == 1


def test_payload_bytes_counts_every_message_and_cost_totals_sum() -> None:
    from types import SimpleNamespace

    from flwr.app import RecordDict

    from fedreg_app.core.protocol import (
        COMPUTE_SECONDS,
        HANDLER_SECONDS,
        SETUP_SECONDS,
        STATE_SECONDS,
    )
    from fedreg_app.core.records import to_record
    from fedreg_app.server_app import payload_bytes
    from strategies.base import cost_totals

    record = RecordDict({"arrays": to_record({"base.w": np.zeros((3, 4), np.float32)})})
    messages = [SimpleNamespace(content=record) for _ in range(2)]  # as Message.content
    serialized = len(record["arrays"]["base.w"].data)  # .npy bytes: data plus a header
    assert 3 * 4 * 4 < serialized < 3 * 4 * 4 + 256
    assert payload_bytes(messages) == 2 * serialized
    replies = [{COMPUTE_SECONDS: 1.5, HANDLER_SECONDS: 2.0, STATE_SECONDS: 0.25},
               {COMPUTE_SECONDS: 0.5, SETUP_SECONDS: 0.125}]  # fmt: skip
    assert cost_totals(replies) == {COMPUTE_SECONDS: 2.0, HANDLER_SECONDS: 2.0,
                                    SETUP_SECONDS: 0.125, STATE_SECONDS: 0.25}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_client_names_the_reply_entries_as_the_server_expects_them(name: str) -> None:
    """Local DP's reference: a client names the entries of its first reply with the
    class-level ``reply_entries`` (no strategy built); the server's strategy checks the
    reply against the same entries."""
    strategy_cls = ALGORITHMS[name].strategy
    config = load_config({"algo": name, "num-server-rounds": 6})
    strategy = strategy_cls(config)
    strategy.prepare_model(initial_model(INFO, config))
    strategy._current = {k: v.numpy() for k, v in strategy.model.state_dict().items()}
    fresh = initial_model(INFO, config)
    strategy_cls.add_modules(config, fresh)
    by_class = strategy_cls.reply_entries(config, fresh, strategy._current, 1)
    assert by_class.keys() == strategy.expected_reply_arrays(1).keys()
