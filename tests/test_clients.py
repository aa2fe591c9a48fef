"""Client semantics of FedReG and FedAvg, on small in-memory data."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from clients.base import ClientSetup
from clients.fedavg import FedAvgClient
from clients.fedreg import FedReGClient
from fedreg_app.core.data import ClientData, DatasetInfo, TensorData
from fedreg_app.core.models import BASE, HEAD_G, HEAD_P, build_model
from fedreg_app.core.protocol import (
    EFFECTIVE_EXAMPLES,
    NUM_EXAMPLES,
    NUM_PROCESSED,
    PERSONAL_CORRECT,
)
from fedreg_app.registry import load_config

INFO = DatasetInfo(num_classes=4, channels=1, height=28, width=28)


def tensors(counts: list[int], seed: int) -> TensorData:
    g = torch.Generator().manual_seed(seed)
    y = torch.cat([torch.full((n,), c) for c, n in enumerate(counts)]).long()
    x = torch.randint(0, 256, (len(y), 1, 28, 28), generator=g, dtype=torch.uint8)
    return TensorData(x=x, y=y)


def make_setup(state: RecordDict | None = None, counts=(40, 3, 0, 9), **config) -> ClientSetup:
    # head-depth 2 for every algorithm: the fixtures' arrays are built at depth 2
    run_config = load_config({"local-epochs": 1, "batch-size": 8, "head-depth": 2, **config})
    data = ClientData(7, tensors(list(counts), 1), tensors([5, 5, 0, 5], 2))
    return ClientSetup(run_config, INFO, data, RecordDict() if state is None else state)


def global_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    return build_model(INFO, 2, seed).group_state(BASE, HEAD_G)


def group(arrays: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    return {k: v for k, v in arrays.items() if k.startswith(name + ".")}


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


class RecordingFedReG(FedReGClient):
    """Snapshots every group before and after each training step."""

    def __init__(self, setup: ClientSetup) -> None:
        super().__init__(setup)
        self.steps: list[tuple[dict, dict]] = []

    def fit(self, *args, **kwargs) -> int:
        before = self.model.group_state(BASE, HEAD_G, HEAD_P)
        processed = super().fit(*args, **kwargs)
        self.steps.append((before, self.model.group_state(BASE, HEAD_G, HEAD_P)))
        return processed


def test_fedreg_steps_move_only_their_parameters() -> None:
    client = RecordingFedReG(make_setup())
    result = client.train(global_arrays(), server_round=1)
    (before1, after1), (before2, after2) = client.steps
    # Step 1, original data: base and head_p move, head_g stays as received.
    assert same(group(before1, HEAD_G), group(after1, HEAD_G))
    assert not same(group(before1, BASE), group(after1, BASE))
    assert not same(group(before1, HEAD_P), group(after1, HEAD_P))
    # Step 2, rebalanced data: base and head_g move, head_p untouched.
    assert same(group(before2, HEAD_P), group(after2, HEAD_P))
    assert not same(group(before2, BASE), group(after2, BASE))
    assert not same(group(before2, HEAD_G), group(after2, HEAD_G))
    # The reply holds base + head_g after step 2, never head_p.
    assert not any(key.startswith("head_p.") for key in result.arrays)
    assert same(result.arrays, {**group(after2, BASE), **group(after2, HEAD_G)})


def test_fedreg_reports_sizes_and_effective_samples() -> None:
    # drop-last off: every sample of both passes counts, so the rebalanced size shows
    result = FedReGClient(make_setup(**{"drop-last": False})).train(global_arrays(), 1)
    # counts (40, 3, 0, 9): t = round(52/3) = 17; e = 17 + 3 + 9 = 29; rebalanced = 3 * 17
    assert result.metrics[NUM_EXAMPLES] == 52
    assert result.metrics[EFFECTIVE_EXAMPLES] == 29
    assert result.metrics[NUM_PROCESSED] == 52 + 51


def test_private_head_persists_in_client_state_across_rounds() -> None:
    state = RecordDict()
    first = FedReGClient(make_setup(state))
    first.train(global_arrays(), server_round=1)
    saved = first.model.group_state(HEAD_P)
    assert HEAD_P in state
    # A new procedure object (as in a later round) starts from the saved private head,
    # not from the initial one, even though the global model changed meanwhile.
    later = FedReGClient(make_setup(state))
    later.load_global(global_arrays(seed=1))
    later.restore_private()
    assert same(later.model.group_state(HEAD_P), saved)
    initial = build_model(INFO, 2, 0, private_head=True).group_state(HEAD_P)
    assert not same(saved, initial)


def test_never_trained_client_uses_the_initial_head_as_private_head() -> None:
    client = FedReGClient(make_setup())
    client.restore_private()
    initial = build_model(INFO, 2, 0, private_head=True).group_state(HEAD_P)
    assert same(client.model.group_state(HEAD_P), initial)


def test_fedreg_personal_prediction_sums_both_heads() -> None:
    client = FedReGClient(make_setup())
    features = torch.randn(4, 384)
    expected = client.model.head_g(features) + client.model.head_p(features)
    assert torch.allclose(client.personal_head(features), expected)


def test_fedavg_personal_model_is_the_global_model() -> None:
    client = FedAvgClient(make_setup(algo="fedavg"))
    counts = client.evaluate(global_arrays(), 1)
    model = build_model(INFO, 2, 0)
    x = client.data.test.x.float() / 127.5 - 1
    expected = int((model(x).argmax(1) == client.data.test.y).sum())
    assert counts[PERSONAL_CORRECT] == expected
    assert counts["num-test"] == 15


def test_fedavg_trains_and_sends_the_whole_model() -> None:
    result = FedAvgClient(make_setup(algo="fedavg")).train(global_arrays(), 1)
    assert result.arrays.keys() == global_arrays().keys()
    assert not same(result.arrays, global_arrays())
    assert result.metrics[NUM_PROCESSED] == 48  # 52 samples: whole batches of 8 (drop-last)


def test_same_seed_same_client_update() -> None:
    a = FedReGClient(make_setup()).train(global_arrays(), 3)
    b = FedReGClient(make_setup()).train(global_arrays(), 3)
    c = FedReGClient(make_setup()).train(global_arrays(), 4)  # other round, other shuffle
    assert same(a.arrays, b.arrays)
    assert not same(a.arrays, c.arrays)


def test_single_class_and_tiny_clients_train_and_evaluate() -> None:
    for counts in ((12, 0, 0, 0), (1, 0, 0, 1), (1, 0, 0, 0)):
        setup = make_setup(counts=counts)
        result = FedReGClient(setup).train(global_arrays(), 1)
        assert result.metrics[EFFECTIVE_EXAMPLES] == sum(counts)
        assert all(np.isfinite(v).all() for v in result.arrays.values())
        counts_eval = FedReGClient(setup).evaluate(result.arrays, 1)
        assert counts_eval["num-test"] == 15


def numel(arrays: dict[str, np.ndarray]) -> int:
    return sum(int(v.size) for v in arrays.values())


def test_trained_parameter_count_is_what_each_algorithm_updates() -> None:
    from clients.fedbabu import FedBABUClient
    from fedreg_app.core.protocol import NUM_TRAINED_PARAMS

    model = build_model(INFO, 2, 0, private_head=True)
    sizes = {g: numel(model.group_state(g)) for g in (BASE, HEAD_G, HEAD_P)}
    fedreg = FedReGClient(make_setup()).train(global_arrays(), server_round=1)
    assert fedreg.metrics[NUM_TRAINED_PARAMS] == sizes[BASE] + sizes[HEAD_G] + sizes[HEAD_P]
    fedavg = FedAvgClient(make_setup()).train(global_arrays(), server_round=1)
    assert fedavg.metrics[NUM_TRAINED_PARAMS] == sizes[BASE] + sizes[HEAD_G]
    fedbabu = FedBABUClient(make_setup(algo="fedbabu")).train(global_arrays(), server_round=1)
    assert fedbabu.metrics[NUM_TRAINED_PARAMS] == sizes[BASE]  # the head never trains


# ------------------------------------------------------------- optimizer state
def test_persistent_optimizer_continues_momentum_as_one_optimizer_kept_across_rounds() -> None:
    """Two FedAvg rounds with the client's optimizer kept (the default) give exactly what
    one MomentumSGD made once and reused gives, the weights overwritten by the server's
    in between (PFLlib's client keeps its optimizer; the thesis makes it once)."""
    from fedreg_app.core.seeds import torch_generator
    from fedreg_app.core.training import MomentumSGD, train_epochs

    state = RecordDict()
    rounds = [(global_arrays(0), 1), (global_arrays(1), 2)]
    sent = [FedAvgClient(make_setup(state)).train(arrays, r).arrays for arrays, r in rounds]

    setup = make_setup()
    model = FedAvgClient(setup).model
    params = model.parameters_of(BASE, HEAD_G)
    optimizer = MomentumSGD(params, lr=setup.config.lr, momentum=setup.config.momentum)
    for (arrays, server_round), ours in zip(rounds, sent, strict=True):
        model.load_group_state(arrays, BASE, HEAD_G)
        train_epochs(model, params, lambda x, y: torch.nn.functional.cross_entropy(model(x), y),
                     setup.data.train, epochs=1, batch_size=8, lr=setup.config.lr,
                     momentum=setup.config.momentum, device=torch.device("cpu"),
                     generator=torch_generator(0, "shuffle", 7, server_round, 0),
                     optimizer=optimizer, drop_last=setup.config.drop_last)  # fmt: skip
        assert same(model.group_state(BASE, HEAD_G), ours)


def test_fresh_optimizer_state_keeps_nothing_and_differs_from_round_two_on() -> None:
    kept, fresh = RecordDict(), RecordDict()
    results = {}
    for name, state, mode in (("kept", kept, "persistent"), ("fresh", fresh, "fresh")):
        for arrays, server_round in ((global_arrays(0), 1), (global_arrays(1), 2)):
            client = FedAvgClient(make_setup(state, **{"optimizer-state": mode}))
            results[name, server_round] = client.train(arrays, server_round).arrays
    assert len(fresh) == 0 and list(kept) == ["optimizer-0"]
    assert same(results["kept", 1], results["fresh", 1])  # nothing to continue from yet
    assert not same(results["kept", 2], results["fresh", 2])


def test_fedreg_keeps_two_optimizers_each_over_its_own_step() -> None:
    """opt_1 over base + head_p, opt_2 over base + head_g: two momentum buffers for the
    base (thesis §3.3.2)."""
    state = RecordDict()
    FedReGClient(make_setup(state)).train(global_arrays(), 1)
    first = {k.split(".")[0] for k in state["optimizer-1"]}
    second = {k.split(".")[0] for k in state["optimizer-2"]}
    assert first == {BASE, HEAD_P} and second == {BASE, HEAD_G}


def test_momentum_of_the_wrong_shape_in_the_state_is_refused() -> None:
    from fedreg_app.core.records import to_record

    state = RecordDict()
    FedAvgClient(make_setup(state)).train(global_arrays(), 1)
    buffers = {k: v.numpy() for k, v in state["optimizer-0"].items()}
    name = next(iter(buffers))
    state["optimizer-0"] = to_record({**buffers, name: np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match=f"optimizer-0.*{name}"):
        FedAvgClient(make_setup(state)).train(global_arrays(), 2)


def test_optimizer_state_value_is_checked() -> None:
    from fedreg_app.core.config import ConfigError

    with pytest.raises(ConfigError, match="optimizer-state='kept'.*persistent, fresh"):
        load_config({"optimizer-state": "kept"})
