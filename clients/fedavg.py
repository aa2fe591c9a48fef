"""FedAvg client: train the whole model for E epochs; the personal model is the global one.

Also the round that FedProx, FedDyn, FedPer and Ditto build on: they change the loss
(``local_loss``), what is kept private (``private_groups``) or add work around it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch import nn

from clients.base import ClientProcedure, TrainResult
from fedreg_app.core.models import BASE, HEAD_G
from fedreg_app.core.training import LossFn


class FedAvgClient(ClientProcedure):
    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        self.load_global(global_arrays)
        self.restore_private()
        trainable = self.model.parameters_of(BASE, HEAD_G)
        processed = self.fit(
            trainable,
            self.local_loss(trainable),
            self.data.train,
            self.config.local_epochs,
            server_round,
        )
        self.after_local_training(trainable)
        self.save_private()
        return TrainResult(self.model.group_state(BASE, HEAD_G), self.train_metrics(processed))

    def local_loss(self, trainable: Sequence[nn.Parameter]) -> LossFn:
        """The loss of local training; called once per round, before training starts."""
        return self.cross_entropy(self.model)

    def after_local_training(self, trainable: Sequence[nn.Parameter]) -> None:
        """Hook after local training (FedDyn updates its correction here)."""
