"""FedAvg-FT, FedALA and FedAS: each one's distinctive step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from clients.fedala import ALA_WEIGHTS, LOCAL_MODEL, FedALAClient, loss_settled, merge_layers
from clients.fedas import (
    FIM_TRACE,
    FedASClient,
    alignment_loss,
    class_prototypes,
    fisher_trace,
)
from clients.fedavg import FedAvgClient
from clients.fedavg_ft import FedAvgFTClient
from fedreg_app.core.config import ConfigError, RunConfig
from fedreg_app.core.data import TensorData
from fedreg_app.core.models import BASE, HEAD_G
from fedreg_app.core.protocol import NUM_EXAMPLES
from fedreg_app.core.records import from_record
from fedreg_app.registry import load_config
from strategies.fedas import FedASStrategy, trace_problem
from strategies.privacy import check_privacy_allowed
from tests.test_baselines import recording
from tests.test_clients import global_arrays, group, make_setup, same


def state_snapshot(state) -> dict[str, dict[str, np.ndarray]]:
    return {name: from_record(record) for name, record in state.items()}


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)


def evaluated(procedure, setup, arrays, server_round):
    """The procedure's model after a personal evaluation of ``arrays`` (its own copy)."""
    client = procedure(setup)
    client.evaluate(arrays, server_round)
    return client.model.group_state(BASE, HEAD_G)


# ----------------------------------------------------------------- FedAvg-FT
def test_fedavg_ft_evaluates_a_fine_tuned_copy_and_keeps_nothing_of_it() -> None:
    setup = make_setup(algo="fedavg-ft")
    sent = FedAvgFTClient(setup).train(global_arrays(), 1).arrays
    before = state_snapshot(setup.state)
    personal = evaluated(FedAvgFTClient, setup, sent, 1)
    assert not same(group(personal, BASE), group(sent, BASE))  # the whole model moved
    assert not same(group(personal, HEAD_G), group(sent, HEAD_G))
    assert same_state(state_snapshot(setup.state), before)
    # Training is FedAvg's, bit for bit
    assert same(FedAvgClient(make_setup(algo="fedavg")).train(global_arrays(), 1).arrays, sent)


def test_fedavg_ft_head_scope_leaves_the_base_as_the_server_sent_it() -> None:
    personal = evaluated(FedAvgFTClient, make_setup(algo="fedavg-ft", **{"ft-scope": "head"}),
                         global_arrays(), 1)  # fmt: skip
    assert same(group(personal, BASE), group(global_arrays(), BASE))
    assert not same(group(personal, HEAD_G), group(global_arrays(), HEAD_G))


@pytest.mark.parametrize(("settings", "server_round", "tuned"), [
    ({"ft-when": "final", "num-server-rounds": 3}, 2, False),
    ({"ft-when": "final", "num-server-rounds": 3}, 3, True),
    ({"ft-epochs": 0}, 1, False),
])  # fmt: skip
def test_fedavg_ft_fine_tunes_only_when_asked(settings, server_round, tuned) -> None:
    personal = evaluated(FedAvgFTClient, make_setup(algo="fedavg-ft", **settings),
                         global_arrays(), server_round)  # fmt: skip
    assert same(personal, global_arrays()) is not tuned


def test_fedavg_ft_refuses_an_unknown_scope_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="ft-scope.*model, head"):
        load_config({"algo": "fedavg-ft", "ft-scope": "base"})


# -------------------------------------------------------------------- FedALA
def test_fedala_merges_the_top_layers_only() -> None:
    model = FedALAClient(make_setup(algo="fedala")).model
    last = [n for n in model.parameter_names_of(HEAD_G) if n.startswith("head_g.2.")]
    assert merge_layers(model, 1) == last  # head-depth 2: the last of its two Linear layers
    two = merge_layers(model, 2)
    assert two[-2:] == last and len(two) == 4 and all(n.startswith(HEAD_G) for n in two)


def test_fedala_first_training_is_fedavgs_and_keeps_the_local_model() -> None:
    setup = make_setup(algo="fedala")
    sent = FedALAClient(setup).train(global_arrays(), 1).arrays
    assert same(FedAvgClient(make_setup(algo="fedavg")).train(global_arrays(), 1).arrays, sent)
    assert same(from_record(setup.state[LOCAL_MODEL]), sent)
    assert ALA_WEIGHTS not in setup.state  # nothing to merge yet: no weights learned


def test_fedala_merge_takes_lower_layers_from_the_global_model_and_learns_weights() -> None:
    setup = make_setup(algo="fedala")
    local = FedALAClient(setup).train(global_arrays(), 1).arrays
    new_global = global_arrays(seed=5)  # another round's model
    client = recording(FedALAClient)(setup)
    client.train(new_global, 2)
    start, _ = client.steps[0]  # the model local training starts from
    names = merge_layers(client.model, 1)
    lower = [n for n in start if n not in names]
    assert same({n: start[n] for n in lower}, {n: new_global[n] for n in lower})
    weights = from_record(setup.state[ALA_WEIGHTS])
    assert sorted(weights) == sorted(names)
    for n in names:
        w = weights[n]
        assert w.min() >= 0 and w.max() <= 1 and w.min() < 1  # learned, within [0, 1]
        expected = local[n] + (new_global[n] - local[n]) * w
        np.testing.assert_allclose(start[n], expected, rtol=1e-6, atol=1e-6)


def test_fedala_evaluation_merges_the_same_way_twice_and_keeps_nothing() -> None:
    setup = make_setup(algo="fedala")
    FedALAClient(setup).train(global_arrays(), 1)
    FedALAClient(setup).train(global_arrays(seed=3), 2)
    before = state_snapshot(setup.state)
    first = evaluated(FedALAClient, setup, global_arrays(seed=4), 2)
    again = evaluated(FedALAClient, setup, global_arrays(seed=4), 2)
    assert same(first, again)
    assert same_state(state_snapshot(setup.state), before)
    local = from_record(setup.state[LOCAL_MODEL])
    for n in merge_layers(FedALAClient(setup).model, 1):  # between local and global
        low = np.minimum(local[n], global_arrays(seed=4)[n]) - 1e-6
        high = np.maximum(local[n], global_arrays(seed=4)[n]) + 1e-6
        assert (first[n] >= low).all() and (first[n] <= high).all()


def test_fedala_never_trained_client_is_evaluated_with_the_global_model() -> None:
    assert same(evaluated(FedALAClient, make_setup(algo="fedala"), global_arrays(3), 1),
                global_arrays(3))  # fmt: skip


def test_fedala_stop_rule_is_the_references() -> None:
    assert not loss_settled([1.0] * 10, window=10, threshold=0.1)  # needs more than 10
    assert loss_settled([5.0] + [1.0] * 10, window=10, threshold=0.1)
    assert not loss_settled([1.0, 2.0] * 6, window=10, threshold=0.1)


# --------------------------------------------------------------------- FedAS
def test_fedas_prototypes_are_class_means_and_alignment_is_zero_on_them() -> None:
    x = torch.tensor([[0.0, 2.0], [2.0, 4.0], [10.0, 10.0]]).view(3, 1, 1, 2)
    data = TensorData(x=x, y=torch.tensor([0, 0, 2]))
    identity = nn.Flatten()
    prototypes = class_prototypes(identity, data, torch.device("cpu"))
    assert prototypes.shape == (3, 2)
    # samples are normalised on the way in: compare against the same path
    features = torch.cat([identity(b) for b, _ in _normalised(data)])
    torch.testing.assert_close(prototypes[0], features[:2].mean(0))
    assert torch.isnan(prototypes[1]).all()  # a class the client does not have
    loss = alignment_loss(identity, prototypes)
    assert float(loss(features[2:].view(1, 1, 1, 2), torch.tensor([2]))) == 0.0


def _normalised(data: TensorData):
    from fedreg_app.core.training import eval_batches

    return eval_batches(data, torch.device("cpu"))


def test_fedas_trains_the_aligned_global_base_under_the_clients_own_head() -> None:
    setup = make_setup(algo="fedas")
    own = FedASClient(setup).model.group_state(BASE, HEAD_G)  # the initial model
    received = global_arrays(seed=5)
    client = recording(FedASClient)(setup)
    result = client.train(received, 1)
    (align_start, align_end), (train_start, _) = client.steps
    assert same(group(train_start, HEAD_G), group(own, HEAD_G))  # not the server's head
    assert not same(group(train_start, BASE), group(received, BASE))  # aligned...
    assert not same(group(train_start, BASE), group(own, BASE))  # ...not its own
    assert set(result.arrays) == set(received)
    kept = FedASClient(setup)
    kept.restore_private()
    assert same(kept.model.group_state(BASE, HEAD_G), result.arrays)
    trace = fisher_trace(kept.model, setup.data.train, 8, torch.device("cpu"))
    assert result.metrics[FIM_TRACE] == pytest.approx(trace) and trace > 0


def test_fedas_personal_model_is_the_clients_own() -> None:
    setup = make_setup(algo="fedas")
    trained = FedASClient(setup).train(global_arrays(), 1).arrays
    assert same(evaluated(FedASClient, setup, global_arrays(seed=9), 2), trained)


def test_fedas_averages_by_fisher_trace_and_by_samples_under_a_robust_rule() -> None:
    def update(value: float, trace: float, examples: int):
        arrays = {k: np.full_like(v, value) for k, v in global_arrays().items()}
        return arrays, {FIM_TRACE: trace, NUM_EXAMPLES: examples}

    updates = [update(1.0, 1.0, 30), update(5.0, 3.0, 10)]
    averaged = FedASStrategy(load_config({"algo": "fedas"})).aggregate_updates(1, updates)
    assert all(np.allclose(v, 0.25 * 1.0 + 0.75 * 5.0) for v in averaged.values())
    strategy = FedASStrategy(load_config({"algo": "fedas", "aggregation": "trimmed-mean",
                                          "trim-fraction": 0.0}))  # fmt: skip
    strategy._current = global_arrays()
    robust = strategy.aggregate_updates(1, updates)
    assert all(np.allclose(v, 0.75 * 1.0 + 0.25 * 5.0) for v in robust.values())


@pytest.mark.parametrize("trace", [0.0, -1.0, float("nan"), float("inf"), None, True])
def test_fedas_refuses_a_trace_that_cannot_weight(trace) -> None:
    assert FIM_TRACE in trace_problem(trace)


def test_fedas_refuses_central_dp_naming_the_key() -> None:
    config = RunConfig(algo="fedas", dp_mode="central")
    with pytest.raises(ConfigError, match="dp-mode='central'.*fedas"):
        check_privacy_allowed(config, FedASStrategy)
