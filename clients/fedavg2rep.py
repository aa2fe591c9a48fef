"""FedAvg2Rep client (``003_…``): ``fedavg2rep-warmup-rounds`` (T1) rounds of FedAvg, then
FedRep. During the warm-up the whole model is trained and shared and nothing is kept on
the client; from round T1 + 1 the head becomes the client's own. A client's first FedRep
round starts its head from the warmed-up global head the server sends (later rounds from
its own head, kept in its state).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clients.base import TrainResult
from clients.fedavg import FedAvgClient
from clients.fedrep import FedRepClient, FedRepOptions
from fedreg_app.config import at_least, option
from fedreg_app.models import BASE, HEAD_G


@dataclass(frozen=True)
class FedAvg2RepOptions(FedRepOptions):
    warmup_rounds: int = option("fedavg2rep-warmup-rounds", 5, "an integer >= 0 (T1)",
                                at_least(0))  # fmt: skip


def in_warmup(server_round: int, warmup_rounds: int) -> bool:
    return server_round <= warmup_rounds


class FedAvg2RepClient(FedRepClient):
    shared_groups = (BASE, HEAD_G)  # the head too: the starting point of a first FedRep round

    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        if in_warmup(server_round, self.config.options_as(FedAvg2RepOptions).warmup_rounds):
            self.private_groups = ()  # FedAvg: nothing of the head is kept on the client
            return FedAvgClient.train(self, global_arrays, server_round)
        return super().train(global_arrays, server_round)
