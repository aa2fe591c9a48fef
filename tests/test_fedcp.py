"""FedCP: the policies and the split, the condition, the MMD, what is sent, kept and
averaged, the personal and the global model, seeding."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from flwr.app import RecordDict
from torch import nn

from clients.base import TrainResult
from clients.fedcp import (
    HEAD_MIX,
    MMD_BANDWIDTHS,
    ConditionalPolicyNetwork,
    FedCPClient,
    attach_fedcp_modules,
    frozen_copy,
    gumbel_noise,
    head_condition,
    mmd,
    split_features,
    two_head_logits,
)
from fedreg_app.core.config import ConfigError, RunConfig
from fedreg_app.core.data import normalise
from fedreg_app.core.models import BASE, EXTRA, HEAD_G, HEAD_P, build_model
from fedreg_app.core.protocol import NUM_EXAMPLES, NUM_PROCESSED, PERSONAL_CORRECT
from fedreg_app.core.seeds import torch_generator
from fedreg_app.core.training import count_correct
from fedreg_app.registry import load_config
from strategies.base import weighted_average_by_group
from strategies.fedcp import FedCPStrategy
from tests.test_clients import INFO, group, same
from tests.test_clients import make_setup as make_any_setup

TRAINED = (BASE, HEAD_P, EXTRA)
COUNTS = (12, 3, 0, 5)  # small on purpose: a class absent, 20 samples, 2 batches of 8


def make_setup(state=None, counts=COUNTS, **config):
    """A FedCP client's setup (``algo='fedcp'``: its options are FedCP's)."""
    return make_any_setup(state, counts, **{"algo": "fedcp", **config})


def server_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    """The server's initial model: the ConvNet plus FedCP's seeded policy network."""
    model = build_model(INFO, 2, seed)
    FedCPStrategy(RunConfig()).prepare_model(model)
    return model.group_state(BASE, HEAD_G, EXTRA)


class RecordingFedCP(FedCPClient):
    """Snapshots every group around the one training step."""

    def fit(self, *args, **kwargs) -> int:
        self.before = self.model.group_state(BASE, HEAD_G, HEAD_P, EXTRA)
        processed = super().fit(*args, **kwargs)
        self.after = self.model.group_state(BASE, HEAD_G, HEAD_P, EXTRA)
        return processed


@dataclass(frozen=True)
class RoundOne:
    state: RecordDict
    client: RecordingFedCP
    sent: dict[str, np.ndarray]
    result: TrainResult


@pytest.fixture(scope="module")
def round_one() -> RoundOne:
    """One client's first round, trained once for the whole module (the CPU is shared)."""
    state = RecordDict()
    client = RecordingFedCP(make_setup(state))
    sent = FedCPStrategy(RunConfig()).arrays_to_send(server_arrays(), 1)
    return RoundOne(state, client, sent, client.train(sent, server_round=1))


# ------------------------------------------------------- policies and the split
def test_policies_lie_in_the_unit_interval_and_the_parts_sum_to_the_feature() -> None:
    torch.manual_seed(0)
    cpn = ConditionalPolicyNetwork(6)
    features, condition = torch.randn(5, 6) * 3, torch.rand(6)
    noise = gumbel_noise((5, 2, 6), torch_generator(0, "fedcp-gumbel", 7, 1))
    for drawn in (None, noise):
        personal, generic = cpn(features, condition, drawn)
        assert personal.shape == generic.shape == features.shape
        assert ((personal >= 0) & (personal <= 1)).all()
        assert torch.allclose(personal + generic, torch.ones_like(personal))
        part_p, part_g = split_features(features, (personal, generic))
        assert torch.allclose(part_p + part_g, features, atol=1e-6)
    # the noise changes the split; without it the policy is a function of the input
    assert not torch.allclose(cpn(features, condition, noise)[0], cpn(features, condition)[0])
    assert torch.equal(cpn(features, condition)[0], cpn(features, condition)[0])


def test_the_policy_depends_on_the_sample_and_on_the_clients_condition() -> None:
    torch.manual_seed(1)
    cpn = ConditionalPolicyNetwork(8)
    features = torch.randn(2, 8)
    first, second = torch.rand(8), torch.rand(8)
    personal = cpn(features, first)[0]
    assert not torch.allclose(personal[0], personal[1])  # sample-specific
    assert not torch.allclose(personal, cpn(features, second)[0])  # client-specific


def test_the_policy_is_the_softmax_of_each_pair_of_logits() -> None:
    cpn = ConditionalPolicyNetwork(3)
    features, condition = torch.tensor([[1.0, -2.0, 0.5]]), torch.tensor([0.2, 0.3, 0.4])
    logits = cpn.layers(features * condition).view(1, 2, 3)
    expected = torch.sigmoid(logits[:, 0] - logits[:, 1])
    assert torch.allclose(cpn(features, condition)[0], expected, atol=1e-6)


def test_the_condition_is_the_unit_column_sum_of_the_heads_weight_product() -> None:
    head = nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.Linear(2, 2))
    with torch.no_grad():
        head[0].weight.copy_(torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, 0.0]]))
        head[2].weight.copy_(torch.tensor([[1.0, 1.0], [2.0, 0.0]]))
    # W2 @ W1 = [[1, 1, 2], [2, 0, 4]]; column sums (3, 1, 6), length sqrt(46)
    expected = torch.tensor([3.0, 1.0, 6.0]) / math.sqrt(46)
    assert torch.allclose(head_condition(head), expected)
    single = nn.Linear(2, 3)
    assert torch.allclose(
        head_condition(single), nn.functional.normalize(single.weight.sum(0), dim=0)
    )


# ------------------------------------------------------------------- the MMD
def test_mmd_is_zero_for_equal_features_and_positive_otherwise() -> None:
    torch.manual_seed(2)
    x = torch.randn(6, 5)
    assert mmd(x, x.clone()).item() == 0.0
    assert mmd(x, x + 0.5).item() > 0
    assert mmd(x, torch.randn(6, 5) * 4).item() > mmd(x, x + 0.5).item()
    # one sample each, at distance a: 2 * sum_s (1 - exp(-a^2 / (2 s)))
    a = 3.0
    by_hand = 2 * sum(1 - math.exp(-(a**2) / (2 * s)) for s in MMD_BANDWIDTHS)
    assert mmd(torch.zeros(1, 1), torch.full((1, 1), a)).item() == pytest.approx(by_hand)


def test_the_mmd_term_vanishes_on_the_received_base_and_not_after_training(round_one) -> None:
    client = FedCPClient(make_setup())
    client.load_global(server_arrays())
    x, y = normalise(client.data.train.x[:8]), client.data.train.y[:8]
    start = client.loss_terms(x, y, frozen_copy(client.model.base))
    assert start["mmd"].item() == 0.0 and start["ce"].item() > 0
    trained = round_one.client  # its base moved away from the base it received
    received = build_model(INFO, 2, 0).base
    terms = trained.loss_terms(x, y, received)
    assert terms["mmd"].item() > 0
    zero = FedCPClient(make_setup(**{"fedcp-lambda": 0.0}))
    zero.model.load_state_dict(trained.model.state_dict())
    assert zero.loss_terms(x, y, received)["mmd"].item() == 0.0
    assert terms["mmd"].item() == pytest.approx(
        5.0 * mmd(trained.model.base(x), received(x)).item()
    )


# ------------------------------------------------------ what is sent and kept
def test_server_sends_base_global_head_and_policy_network() -> None:
    sent = FedCPStrategy(RunConfig()).arrays_to_send(server_arrays(), None)
    assert {k.split(".")[0] for k in sent} == {BASE, HEAD_G, EXTRA}
    assert sent["extra.cpn.layers.0.weight"].shape == (768, 384)  # Linear(D, 2D), D = 384


def test_reply_holds_base_cpn_and_the_mixed_head_but_never_the_personal_head(round_one) -> None:
    client, result, sent = round_one.client, round_one.result, round_one.sent
    assert {k.split(".")[0] for k in result.arrays} == {BASE, HEAD_G, EXTRA}
    assert set(result.arrays) == set(server_arrays())
    for name in TRAINED:  # base, personal head and policy network train ...
        assert not same(group(client.before, name), group(client.after, name)), name
    # ... the global head is frozen: it is the one received, through the whole round
    assert same(group(client.before, HEAD_G), group(sent, HEAD_G))
    assert same(group(client.after, HEAD_G), group(sent, HEAD_G))
    # the uploaded head_g is the mean of the trained head_p and the received head_g
    for key in group(sent, HEAD_G):
        personal = client.after[key.replace(HEAD_G, HEAD_P, 1)]
        mixed = HEAD_MIX * personal + (1 - HEAD_MIX) * sent[key]
        np.testing.assert_allclose(result.arrays[key], mixed, rtol=1e-6, atol=1e-7)
        assert not np.array_equal(result.arrays[key], personal)
    assert HEAD_P in round_one.state  # the personal head is kept on the client
    assert result.metrics[NUM_EXAMPLES] == 20 and result.metrics[NUM_PROCESSED] == 16


def test_second_round_starts_from_the_saved_personal_head_and_the_servers_parts(
    round_one,
) -> None:
    saved = group(round_one.client.after, HEAD_P)
    server = server_arrays(seed=5)  # another server model
    state = RecordDict({HEAD_P: round_one.state[HEAD_P]})  # a copy: the fixture stays
    later = RecordingFedCP(make_setup(state))
    later.train(server, server_round=2)
    assert same(group(later.before, HEAD_P), saved)  # its own head, not the initial one
    for name in (BASE, HEAD_G, EXTRA):
        assert same(group(later.before, name), group(server, name)), name
    # the round's condition comes from the saved personal head
    assert torch.allclose(later.condition, head_condition(round_one.client.model.head_p))


def test_every_process_builds_the_same_seeded_policy_network() -> None:
    a, b = FedCPClient(make_setup()), FedCPClient(make_setup(counts=(5, 5, 5, 5)))
    other_seed = FedCPClient(make_setup(seed=1))
    assert same(a.model.group_state(EXTRA), b.model.group_state(EXTRA))
    assert same(a.model.group_state(EXTRA), group(server_arrays(), EXTRA))
    assert not same(a.model.group_state(EXTRA), other_seed.model.group_state(EXTRA))


def test_same_seed_same_weights_and_the_noise_follows_the_seed() -> None:
    arrays = server_arrays()
    first = FedCPClient(make_setup()).train(arrays, 3)
    again = FedCPClient(make_setup()).train(arrays, 3)
    other_round = FedCPClient(make_setup()).train(arrays, 4)  # other shuffle and noise
    assert same(first.arrays, again.arrays)
    assert not same(first.arrays, other_round.arrays)

    def draw(seed: int) -> torch.Tensor:
        return gumbel_noise((2, 2, 3), torch_generator(seed, "fedcp-gumbel", 7, 3))

    assert torch.equal(draw(0), draw(0)) and not torch.equal(draw(0), draw(1))


# ------------------------------------------------ the personal and global model
def test_personal_prediction_is_both_heads_on_their_parts_without_noise(round_one) -> None:
    setup = make_setup(RecordDict({HEAD_P: round_one.state[HEAD_P]}))
    client = FedCPClient(setup)
    counts = client.evaluate(round_one.result.arrays, 2)
    model, features = client.model, torch.rand(3, 384)
    personal, generic = model.extra["cpn"](features, client.condition)
    expected = model.head_p(features * personal) + model.head_g(features * generic)
    assert torch.allclose(client.personal_head(features), expected)
    assert torch.equal(client.personal_head(features), client.personal_head(features))
    assert torch.allclose(client.condition, head_condition(round_one.client.model.head_p))
    predicted = count_correct(
        lambda x: client.personal_head(client.model.base(x)), setup.data.test, client.device
    )
    assert counts[PERSONAL_CORRECT] == predicted and counts["num-test"] == 15


def test_global_model_is_the_global_head_on_the_whole_feature(round_one) -> None:
    arrays = round_one.result.arrays
    reference = build_model(INFO, 2, 0)
    reference.load_group_state(arrays, BASE, HEAD_G)
    predict = FedCPStrategy(RunConfig()).global_predictor(build_model(INFO, 2, 0), arrays)
    x = normalise(round_one.client.data.test.x)
    with torch.no_grad():
        assert torch.allclose(predict(x), reference(x), atol=1e-6)


def test_strategy_averages_base_global_head_and_cpn_by_train_size() -> None:
    def update(value: float, n: int):
        arrays = {
            "base.0.weight": np.full((2, 2), value, dtype=np.float32),
            "head_g.0.bias": np.full((3,), 2 * value, dtype=np.float32),
            "extra.cpn.layers.0.weight": np.full((4, 2), -value, dtype=np.float32),
        }
        return arrays, {NUM_EXAMPLES: n, NUM_PROCESSED: 5 * n}

    result = FedCPStrategy(RunConfig()).aggregate_updates(
        1, [update(1.0, 100), update(3.0, 300), update(5.0, 600)]
    )
    # weights 0.1, 0.3, 0.6: 0.1 * 1 + 0.3 * 3 + 0.6 * 5 = 4
    np.testing.assert_allclose(result["base.0.weight"], 4.0, rtol=1e-6)
    np.testing.assert_allclose(result["head_g.0.bias"], 8.0, rtol=1e-6)
    np.testing.assert_allclose(result["extra.cpn.layers.0.weight"], -4.0, rtol=1e-6)
    personal = update(1.0, 1)
    personal[0]["head_p.0.bias"] = np.zeros(3, dtype=np.float32)
    with pytest.raises(KeyError, match="head_p"):
        weighted_average_by_group([personal], FedCPStrategy.group_weights)


# ------------------------------------------------------------ configuration
def test_lambda_comes_from_the_run_config_and_cuda_graphs_are_refused() -> None:
    assert FedCPClient(make_setup()).lam == 5.0
    assert FedCPClient(make_setup(**{"fedcp-lambda": 0.5})).lam == 0.5
    with pytest.raises(ConfigError, match="fedcp-lambda"):
        load_config({"algo": "fedcp", "fedcp-lambda": -1.0})
    with pytest.raises(ConfigError, match="cuda-graphs=True is not allowed with algo='fedcp'"):
        load_config({"algo": "fedcp", "cuda-graphs": True})


@pytest.mark.parametrize(("depth", "dim"), [(1, 192), (3, 1024)])
def test_the_policy_network_fits_every_head_depth(depth: int, dim: int) -> None:
    client = FedCPClient(make_setup(**{"head-depth": depth}))
    assert client.model.extra["cpn"].layers[0].weight.shape == (2 * dim, dim)
    assert client.condition.shape == (dim,)
    x, y = normalise(client.data.train.x[:4]), client.data.train.y[:4]
    noise = torch_generator(0, "fedcp-gumbel", 7, 1)
    received = frozen_copy(client.model.base)
    with torch.no_grad():  # heads apart, as after a step: equal heads hide the policy
        for param in client.model.head_p.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(3)))
    terms = client.loss_terms(x, y, received, noise)
    assert all(torch.isfinite(value) for value in terms.values())
    noiseless = client.loss_terms(x, y, received)  # training's noise moves the policies
    assert terms["ce"].item() != noiseless["ce"].item()
    assert terms["mmd"].item() == noiseless["mmd"].item() == 0.0
    assert two_head_logits(client.model, client.model.base(x), client.condition).shape == (4, 4)


def test_attaching_twice_keeps_the_modules() -> None:
    model = build_model(INFO, 2, 0)
    attach_fedcp_modules(model, 0)
    cpn = model.extra["cpn"]
    attach_fedcp_modules(model, 1)
    assert model.extra["cpn"] is cpn


def test_with_two_equal_one_layer_heads_the_policy_changes_nothing() -> None:
    """Both heads W: W(z p) + b + W(z g) + b = W z + 2b, whatever the policy. The global
    model head_g(base(x)) is this prediction up to the bias."""
    client = FedCPClient(make_setup(**{"head-depth": 1}))  # head_p starts as head_g
    features = torch.rand(4, 192)
    noise = gumbel_noise((4, 2, 192), torch_generator(0, "fedcp-gumbel", 7, 1))
    model = client.model
    with torch.no_grad():
        noisy = two_head_logits(model, features, client.condition, noise)
        plain = two_head_logits(model, features, client.condition)
        assert torch.allclose(noisy, plain, atol=1e-5)
        assert torch.allclose(plain, model.head_g(features) + model.head_g[0].bias, atol=1e-5)
