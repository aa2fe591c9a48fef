"""GPFL: what is sent and kept, the valve, the conditions and losses, the aggregation."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from clients.base import TrainResult
from clients.gpfl import (
    ConditionalValve,
    GPFLClient,
    angle_level_loss,
    attach_gpfl_modules,
    conditioned_head,
    global_condition,
    l2_penalty,
    magnitude_level_loss,
    personal_condition,
)
from fedreg_app.core.config import ConfigError, RunConfig
from fedreg_app.core.data import normalise
from fedreg_app.core.models import BASE, EXTRA, HEAD_G, build_model
from fedreg_app.core.protocol import NUM_EXAMPLES, NUM_PROCESSED, PERSONAL_CORRECT
from fedreg_app.core.training import count_correct
from fedreg_app.registry import load_config
from strategies.base import weighted_average_by_group
from strategies.gpfl import GPFLStrategy
from tests.test_clients import INFO, group, same
from tests.test_clients import make_setup as make_any_setup

GPFL_GROUPS = (BASE, HEAD_G, EXTRA)


def make_setup(state=None, counts=(40, 3, 0, 9), **config):
    """A GPFL client's setup (``algo='gpfl'``: its options are GPFL's)."""
    return make_any_setup(state, counts, **{"algo": "gpfl", **config})


def server_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    """The server's initial model: the ConvNet plus GPFL's seeded modules."""
    model = build_model(INFO, 2, seed)
    GPFLStrategy(RunConfig()).prepare_model(model)
    return model.group_state(BASE, HEAD_G, EXTRA)


class RecordingGPFL(GPFLClient):
    """Snapshots every group around the one training step."""

    def fit(self, *args, **kwargs) -> int:
        self.before = self.model.group_state(*GPFL_GROUPS)
        processed = super().fit(*args, **kwargs)
        self.after = self.model.group_state(*GPFL_GROUPS)
        return processed


COUNTS = (12, 3, 0, 5)  # small on purpose: a class absent, 20 samples, 3 batches


def extra_keys(client: GPFLClient) -> set[str]:
    return set(client.model.group_state(EXTRA))


@dataclass(frozen=True)
class RoundOne:
    state: RecordDict
    client: RecordingGPFL
    result: TrainResult


@pytest.fixture(scope="module")
def round_one() -> RoundOne:
    """One client's first round, trained once for the whole module (the CPU is shared)."""
    state = RecordDict()
    client = RecordingGPFL(make_setup(state, counts=COUNTS))
    sent = GPFLStrategy(RunConfig()).arrays_to_send(server_arrays(), None)
    return RoundOne(state, client, client.train(sent, server_round=1))


def test_server_sends_base_gce_and_valve_but_never_the_heads() -> None:
    sent = GPFLStrategy(RunConfig()).arrays_to_send(server_arrays(), None)
    assert {k.split(".")[0] for k in sent} == {BASE, EXTRA}
    assert "extra.gce.weight" in sent and "extra.condition.personal" in sent


def test_reply_holds_shared_parts_head_and_condition_for_the_global_figure(round_one) -> None:
    client, result = round_one.client, round_one.result
    assert not any(key.startswith("head_p.") for key in result.arrays)
    assert client.model.head_p is None
    assert set(result.arrays) == set(server_arrays())
    assert result.arrays["extra.gce.weight"].shape == (4, 384)  # classes x feature dim
    for name in GPFL_GROUPS:  # every part trains
        assert not same(group(client.before, name), group(client.after, name)), name
    # the uploaded condition is the client's personal condition of this round
    np.testing.assert_allclose(
        result.arrays["extra.condition.personal"], client.conditions.personal.numpy()
    )
    assert HEAD_G in round_one.state  # the head is kept on the client
    # 20 samples, whole batches of 8 trained (drop-last)
    assert result.metrics[NUM_EXAMPLES] == 20 and result.metrics[NUM_PROCESSED] == 16


def test_second_round_starts_from_the_saved_head_and_the_servers_gce(round_one) -> None:
    strategy = GPFLStrategy(RunConfig())
    saved = group(round_one.client.after, HEAD_G)
    server = dict(server_arrays(seed=5))  # a different server model, heads included
    server["extra.gce.weight"] = round_one.result.arrays["extra.gce.weight"] * 2
    state = RecordDict({HEAD_G: round_one.state[HEAD_G]})  # a copy: the fixture stays as is

    later = RecordingGPFL(make_setup(state, counts=COUNTS))
    later.train(strategy.arrays_to_send(server, None), server_round=2)
    assert same(group(later.before, HEAD_G), saved)  # its own head, not the server's
    assert same(group(later.before, BASE), group(server, BASE))
    received = torch.as_tensor(server["extra.gce.weight"])
    assert torch.allclose(later.conditions.global_, received.mean(dim=0))
    assert torch.equal(later.conditions.anchors, received)


def test_every_client_starts_from_the_same_seeded_gce_and_valve() -> None:
    a, b = GPFLClient(make_setup()), GPFLClient(make_setup(counts=(5, 5, 5, 5)))
    other_seed = GPFLClient(make_setup(seed=1))
    assert same(a.model.group_state(EXTRA), b.model.group_state(EXTRA))
    assert not same(a.model.group_state(EXTRA), other_seed.model.group_state(EXTRA))


@pytest.mark.parametrize(("depth", "dim"), [(1, 192), (3, 1024)])
def test_gce_and_valve_fit_every_head_depth(depth: int, dim: int) -> None:
    client = GPFLClient(make_setup(**{"head-depth": depth}))
    assert client.model.extra["gce"].weight.shape == (4, dim)
    x, y = normalise(client.data.train.x[:4]), client.data.train.y[:4]
    assert torch.isfinite(client.loss(x, y))
    assert client.personal_head(client.model.base(x)).shape == (4, 4)


def test_valve_has_the_feature_shape_and_relu_scale_shift_semantics() -> None:
    torch.manual_seed(0)
    cov = ConditionalValve(6)
    features, condition = torch.randn(5, 6), torch.randn(6)
    out = cov(features, condition)
    gamma, beta = cov.gamma(condition), cov.beta(condition)
    assert out.shape == features.shape
    assert torch.allclose(out, torch.relu(features * (gamma + 1) + beta))
    assert (out >= 0).all()
    # Fix gamma = 1 and beta = -0.5 through the branches' LayerNorm affine parameters.
    with torch.no_grad():
        for branch, value in ((cov.gamma, 1.0), (cov.beta, -0.5)):
            branch[2].weight.zero_()
            branch[2].bias.fill_(value)
    f = torch.tensor([[0.0, 0.2, 0.25, 1.0, -1.0, 3.0]])
    expected = torch.tensor([[0.0, 0.0, 0.0, 1.5, 0.0, 5.5]])  # ReLU(2f - 0.5)
    assert torch.allclose(cov(f, condition), expected)


def test_conditions_are_the_mean_and_the_frequency_weighted_embedding() -> None:
    embeddings = torch.tensor([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0], [2.0, 2.0]])
    counts = torch.tensor([3.0, 1.0, 0.0, 0.0])  # classes 2 and 3 absent
    assert torch.allclose(global_condition(embeddings), torch.tensor([2.0, 2.0]))
    assert torch.allclose(personal_condition(embeddings, counts), torch.tensor([0.75, 0.25]))
    assert torch.equal(personal_condition(embeddings, torch.zeros(4)), torch.zeros(2))


def test_client_conditions_use_its_train_class_counts() -> None:
    client = GPFLClient(make_setup())  # counts (40, 3, 0, 9)
    embeddings = client.model.extra["gce"].weight.detach()
    weights = torch.tensor([40.0, 3.0, 0.0, 9.0]) / 52
    assert torch.allclose(client.conditions.personal, weights @ embeddings, atol=1e-6)


def test_loss_terms_by_hand() -> None:
    embeddings = torch.eye(3)
    features = torch.tensor([[2.0, 0.0, 0.0]])  # cosines (1, 0, 0)
    expected = -math.log(math.e / (math.e + 2))
    assert angle_level_loss(features, embeddings, torch.tensor([0])).item() == pytest.approx(
        expected
    )
    # Over the whole batch: sqrt(3^2 + 4^2), not the mean of per-sample norms (3.5).
    batch = torch.tensor([[3.0, 0.0], [0.0, 4.0]])
    assert magnitude_level_loss(batch, torch.zeros(2, 2)).item() == pytest.approx(5.0)
    # mu * l2_penalty has the gradient of a weight decay mu: mu * theta.
    theta = torch.tensor([1.0, -2.0], requires_grad=True)
    (0.001 * l2_penalty([theta])).backward()
    assert torch.allclose(theta.grad, 0.001 * theta.detach())


def test_coefficients_come_from_the_run_config() -> None:
    default = GPFLClient(make_setup())
    assert (default.lam, default.mu) == (0.1, 0.001)
    custom = GPFLClient(make_setup(**{"gpfl-lambda": 0.5, "gpfl-mu": 0}))
    assert (custom.lam, custom.mu) == (0.5, 0.0)
    with pytest.raises(ConfigError, match="gpfl-mu"):
        GPFLStrategy(load_config({"gpfl-mu": -0.1}))
    x, y = normalise(custom.data.train.x[:8]), custom.data.train.y[:8]
    terms = custom.loss_terms(x, y)
    assert terms["regulariser"].item() == 0.0
    assert terms["magnitude"].item() == pytest.approx(
        5 * default.loss_terms(x, y)["magnitude"].item(), rel=1e-5
    )


@pytest.mark.parametrize("counts", [(12, 0, 0, 0), (1, 0, 0, 1)])
def test_clients_lacking_classes_train_and_evaluate_finitely(counts) -> None:
    setup = make_setup(counts=counts)
    client = GPFLClient(setup)
    x, y = normalise(setup.data.train.x), setup.data.train.y
    terms = client.loss_terms(x, y)
    assert all(torch.isfinite(value) for value in terms.values()), terms
    result = client.train(server_arrays(), 1)
    assert all(np.isfinite(v).all() for v in result.arrays.values())
    counts_eval = GPFLClient(setup).evaluate(result.arrays, 1)
    assert counts_eval["num-test"] == 15
    assert 0 <= counts_eval[PERSONAL_CORRECT] <= 15


def test_personal_prediction_is_the_own_head_on_the_personal_feature(round_one) -> None:
    setup = make_setup()
    client = GPFLClient(setup)
    features = torch.rand(3, 384)
    cov = client.model.extra["cov"]
    expected = client.model.head_g(cov(features, client.conditions.personal))
    assert torch.allclose(client.personal_head(features), expected)
    # evaluate counts exactly that prediction on the test split
    counts = client.evaluate(round_one.result.arrays, 2)
    predicted = count_correct(
        lambda x: client.personal_head(client.model.base(x)), setup.data.test, client.device
    )
    assert counts[PERSONAL_CORRECT] == predicted
    assert counts["num-test"] == 15


def update(base: float, gce: float, cov: float, n: int):
    arrays = {
        "base.0.weight": np.full((2, 2), base, dtype=np.float32),
        "head_g.0.bias": np.full((3,), base, dtype=np.float32),
        "extra.gce.weight": np.full((4, 2), gce, dtype=np.float32),
        "extra.cov.gamma.0.weight": np.full((2, 2), cov, dtype=np.float32),
        "extra.condition.personal": np.full((2,), gce, dtype=np.float32),
    }
    return arrays, {NUM_EXAMPLES: n, NUM_PROCESSED: 5 * n}


def test_strategy_averages_base_head_gce_cov_and_condition_by_train_size() -> None:
    updates = [
        update(1.0, 10.0, -1.0, 100),
        update(3.0, 20.0, 0.0, 300),
        update(5.0, 40.0, 2.0, 600),
    ]
    result = GPFLStrategy(RunConfig()).aggregate_updates(1, updates)
    # weights 0.1, 0.3, 0.6 -- base: 0.1*1 + 0.3*3 + 0.6*5 = 4 ; gce: 1 + 6 + 24 = 31 ;
    # cov: -0.1 + 0 + 1.2 = 1.1
    np.testing.assert_allclose(result["base.0.weight"], 4.0)
    np.testing.assert_allclose(result["head_g.0.bias"], 4.0)
    np.testing.assert_allclose(result["extra.gce.weight"], 31.0, rtol=1e-6)
    np.testing.assert_allclose(result["extra.cov.gamma.0.weight"], 1.1, rtol=1e-6)
    np.testing.assert_allclose(result["extra.condition.personal"], 31.0, rtol=1e-6)
    assert result["extra.gce.weight"].dtype == np.float32


def test_strategy_refuses_a_personal_head() -> None:
    arrays, metrics = update(1.0, 1.0, 1.0, 1)
    arrays["head_p.0.bias"] = np.zeros(3, dtype=np.float32)
    with pytest.raises(KeyError, match="head_p"):
        weighted_average_by_group([(arrays, metrics)], GPFLStrategy.group_weights)


def test_server_global_model_is_head_on_the_mean_personal_condition(round_one) -> None:
    arrays = round_one.result.arrays
    reference = build_model(INFO, 2, 0)
    attach_gpfl_modules(reference, 0)
    reference.load_group_state(arrays, BASE, HEAD_G, EXTRA)
    reference.eval()
    x = normalise(round_one.client.data.test.x)
    # The server's model: a plain SplitModel, as server_app builds it.
    predict = GPFLStrategy(RunConfig()).global_predictor(build_model(INFO, 2, 0), arrays)
    with torch.no_grad():
        p_mean = torch.as_tensor(arrays["extra.condition.personal"])
        expected = conditioned_head(reference, p_mean)(reference.base(x))
        assert torch.allclose(predict(x), expected, atol=1e-5)
        # and not the plain head_g(base(x)): the valve is part of the global model
        assert not torch.allclose(predict(x), reference(x), atol=1e-3)
