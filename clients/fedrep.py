"""FedRep client (Collins et al. 2021): each round, the client's own head is trained
``personal-epochs`` (5) epochs with the base frozen, then the base ``base-epochs`` (1)
epoch with the head frozen. Only the base comes from the server; the head stays private
(uploaded only for the paper's evaluation-only global model, like FedPer). The head
epochs train on the frozen base's features, computed once (``fit_head``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clients.base import PersonalEpochs, TrainResult
from clients.fedper import FedPerClient
from fedreg_app.core.config import at_least, option
from fedreg_app.core.models import BASE, HEAD_G


@dataclass(frozen=True)
class FedRepOptions(PersonalEpochs):
    base_epochs: int = option(
        "base-epochs", 1, "an integer >= 1", at_least(1),
        doc="FedRep: base epochs after the head epochs; FedAvg2Rep: whole-model epochs "
        "after the head epochs.",
        source='thesis §5.3 ("only one round", after the FedRep paper and code); `003` '
        "eq. 4. PFLlib's `clientrep.py` trains the base `local-epochs` (5) epochs",
    )  # fmt: skip


class FedRepClient(FedPerClient):
    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        options = self.config.options_as(FedRepOptions)
        self.load_global(global_arrays)
        self.restore_private()
        processed = self.fit_head(options.personal_epochs, server_round, stream=1)
        processed += self.fit(
            self.model.parameters_of(BASE),
            self.cross_entropy(self.model),
            self.data.train,
            options.base_epochs,
            server_round,
            stream=2,
        )
        self.save_private()
        return TrainResult(self.model.group_state(BASE, HEAD_G), self.train_metrics(processed))
