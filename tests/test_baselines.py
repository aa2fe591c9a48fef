"""Each baseline's defining property, and FedReG's ablation switches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clients.ditto import PERSONAL_MODEL, DittoClient
from clients.fedavg import FedAvgClient
from clients.fedbabu import FedBABUClient
from clients.feddyn import CORRECTION, FedDynClient, FedDynOptions
from clients.fedper import FedPerClient
from clients.fedprox import FedProxClient
from clients.fedreg import FedReGClient
from clients.fedrep import FedRepClient
from clients.fedrod import FedRoDClient, balanced_softmax_loss, log_class_prior
from fedreg_app.core.config import ConfigError, RunConfig
from fedreg_app.core.models import BASE, HEAD_G, HEAD_P
from fedreg_app.core.partition_map import PartitionMap
from fedreg_app.core.protocol import EFFECTIVE_EXAMPLES, NUM_EXAMPLES, NUM_PROCESSED
from fedreg_app.core.records import from_record, to_record
from fedreg_app.registry import load_config
from strategies.feddyn import FedDynStrategy
from strategies.fedper import FedPerStrategy
from strategies.fedreg import FedReGStrategy
from tests.test_clients import INFO, global_arrays, group, make_setup, same


def recording(procedure_type):
    """A subclass that snapshots every group before and after each ``fit``."""

    class Recording(procedure_type):
        def __init__(self, setup) -> None:
            super().__init__(setup)
            self.steps = []

        def fit(self, *args, **kwargs) -> int:
            groups = (BASE, HEAD_G, HEAD_P) if self.model.head_p is not None else (BASE, HEAD_G)
            before = self.model.group_state(*groups)
            processed = super().fit(*args, **kwargs)
            self.steps.append((before, self.model.group_state(*groups)))
            return processed

    return Recording


def distance(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return float(sum(((a[k] - b[k]) ** 2).sum() for k in a))


def test_fedrep_base_frozen_during_head_epochs_and_head_during_base_epoch() -> None:
    client = recording(FedRepClient)(make_setup(algo="fedrep"))
    result = client.train(global_arrays(), 1)
    (head_before, head_after), (base_before, base_after) = client.steps
    assert same(group(head_before, BASE), group(head_after, BASE))
    assert not same(group(head_before, HEAD_G), group(head_after, HEAD_G))
    assert same(group(base_before, HEAD_G), group(base_after, HEAD_G))
    assert not same(group(base_before, BASE), group(base_after, BASE))
    # personal-epochs, base-epochs, each over the 48 samples of whole batches of 8
    assert result.metrics[NUM_PROCESSED] == 48 * 5 + 48 * 1


def test_fedbabu_head_never_moves_in_training_and_finetuning_is_not_kept() -> None:
    client = FedBABUClient(make_setup(algo="fedbabu", **{"finetune-epochs": 2}))
    result = client.train(global_arrays(), 1)
    assert set(result.arrays) == set(group(global_arrays(), BASE))  # only the base is sent
    assert same(client.model.group_state(HEAD_G), group(global_arrays(), HEAD_G))
    assert list(client.setup.state) == ["optimizer-0"]  # the base's momentum, nothing else
    kept = dict(client.setup.state["optimizer-0"].items())
    # Fine-tuning before evaluation moves the head of this evaluation's copy only...
    evaluator = FedBABUClient(client.setup)
    evaluator.evaluate({**global_arrays(), **result.arrays}, client.config.num_server_rounds)
    assert not same(evaluator.model.group_state(HEAD_G), group(global_arrays(), HEAD_G))
    # ...and nothing of it is stored on the client, its optimizer included
    assert list(client.setup.state) == ["optimizer-0"]
    assert all(
        np.array_equal(array.numpy(), kept[name].numpy())
        for name, array in client.setup.state["optimizer-0"].items()
    )


def test_fedbabu_server_sends_only_the_base_and_clients_hold_the_same_initial_head() -> None:
    from strategies.fedbabu import FedBABUStrategy

    sent = FedBABUStrategy(RunConfig()).arrays_to_send(global_arrays(), None)
    assert set(sent) == set(group(global_arrays(), BASE))  # the fixed head never travels
    base_only = FedBABUClient(make_setup(algo="fedbabu", **{"finetune-epochs": 1}))
    with_head = FedBABUClient(make_setup(algo="fedbabu", **{"finetune-epochs": 1}))
    assert base_only.evaluate(sent, 1) == with_head.evaluate(global_arrays(), 1)
    assert same(base_only.model.group_state(BASE), with_head.model.group_state(BASE))


def test_fedbabu_feature_finetuning_equals_finetuning_through_the_frozen_base() -> None:
    """Head fine-tuning on cached features == on images with the base frozen."""
    a = FedBABUClient(make_setup(algo="fedbabu", **{"finetune-epochs": 1}))
    a.load_global(global_arrays())
    a.fine_tune(1, 1, whole_model=False)  # finetune-epochs 1, the head (finetune-base false)
    b = FedBABUClient(make_setup(algo="fedbabu"))
    b.load_global(global_arrays())
    b.fit(b.model.parameters_of(HEAD_G), b.cross_entropy(b.model), b.data.train, 1, 1, stream=3)
    for key, value in a.model.group_state(HEAD_G).items():
        np.testing.assert_allclose(value, b.model.group_state(HEAD_G)[key], atol=1e-5)


def test_fedrod_balanced_loss_shifts_logits_and_is_finite_for_missing_classes() -> None:
    counts = torch.tensor([40, 3, 0, 9])
    prior = log_class_prior(counts)
    assert torch.allclose(prior[[0, 1, 3]], torch.log(torch.tensor([40.0, 3.0, 9.0])))
    assert torch.isfinite(prior).all() and prior[2] < -1e3
    logits = torch.randn(5, 4, requires_grad=True)
    y = torch.tensor([0, 1, 3, 0, 1])
    loss = balanced_softmax_loss(logits, y, prior)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
    expected = torch.nn.functional.cross_entropy(logits + prior, y)
    assert torch.allclose(loss, expected)
    assert logits.grad[:, 2].abs().max() < 1e-6  # an absent class gets no probability mass


def test_fedrod_trains_both_heads_and_sends_no_private_head() -> None:
    client = recording(FedRoDClient)(make_setup(algo="fedrod"))
    result = client.train(global_arrays(), 1)
    [(before, after)] = client.steps
    for name in (BASE, HEAD_G, HEAD_P):
        assert not same(group(before, name), group(after, name))
    assert not any(k.startswith("head_p.") for k in result.arrays)
    assert all(np.isfinite(v).all() for v in result.arrays.values())
    assert HEAD_P in client.setup.state


def test_fedprox_stays_closer_to_the_global_model_than_fedavg() -> None:
    start = global_arrays()
    fedavg = FedAvgClient(make_setup(algo="fedavg")).train(start, 1).arrays
    prox = FedProxClient(make_setup(algo="fedprox", **{"prox-mu": 10.0})).train(start, 1).arrays
    assert distance(prox, start) < 0.5 * distance(fedavg, start)


def test_feddyn_server_update_matches_hand_computed_values() -> None:
    strategy = FedDynStrategy(RunConfig(algo="feddyn", options=FedDynOptions(alpha=0.5)))
    strategy.set_partitions(PartitionMap(4, {p: p for p in range(4)}))
    strategy._current = {"base.w": np.array([1.0, 2.0], dtype=np.float32)}
    updates = [
        ({"base.w": np.array([2.0, 2.0], dtype=np.float32)}, {NUM_EXAMPLES: 1}),
        ({"base.w": np.array([4.0, 0.0], dtype=np.float32)}, {NUM_EXAMPLES: 9}),
    ]
    result = strategy.aggregate_updates(1, updates)
    # drift sum = (1, 0) + (3, -2) = (4, -2); h = -0.5 * (4, -2) / 4 = (-0.5, 0.25)
    # mean = (3, 1); w = mean - h / 0.5 = (3 + 1, 1 - 0.5) = (4, 0.5)
    np.testing.assert_allclose(strategy.h["base.w"], [-0.5, 0.25])
    np.testing.assert_allclose(result["base.w"], [4.0, 0.5])
    # Round 2 from the new global model: h keeps accumulating.
    strategy._current = result
    result = strategy.aggregate_updates(2, [({"base.w": np.array([4.0, 0.5])}, {NUM_EXAMPLES: 1})])
    np.testing.assert_allclose(strategy.h["base.w"], [-0.5, 0.25])  # zero drift
    np.testing.assert_allclose(result["base.w"], [4.0 + 1.0, 0.5 - 0.5])


def test_feddyn_client_correction_update() -> None:
    setup = make_setup(algo="feddyn", **{"dyn-alpha": 0.1})
    start = global_arrays()
    result = FedDynClient(setup).train(start, 1)
    correction = from_record(setup.state[CORRECTION])
    assert correction.keys() == result.arrays.keys()
    for key, value in correction.items():  # grad_k = 0 - alpha (w_k - w_g)
        np.testing.assert_allclose(value, -0.1 * (result.arrays[key] - start[key]), atol=1e-6)
    FedDynClient(setup).train(start, 2)  # a second round starts from the stored correction
    assert not same(from_record(setup.state[CORRECTION]), correction)


class FormerFedDyn(FedDynClient):
    """FedDyn's client as the recorded full-scale runs trained it, spelled out: the
    linear term built before the cross-entropy in each step's graph."""

    def local_loss(self, trainable):  # noqa: ANN001, ANN201
        alpha = self.config.options_as(FedDynOptions).alpha
        self.anchors = [p.detach().clone() for p in trainable]
        state = self.setup.state
        stored = from_record(state[CORRECTION]) if CORRECTION in state else {}
        names = self.model.parameter_names_of(BASE, HEAD_G)
        self.correction = [torch.as_tensor(stored[n]) if stored else torch.zeros_like(p)
                           for n, p in zip(names, trainable, strict=True)]  # fmt: skip
        ce = self.cross_entropy(self.model)

        def loss(x, y):  # noqa: ANN001, ANN202
            linear = sum((g * p).sum() for g, p in zip(self.correction, trainable, strict=True))
            squared = sum(
                ((p - a) ** 2).sum() for p, a in zip(trainable, self.anchors, strict=True)
            )
            return ce(x, y) - linear + alpha / 2 * squared

        return loss

    def after_local_training(self, trainable) -> None:  # noqa: ANN001
        alpha = self.config.options_as(FedDynOptions).alpha
        names = self.model.parameter_names_of(BASE, HEAD_G)
        self.setup.state[CORRECTION] = to_record({
            n: (g - alpha * (p.detach() - a)).numpy()
            for n, g, p, a in zip(names, self.correction, trainable, self.anchors, strict=True)
        })  # fmt: skip


def test_feddyn_trains_bit_for_bit_as_its_recorded_runs_did() -> None:
    """Three rounds from the stored correction (the linear term non-zero from round 2):
    the weights sent and the correction kept are those of the spelled-out former client,
    bit for bit. Building the linear term after the cross-entropy sums each gradient in
    another order: the last bits differ, and so do replays of the committed records."""
    setups = [make_setup(counts=(80, 40, 20, 60), algo="feddyn", **{"dyn-alpha": 0.1,
              "local-epochs": 3}) for _ in range(2)]  # fmt: skip
    arrays = [global_arrays(), global_arrays()]
    for server_round in (1, 2, 3):
        ours = FedDynClient(setups[0]).train(arrays[0], server_round).arrays
        former = FormerFedDyn(setups[1]).train(arrays[1], server_round).arrays
        assert same(ours, former), server_round
        assert same(from_record(setups[0].state[CORRECTION]),
                    from_record(setups[1].state[CORRECTION]))  # fmt: skip
        arrays = [ours, former]


def test_ditto_personal_model_is_pulled_toward_the_global_one() -> None:
    start = global_arrays()
    personal = {}
    for lam in (0.0, 50.0):
        setup = make_setup(algo="ditto", **{"ditto-lambda": lam, "personal-epochs": 2})
        result = DittoClient(setup).train(start, 1)
        personal[lam] = from_record(setup.state[PERSONAL_MODEL])
        assert set(result.arrays) == set(start)  # the global copy is what is sent
        assert not same(personal[lam], result.arrays)
    assert distance(personal[50.0], start) < 0.5 * distance(personal[0.0], start)


def test_ditto_evaluates_the_personal_model() -> None:
    setup = make_setup(algo="ditto", **{"personal-epochs": 1})
    DittoClient(setup).train(global_arrays(), 1)
    client = DittoClient(setup)
    client.evaluate(global_arrays(), 2)
    assert same(client.personal.group_state(BASE, HEAD_G), from_record(setup.state[PERSONAL_MODEL]))


def test_fedper_sends_only_the_base_and_keeps_its_own_head() -> None:
    strategy = FedPerStrategy(RunConfig(algo="fedper"))
    assert set(strategy.arrays_to_send(global_arrays(), None)) == set(group(global_arrays(), BASE))
    setup = make_setup(algo="fedper")
    first = FedPerClient(setup).train(global_arrays(), 1)
    kept_head = group(first.arrays, HEAD_G)
    assert same(from_record(setup.state[HEAD_G]), kept_head)
    # Even if a server sent a (different) head, the client trains from its own.
    client = recording(FedPerClient)(setup)
    client.train(global_arrays(seed=3), 2)
    assert same(group(client.steps[0][0], HEAD_G), kept_head)


@pytest.mark.parametrize(
    ("switch", "processed", "has_private_head"),
    [
        ({}, 52 + 51, True),
        ({"fedreg-private-head": False}, 52 + 51, False),  # (b)
        ({"fedreg-rebalance": False}, 52 + 52, True),  # (c)
        ({"fedreg-original-step": False}, 51, True),  # (d)
    ],
)
def test_fedreg_ablation_switches(switch: dict, processed: int, has_private_head: bool) -> None:
    # drop-last off: every sample counts, so which data each step trained on shows
    client = FedReGClient(make_setup(**switch, **{"drop-last": False}))
    result = client.train(global_arrays(), 1)
    assert result.metrics[NUM_PROCESSED] == processed
    assert result.metrics[EFFECTIVE_EXAMPLES] == 29
    assert (client.model.head_p is not None) == has_private_head
    assert (HEAD_P in client.setup.state) == has_private_head


def test_fedreg_ablation_a_weights_the_head_by_train_size() -> None:
    default = FedReGStrategy(RunConfig())
    variant = FedReGStrategy(load_config({"fedreg-head-weight": "original"}))
    assert default.group_weights[HEAD_G] == EFFECTIVE_EXAMPLES
    assert variant.group_weights[HEAD_G] == NUM_EXAMPLES
    with pytest.raises(ConfigError, match="fedreg-head-weight='size'"):
        load_config({"fedreg-head-weight": "size"})


def test_info_constant_is_the_tests_dataset() -> None:
    assert INFO.num_classes == 4
