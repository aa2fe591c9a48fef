"""Every algorithm on next-character text with ``003``'s CharLSTM: the base/head split
(embedding + LSTM | Linear) works for each, in-process on tiny generated sequences."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from clients.base import ClientSetup
from fedreg_app.core.data import ClientData, DatasetInfo, TensorData
from fedreg_app.core.models import BASE, HEAD_P, initial_model
from fedreg_app.core.protocol import NUM_TRAINED_PARAMS, PERSONAL_CORRECT
from fedreg_app.registry import ALGORITHMS, federated_algorithm_names, load_config

TEXT = DatasetInfo(num_classes=80, channels=1, height=1, width=12, modality="text")


def snippets(n: int, seed: int) -> TensorData:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 80, (n, TEXT.width), generator=g, dtype=torch.int16)
    return TensorData(x=x, y=torch.randint(0, 5, (n,), generator=g))


@pytest.mark.parametrize("algo", federated_algorithm_names())
def test_every_algorithm_trains_and_evaluates_the_char_lstm(algo: str) -> None:
    config = load_config({
        "algo": algo, "model": "charlstm", "head-depth": 1, "local-epochs": 1,
        "batch-size": 8, "personal-epochs": 1, "finetune-epochs": 1, "num-server-rounds": 3,
        "deviation-finetune-rounds": 1, "fedavg2rep-warmup-rounds": 1,
    })  # fmt: skip
    algorithm = ALGORITHMS[algo]
    strategy = algorithm.strategy(config)
    server_model = initial_model(TEXT, config)
    strategy.prepare_model(server_model)
    server_arrays = {k: v.numpy() for k, v in server_model.state_dict().items()}
    sent = strategy.arrays_to_send(server_arrays, 1)  # what round 1's training gets
    setup = ClientSetup(config, TEXT, ClientData(0, snippets(16, 1), snippets(8, 2)), RecordDict())
    before = {k: v.copy() for k, v in sent.items()}
    result = algorithm.client(setup).train(sent, server_round=1)
    assert result.metrics[NUM_TRAINED_PARAMS] > 0
    assert not any(key.startswith(HEAD_P + ".") for key in result.arrays)  # stays private
    moved = [k for k, v in result.arrays.items() if not np.array_equal(v, before.get(k, v))]
    assert any(key.startswith(BASE + ".") for key in moved) or algo == "lg-fedavg"
    evaluated = strategy.arrays_to_send(server_arrays, None)  # evaluation: as it sends
    evaluation = algorithm.client(setup).evaluate(evaluated, server_round=1)
    assert 0 <= evaluation[PERSONAL_CORRECT] <= 8
