"""FedAvg2Rep client (``003_…``, Algorithm 3): ``fedavg2rep-warmup-rounds`` (T1) rounds of
FedAvg, then 003's FedRep round (its Algorithm 2, ``FedRepClientUpdate``) until the end.

Every round, warm-up or not, the client starts from the whole global model the server
sends, head included (Algorithm 2, line 2: w_k ← w^(t-1)); no weights of its previous
rounds are trained on (with ``optimizer-state = persistent`` its optimizers' momentum
carries over, as for every algorithm). After the warm-up a round is: the head alone,
``personal-epochs`` epochs with the base frozen (lines 3-6; on the frozen base's
features, computed once, ``fit_head``), then the entire model, base and head,
``base-epochs`` epochs (line 8, eq. 4: "one single gradient update of the weight of the
entire model"). The whole model is returned and averaged (line 18). 003 counts local
steps J (J - 1 head steps, one full step); this project counts epochs, as for its FedRep.

003 reports test-set accuracy of the global model and defines no separate personal
evaluation. Here a client's personal model is, as for FedRep, the current global base
with the head of the client's last FedRep round (kept in its state for evaluation only,
never trained on again); before its first FedRep round, the global model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clients.base import TrainResult
from clients.fedavg import FedAvgClient
from clients.fedrep import FedRepOptions
from fedreg_app.core.config import at_least, option
from fedreg_app.core.models import BASE, HEAD_G
from fedreg_app.core.records import from_record, to_record

#: The head of the client's last FedRep round: its personal model's head.
PERSONAL_HEAD = "fedavg2rep-head"


@dataclass(frozen=True)
class FedAvg2RepOptions(FedRepOptions):
    warmup_rounds: int = option(
        "fedavg2rep-warmup-rounds", 5, "an integer >= 0 (T1)", at_least(0),
        doc="T1: rounds of FedAvg before FedRep.",
        source="`003` Algorithm 3 (the value is ours; `003` runs 500 warm-up rounds)",
    )  # fmt: skip


def in_warmup(server_round: int, warmup_rounds: int) -> bool:
    return server_round <= warmup_rounds


class FedAvg2RepClient(FedAvgClient):
    #: The whole model, every round (003, Algorithm 2, line 2); no private groups.
    shared_groups = (BASE, HEAD_G)
    state_records = (PERSONAL_HEAD,)

    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        options = self.config.options_as(FedAvg2RepOptions)
        if in_warmup(server_round, options.warmup_rounds):
            return super().train(global_arrays, server_round)  # FedAvg (Algorithm 1)
        self.load_global(global_arrays)  # the global head too, not the client's last one
        processed = self.fit_head(options.personal_epochs, server_round, stream=1)
        processed += self.fit(
            self.model.parameters_of(BASE, HEAD_G),  # the entire model (eq. 4)
            self.cross_entropy(self.model),
            self.data.train,
            options.base_epochs,
            server_round,
            stream=2,
        )
        self.setup.state[PERSONAL_HEAD] = to_record(self.model.group_state(HEAD_G))
        return TrainResult(self.model.group_state(BASE, HEAD_G), self.train_metrics(processed))

    def prepare_personal_model(self, server_round: int) -> None:
        """The global base with the head of the client's last FedRep round, if any."""
        stored = self.setup.state.get(PERSONAL_HEAD)
        if stored is not None:
            self.model.load_group_state(from_record(stored), HEAD_G)
