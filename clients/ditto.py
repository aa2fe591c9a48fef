"""Ditto client (Li et al. 2021): a FedAvg round for the global model, plus a personal
model v_k trained ``personal-epochs`` (5) epochs with CE + lambda/2 ||v_k - w_g||^2
(lambda = ``ditto-lambda``). v_k lives in the client's state (first time: a copy of the
global model) and is the personal model at evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import nn

from clients.base import PersonalEpochs, TrainResult, snapshot, squared_distance
from clients.fedavg import FedAvgClient
from fedreg_app.config import at_least, option
from fedreg_app.models import BASE, HEAD_G, SplitModel
from fedreg_app.protocol import NUM_PROCESSED
from fedreg_app.records import from_record, to_record
from fedreg_app.training import Forward

PERSONAL_MODEL = "ditto-personal"


@dataclass(frozen=True)
class DittoOptions(PersonalEpochs):
    #: The paper gives no lambda; 0.1 is this project's choice (README key table).
    lam: float = option("ditto-lambda", 0.1, "a number >= 0 (pull toward the global model)",
                        at_least(0))  # fmt: skip


class DittoClient(FedAvgClient):
    state_records = (PERSONAL_MODEL,)

    def __init__(self, setup) -> None:
        super().__init__(setup)
        self.options = self.config.options_as(DittoOptions)
        self.personal: SplitModel = self.new_model()

    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        self.load_global(global_arrays)
        self.restore_personal(global_arrays)
        lam = self.options.lam
        global_weights = snapshot(self.model.parameters_of(BASE, HEAD_G))
        personal_params = self.personal.parameters_of(BASE, HEAD_G)
        ce = self.cross_entropy(self.personal)
        processed = self.fit(
            personal_params,
            lambda x, y: ce(x, y) + lam / 2 * squared_distance(personal_params, global_weights),
            self.data.train,
            self.options.personal_epochs,
            server_round,
            stream=1,
            model=self.personal,
        )
        self.setup.state[PERSONAL_MODEL] = to_record(self.personal.group_state(BASE, HEAD_G))
        result = super().train(global_arrays, server_round)
        result.metrics[NUM_PROCESSED] = int(result.metrics[NUM_PROCESSED]) + processed
        return result

    def restore_personal(self, global_arrays: dict[str, np.ndarray]) -> None:
        stored = self.setup.state.get(PERSONAL_MODEL)
        arrays = from_record(stored) if stored is not None else global_arrays
        self.personal.load_group_state(arrays, BASE, HEAD_G)

    def prepare_personal_model(self, server_round: int) -> None:
        self.restore_personal(self.model.group_state(BASE, HEAD_G))
        self.personal.eval()

    def personal_parts(self) -> tuple[nn.Module, Forward]:
        return self.personal.base, self.personal.head_g
