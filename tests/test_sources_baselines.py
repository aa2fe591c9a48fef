"""Three baselines configured as their sources run them: FedBABU
fine-tunes after the last round only (PFLlib's serverbabu.py), Ditto's personal model
starts as the initial model (PFLlib's clientditto.py), FedAvg2Rep's FedRep rounds start
from the whole global model and return all of it (003's Algorithms 2 and 3)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clients.ditto import PERSONAL_MODEL, DittoClient
from clients.fedavg import FedAvgClient
from clients.fedavg2rep import PERSONAL_HEAD, FedAvg2RepClient
from clients.fedbabu import FedBABUClient
from clients.fedper import FedPerClient
from fedreg_app.client_app import global_model_parts
from fedreg_app.core.config import ConfigError
from fedreg_app.core.models import BASE, HEAD_G, build_model
from fedreg_app.core.protocol import GLOBAL_CORRECT, NUM_EXAMPLES, PERSONAL_CORRECT
from fedreg_app.core.records import from_record
from fedreg_app.core.training import count_correct_each, eval_batches
from fedreg_app.registry import algorithm_of, load_config
from strategies.fedavg2rep import FedAvg2RepStrategy
from tests.test_baselines import recording
from tests.test_clients import INFO, global_arrays, group, make_setup, same

ROUNDS = 3  # the final round of these tests' runs


def initial_arrays() -> dict[str, np.ndarray]:
    """The run's initial model (seed 0, head-depth 2): what every client builds."""
    return build_model(INFO, 2, 0).group_state(BASE, HEAD_G)


def evaluate(client, arrays: dict[str, np.ndarray], server_round: int) -> dict[str, int]:
    """Evaluate as the ClientApp does, the global model built from ``arrays`` included."""
    parts = global_model_parts(algorithm_of(client.setup.config), client.setup, arrays)
    return client.evaluate(arrays, server_round, parts)


@torch.no_grad()
def logits(client, arrays: dict[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """The personal and the global model's logits on the client's test split."""
    base, head = global_model_parts(algorithm_of(client.setup.config), client.setup, arrays)
    personal, glob = [], []
    for x, _ in eval_batches(client.data.test, client.device):
        personal.append(client.personal_predict(x))
        glob.append(head(base(x)))
    return torch.cat(personal), torch.cat(glob)


# ---------------------------------------------------------------------------- FedBABU
def fedbabu_run(**keys):
    """A FedBABU client, and the global model after one round of its training."""
    setup = make_setup(algo="fedbabu", **{"num-server-rounds": ROUNDS,
                                          "finetune-epochs": 2, **keys})  # fmt: skip
    trained = FedBABUClient(setup).train(global_arrays(), 1).arrays
    return recording(FedBABUClient)(setup), {**global_arrays(), **trained}


def test_fedbabu_default_fine_tunes_at_the_final_round_only() -> None:
    assert load_config({"algo": "fedbabu"}).options.finetune_when == "final"
    client, arrays = fedbabu_run()
    counts = evaluate(client, arrays, 1)  # not the final round: P = G
    assert client.steps == []  # no fine-tuning happened
    assert same(client.model.group_state(HEAD_G), group(initial_arrays(), HEAD_G))
    personal, glob = logits(client, arrays)
    assert torch.equal(personal, glob)
    assert counts[PERSONAL_CORRECT] == counts[GLOBAL_CORRECT]

    final, _ = fedbabu_run()
    evaluate(final, arrays, ROUNDS)  # the final round: the head is fine-tuned
    [(before, after)] = final.steps
    assert same(group(before, BASE), group(after, BASE))  # head only (finetune-base=false)
    assert not same(final.model.group_state(HEAD_G), group(initial_arrays(), HEAD_G))
    personal, glob = logits(final, arrays)
    assert not torch.allclose(personal, glob)


def test_fedbabu_every_eval_fine_tunes_before_every_evaluation() -> None:
    for server_round in (1, ROUNDS):
        client, arrays = fedbabu_run(**{"finetune-when": "every-eval"})
        evaluate(client, arrays, server_round)
        assert len(client.steps) == 1
        assert not same(client.model.group_state(HEAD_G), group(initial_arrays(), HEAD_G))
        personal, glob = logits(client, arrays)
        assert not torch.allclose(personal, glob)


def test_fedbabu_finetune_base_at_the_final_round_moves_the_base_too() -> None:
    client, arrays = fedbabu_run(**{"finetune-base": True})
    evaluate(client, arrays, ROUNDS)
    [(before, after)] = client.steps
    assert not same(group(before, BASE), group(after, BASE))
    assert not same(group(before, HEAD_G), group(after, HEAD_G))


def test_fedbabu_finetune_when_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"finetune-when='last'.*final, every-eval"):
        load_config({"algo": "fedbabu", "finetune-when": "last"})


# ------------------------------------------------------------------------------ Ditto
class RecordingDitto(DittoClient):
    """Snapshots v_k before each training of it."""

    def __init__(self, setup) -> None:
        super().__init__(setup)
        self.personal_starts: list[dict[str, np.ndarray]] = []

    def fit(self, *args, **kwargs) -> int:
        if kwargs.get("model") is self.personal:
            self.personal_starts.append(self.personal.group_state(BASE, HEAD_G))
        return super().fit(*args, **kwargs)


def test_ditto_never_sampled_client_is_evaluated_with_the_initial_model() -> None:
    assert load_config({"algo": "ditto"}).options.personal_init == "initial"
    current = global_arrays(seed=3)  # the global model of some later round
    assert not same(current, initial_arrays())
    client = DittoClient(make_setup(algo="ditto"))
    counts = evaluate(client, current, 5)
    assert same(client.personal.group_state(BASE, HEAD_G), initial_arrays())
    model = build_model(INFO, 2, 0).eval()
    expected = count_correct_each({"initial": (model.base, model.head_g)}, client.data.test,
                                  client.device)  # fmt: skip
    assert counts[PERSONAL_CORRECT] == expected["initial"]
    assert PERSONAL_MODEL not in client.setup.state  # evaluation stores nothing


def test_ditto_global_init_evaluates_a_never_sampled_client_with_the_global_model() -> None:
    current = global_arrays(seed=3)
    client = DittoClient(make_setup(algo="ditto", **{"ditto-personal-init": "global"}))
    counts = evaluate(client, current, 5)
    assert same(client.personal.group_state(BASE, HEAD_G), current)
    assert counts[PERSONAL_CORRECT] == counts[GLOBAL_CORRECT]


@pytest.mark.parametrize(
    ("init", "start"), [("initial", initial_arrays), ("global", lambda: global_arrays(seed=3))]
)
def test_ditto_first_personal_training_starts_from(init: str, start) -> None:
    setup = make_setup(algo="ditto", **{"ditto-personal-init": init, "personal-epochs": 1})
    client = RecordingDitto(setup)
    client.train(global_arrays(seed=3), 4)
    assert same(client.personal_starts[0], start())
    # Later rounds continue the client's own v_k, whatever the server sends.
    kept = from_record(setup.state[PERSONAL_MODEL])
    later = RecordingDitto(setup)
    later.train(global_arrays(seed=5), 5)
    assert same(later.personal_starts[0], kept)


def test_ditto_global_copy_trains_exactly_as_a_fedavg_client() -> None:
    """Ditto's global model is FedAvg's (the full-scale Table 2 runs record equal G in
    every round): training v_k first must not touch the global copy's shuffles,
    optimizer state or weights. Two rounds, so kept momentum is compared too."""
    ditto_setup, fedavg_setup = make_setup(algo="ditto"), make_setup(algo="fedavg")
    arrays = global_arrays(seed=3)
    for server_round in (1, 2):
        ditto = DittoClient(ditto_setup).train(arrays, server_round)
        fedavg = FedAvgClient(fedavg_setup).train(arrays, server_round)
        assert same(ditto.arrays, fedavg.arrays)
        assert not same(ditto.arrays, arrays)  # the global copy did train
        arrays = ditto.arrays
    assert not same(from_record(ditto_setup.state[PERSONAL_MODEL]), arrays)


def test_ditto_personal_init_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"ditto-personal-init='zero'.*initial, global"):
        load_config({"algo": "ditto", "ditto-personal-init": "zero"})


# ------------------------------------------------------------------------- FedAvg2Rep
def test_fedavg2rep_every_fedrep_round_starts_from_the_whole_global_model() -> None:
    """003, Algorithm 2: w_k <- w^(t-1) (head included), head steps, then a step of the
    entire model; the whole model is returned. Nothing of a round is trained on later."""
    setup = make_setup(algo="fedavg2rep", **{"fedavg2rep-warmup-rounds": 2})
    for server_round in (1, 2):  # warm-up: FedAvg, one fit of the whole model
        client = recording(FedAvg2RepClient)(setup)
        client.train(global_arrays(), server_round)
        assert len(client.steps) == 1 and PERSONAL_HEAD not in setup.state
    for server_round, seed in ((3, 4), (4, 5), (5, 6)):  # FedRep rounds
        sent = global_arrays(seed=seed)
        client = recording(FedAvg2RepClient)(setup)
        result = client.train(sent, server_round)
        (head_before, head_after), (full_before, full_after) = client.steps
        assert same(head_before, sent)  # the global head, not the client's last one
        assert same(group(head_before, BASE), group(head_after, BASE))  # base frozen
        assert not same(group(head_before, HEAD_G), group(head_after, HEAD_G))
        for name in (BASE, HEAD_G):  # then the entire model (eq. 4)
            assert not same(group(full_before, name), group(full_after, name))
        assert same(result.arrays, full_after)  # the whole model goes back
        assert same(from_record(setup.state[PERSONAL_HEAD]), group(full_after, HEAD_G))
    assert HEAD_G not in setup.state  # no private head for training


def test_fedavg2rep_server_sends_and_averages_the_whole_model_after_the_warmup() -> None:
    config = load_config({"algo": "fedavg2rep", "fedavg2rep-warmup-rounds": 2})
    strategy = FedAvg2RepStrategy(config)
    arrays = global_arrays()
    for server_round in (1, 3, None):  # warm-up, FedRep, evaluation
        assert same(strategy.arrays_to_send(arrays, server_round), arrays)
    strategy._current = arrays
    assert strategy.expected_reply_arrays(3).keys() == arrays.keys()
    a, b = global_arrays(seed=1), global_arrays(seed=2)
    merged = strategy.aggregate_updates(3, [(a, {NUM_EXAMPLES: 1}), (b, {NUM_EXAMPLES: 3})])
    assert merged.keys() == arrays.keys()
    for key in group(arrays, HEAD_G):  # the heads are averaged by |D_k| (003, eq. 1)
        np.testing.assert_allclose(merged[key], 0.25 * a[key] + 0.75 * b[key], rtol=1e-5,
                                   atol=1e-7)  # fmt: skip


def test_fedavg2rep_personal_model_is_the_global_base_with_the_last_fedrep_head() -> None:
    setup = make_setup(algo="fedavg2rep", **{"fedavg2rep-warmup-rounds": 1})
    current = global_arrays(seed=7)
    before = FedAvg2RepClient(setup)  # no FedRep round yet: the global model
    counts = evaluate(before, current, 2)
    assert counts[PERSONAL_CORRECT] == counts[GLOBAL_CORRECT]
    assert same(before.model.group_state(BASE, HEAD_G), current)
    FedAvg2RepClient(setup).train(global_arrays(seed=4), 2)
    client = FedAvg2RepClient(setup)
    evaluate(client, current, 3)
    assert same(client.model.group_state(BASE), group(current, BASE))
    assert same(client.model.group_state(HEAD_G), from_record(setup.state[PERSONAL_HEAD]))


# ------------------------------------------------------------ evaluation's passes
def head_calls(client, arrays: dict[str, np.ndarray]) -> tuple[dict[str, int], int, int]:
    """Evaluate as the ClientApp does, counting the calls of the client's head and of the
    global model's head; also the number of evaluation batches."""
    base, head = global_model_parts(algorithm_of(client.setup.config), client.setup, arrays)
    calls = {"client": 0, "global": 0}
    for name, module in (("client", client.model.head_g), ("global", head)):
        module.register_forward_hook(lambda *_, n=name: calls.__setitem__(n, calls[n] + 1))
    counts = client.evaluate(arrays, 1, (base, head))
    batches = len(list(eval_batches(client.data.test, client.device)))
    return counts, calls["client"] + calls["global"], batches


def test_a_personal_model_equal_to_the_global_one_is_run_once_per_batch() -> None:
    """FedAvg's personal model is the global model: one pass of base and head serves both
    counts. FedPer's personal head is its own (trained here), so its head runs twice, and
    the counts are each model's own."""
    fedavg = FedAvgClient(make_setup(algo="fedavg"))
    counts, calls, batches = head_calls(fedavg, global_arrays())
    assert calls == batches
    assert counts[PERSONAL_CORRECT] == counts[GLOBAL_CORRECT]
    fedper = FedPerClient(make_setup(algo="fedper"))
    fedper.train(global_arrays(), 1)  # its private head moves away from the global one
    counts, calls, batches = head_calls(fedper, global_arrays())
    assert calls == 2 * batches
    personal, glob = logits(fedper, global_arrays())
    y = fedper.data.test.y
    assert counts[PERSONAL_CORRECT] == int((personal.argmax(1) == y).sum())
    assert counts[GLOBAL_CORRECT] == int((glob.argmax(1) == y).sum())
