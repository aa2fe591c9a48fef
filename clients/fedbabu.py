"""FedBABU client (Oh et al. 2022): the head stays at its shared random initialisation
during federated training; only the base is trained (E epochs) and aggregated.

Personal model: before each evaluation the client fine-tunes a copy of the head for
``finetune-epochs`` (10) epochs on its train split and tests that copy; nothing of the
fine-tuning is kept. The head trains on the frozen base's features, computed once
(``fit_head``). ``finetune-base = true`` fine-tunes the whole model instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clients.base import ClientProcedure, TrainResult
from fedreg_app.config import AlgorithmOptions, at_least, option
from fedreg_app.models import BASE


@dataclass(frozen=True)
class FedBABUOptions(AlgorithmOptions):
    finetune_epochs: int = option("finetune-epochs", 10, "an integer >= 0", at_least(0))
    finetune_base: bool = option("finetune-base", False, "true or false")


class FedBABUClient(ClientProcedure):
    #: The head is the shared initial one, which the client builds itself.
    shared_groups = (BASE,)

    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        self.load_global(global_arrays)
        processed = self.fit(
            self.model.parameters_of(BASE),
            self.cross_entropy(self.model),
            self.data.train,
            self.config.local_epochs,
            server_round,
        )
        return TrainResult(self.model.group_state(BASE), self.train_metrics(processed))

    def prepare_personal_model(self, server_round: int) -> None:
        options = self.config.options_as(FedBABUOptions)
        epochs = options.finetune_epochs
        if options.finetune_base:
            self.fit(
                list(self.model.parameters()),
                self.cross_entropy(self.model),
                self.data.train,
                epochs,
                server_round,
                stream=3,
            )
            return
        self.fit_head(epochs, server_round, stream=3)
