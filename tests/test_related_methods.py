"""The related papers' methods: what defines each one."""

from __future__ import annotations

import numpy as np
import pytest

from clients.fedbabu_deviation import FINETUNE_PHASE, FedBABUDeviationClient
from clients.fedseq import FINETUNED, FedSeqClient, unfreeze_rounds
from clients.lg_fedavg import LGFedAvgClient
from fedreg_app.core.config import ConfigError, RunConfig
from fedreg_app.core.models import BASE, HEAD_G, build_model
from fedreg_app.core.partition_map import PartitionMap
from fedreg_app.core.records import from_record
from fedreg_app.registry import load_config
from strategies.fedbabu_deviation import (
    FedBABUDeviationStrategy,
    deviation_round,
    window_sigma,
)
from strategies.fedseq import FedSeqAntiStrategy, FedSeqStrategy
from strategies.lg_fedavg import LGFedAvgStrategy
from tests.test_baselines import recording
from tests.test_clients import INFO, global_arrays, group, make_setup, same


def test_lg_fedavg_shares_the_head_and_keeps_its_own_base() -> None:
    strategy = LGFedAvgStrategy(RunConfig(algo="lg-fedavg"))
    sent = strategy.arrays_to_send(global_arrays(), None)
    assert set(sent) == set(group(global_arrays(), HEAD_G))
    setup = make_setup(algo="lg-fedavg")
    first = LGFedAvgClient(setup).train(global_arrays(), 1)
    kept_base = group(first.arrays, BASE)
    assert same(from_record(setup.state[BASE]), kept_base)
    # The next round starts from the client's own base and the server's head.
    client = recording(LGFedAvgClient)(setup)
    client.train(global_arrays(seed=3), 2)
    before = client.steps[0][0]
    assert same(group(before, BASE), kept_base)
    assert same(group(before, HEAD_G), group(global_arrays(seed=3), HEAD_G))


def fedseq_config(**extra) -> dict:
    return {"algo": "fedseq-vanilla", "num-server-rounds": 6, "fedseq-unfreeze-rounds": "1,3,5",
            "fedseq-finetune-rounds": 1, **extra}  # fmt: skip


def layers_of(arrays: dict) -> set[str]:
    return {".".join(key.split(".")[:2]) for key in arrays}


ALL_BASE = {"base.0", "base.3", "base.7"}  # conv1, conv2, fc1 of the ConvNet, head-depth 2


@pytest.mark.parametrize(
    ("strategy_type", "expected"),
    [
        (FedSeqStrategy, {1: {"base.0"}, 3: {"base.0", "base.3"}, 5: ALL_BASE}),
        (FedSeqAntiStrategy, {1: {"base.7"}, 4: {"base.7", "base.3"}, 5: ALL_BASE}),
    ],
)
def test_fedseq_sends_only_unfrozen_base_layers(strategy_type, expected: dict) -> None:
    strategy = strategy_type(load_config(fedseq_config()))
    model = build_model(INFO, 2, 0)
    strategy.prepare_model(model)
    arrays = model.group_state(BASE, HEAD_G)
    for server_round, layers in expected.items():
        assert layers_of(strategy.arrays_to_send(arrays, server_round)) == layers
    # fine-tuning (round 6) and evaluation (None): the whole model
    assert strategy.arrays_to_send(arrays, 6).keys() == arrays.keys()
    assert strategy.arrays_to_send(arrays, None).keys() == arrays.keys()


def test_a_client_names_fedseqs_reply_entries_as_the_server_checks_them() -> None:
    """Local DP's reference: the ClientApp names the entries a reply carries with the
    strategy's class-level code, without building a strategy, and gets what the server's
    strategy expects in every phase (only the unfrozen layers, then everything)."""
    config = load_config(fedseq_config())
    strategy = FedSeqStrategy(config)
    strategy.prepare_model(build_model(INFO, 2, 0))
    arrays = strategy.model.group_state(BASE, HEAD_G)
    strategy._current = arrays
    fresh = build_model(INFO, 2, 0)
    for server_round in range(1, 7):
        by_class = FedSeqStrategy.reply_entries(config, fresh, arrays, server_round)
        assert by_class.keys() == strategy.expected_reply_arrays(server_round).keys()
    assert layers_of(FedSeqStrategy.reply_entries(config, fresh, arrays, 1)) == {"base.0"}


def test_fedseq_client_trains_and_returns_only_unfrozen_layers() -> None:
    setup = make_setup(**fedseq_config())
    start = global_arrays()
    sent = {k: v for k, v in start.items() if k.startswith(("base.0.", "base.3."))}
    result = FedSeqClient(setup).train(sent, server_round=3)  # as the strategy sends them
    assert layers_of(result.arrays) == {"base.0", "base.3"}
    assert not same(group(result.arrays, "base"), {k: start[k] for k in result.arrays})
    finetune = FedSeqClient(make_setup(**fedseq_config())).train(start, server_round=6)
    assert finetune.arrays.keys() == start.keys()  # base + head in the last round


def test_fedseq_fine_tunes_locally_and_evaluates_its_own_fine_tuned_model() -> None:
    """004, Algorithm 1 lines 20-26: fine-tune rounds continue each client's own model."""
    config = fedseq_config(**{"num-server-rounds": 7, "fedseq-finetune-rounds": 2})
    setup = make_setup(**config)
    start = global_arrays()
    global_only = FedSeqClient(setup)
    global_only.evaluate(start, server_round=5)  # no fine-tuned model yet: the global one
    assert same(global_only.model.group_state(BASE, HEAD_G), start)
    first = FedSeqClient(setup).train(start, server_round=6).arrays
    assert FINETUNED in setup.state and same(from_record(setup.state[FINETUNED]), first)
    other_global = global_arrays(seed=9)  # what the server sends is not used any more
    second = FedSeqClient(setup).train(other_global, server_round=7).arrays
    replay = make_setup(**config)
    FedSeqClient(replay).train(start, server_round=6)
    assert same(FedSeqClient(replay).train(start, server_round=7).arrays, second)
    evaluator = FedSeqClient(setup)
    evaluator.evaluate(other_global, server_round=7)
    assert same(evaluator.model.group_state(BASE, HEAD_G), second)  # the personal model


def test_fedseq_schedule_errors_name_the_key() -> None:
    strategy = FedSeqStrategy(load_config(fedseq_config(**{"fedseq-unfreeze-rounds": "1,5"})))
    with pytest.raises(
        ConfigError, match="fedseq-unfreeze-rounds='1,5' is not allowed: expected 3"
    ):
        strategy.prepare_model(build_model(INFO, 2, 0))
    even = load_config(fedseq_config(**{"fedseq-unfreeze-rounds": ""}))
    assert unfreeze_rounds(even, 3) == [1, 2, 4]  # 5 training rounds over 3 layers


def test_deviation_rule_triggers_where_sigma_falls_and_flattens() -> None:
    rising_then_settling = [0.10, 0.14, 0.17, 0.16, 0.12, 0.100, 0.0995, 0.0990]
    # t=3..6: falling but still bending (|2nd difference| >= 0.0195); t=7: falling and flat
    assert deviation_round(rising_then_settling, epsilon=0.002) == 7
    assert deviation_round([0.1, 0.12, 0.14, 0.16, 0.18], epsilon=0.01) is None  # rising
    assert deviation_round([0.3, 0.2, 0.05, 0.0], epsilon=0.01) is None  # falling steeply
    history = [[0.5, 0.7], [0.6, 0.6], [0.4, 0.8]]
    assert window_sigma(history, 2) == pytest.approx(np.std([0.6, 0.6, 0.4, 0.8]))
    assert window_sigma(history[:1], 2) is None


def test_deviation_strategy_fixes_r_then_fine_tunes_everyone_and_stops() -> None:
    keys = {"deviation-window": 1, "deviation-epsilon": 0.005, "deviation-finetune-rounds": 2}
    config = load_config({"algo": "fedbabu-deviation", "num-server-rounds": 20, **keys})
    strategy = FedBABUDeviationStrategy(config)
    strategy.set_partitions(PartitionMap(10, {p: p for p in range(10)}))
    spreads = [0.1, 0.2, 0.3, 0.22, 0.15, 0.081]  # sigma rises, falls, flattens at round 6
    for server_round, spread in enumerate(spreads, start=1):
        assert strategy.group_weights == {BASE: "num-examples"}  # base only before R
        strategy.record_accuracies(server_round, [0.5 - spread, 0.5 + spread])
    assert strategy.fine_tune_round == 6
    assert strategy.group_weights == {BASE: "num-examples", HEAD_G: "num-examples"}
    assert strategy.finetuning(7) and strategy.sample_partitions(7) == list(range(10))
    assert not strategy.finished(7) and strategy.finished(8)
    assert strategy.report()["fine_tune_round"] == 6
    with pytest.raises(ConfigError, match="eval-every=2"):
        load_config({"algo": "fedbabu-deviation", "eval-every": 2})


def test_deviation_client_fine_tunes_base_and_head_only_when_told() -> None:
    setup = make_setup(algo="fedbabu-deviation")
    base_only = {k: v for k, v in global_arrays().items() if k.startswith(BASE + ".")}
    client = FedBABUDeviationClient(setup)
    assert layers_of(client.train(base_only, 1).arrays) <= ALL_BASE  # FedBABU: base
    client = FedBABUDeviationClient(setup)
    client.server_config = {FINETUNE_PHASE: True}
    assert client.train(global_arrays(), 7).arrays.keys() == global_arrays().keys()
    with pytest.raises(KeyError, match="expected the groups"):  # the head before its phase
        FedBABUDeviationClient(setup).train(global_arrays(), 1)


@pytest.mark.parametrize("crafted", ["false", "true", 0, 1, None, 1.0])
def test_deviation_client_refuses_a_phase_that_is_not_a_bool(crafted: object) -> None:
    """The strategy sends a bool; a string "false" read as truthy would switch the client
    to training its head (and an int 0/1 or a float would be taken on trust)."""
    client = FedBABUDeviationClient(make_setup(algo="fedbabu-deviation"))
    client.server_config = {FINETUNE_PHASE: crafted}
    with pytest.raises(ValueError, match=f"{FINETUNE_PHASE}={crafted!r}"):
        client.train(global_arrays(), 7)


def test_deviation_server_sends_the_head_only_from_the_fine_tune_phase_on() -> None:
    strategy = FedBABUDeviationStrategy(
        load_config(
            {"algo": "fedbabu-deviation", "num-server-rounds": 6, "deviation-finetune-rounds": 2}
        )  # fmt: skip
    )
    assert {k.split(".")[0] for k in strategy.arrays_to_send(global_arrays(), None)} == {BASE}
    strategy.fine_tune_round = 3
    assert strategy.arrays_to_send(global_arrays(), None).keys() == global_arrays().keys()
