"""FedReG server (paper eq. 4-5, thesis eq. 3.5-3.10).

base <- sum_k |D_k| / sum|D| * base_k ;  head_g <- sum_k e_k / sum e * head_g,k
with e_k the effective (non-augmented) samples of client k's rebalanced dataset.
Ablation (a), ``fedreg-head-weight = "original"``, weights head_g by |D_k| too.

With ``fedreg-dyn-alpha`` > 0 (our variant, FedReG with FedDyn's regulariser) the server
keeps FedDyn's h over base and head_g and subtracts h / alpha from that weighted average
(``strategies/feddyn.py``, :func:`~strategies.feddyn.dynamic_step`).
"""

from __future__ import annotations

import numpy as np

from clients.fedreg import FedReGOptions
from fedreg_app.core.config import RunConfig
from fedreg_app.core.models import BASE, HEAD_G
from fedreg_app.core.protocol import EFFECTIVE_EXAMPLES, NUM_EXAMPLES
from strategies.base import Update
from strategies.feddyn import DynamicState, dynamic_step
from strategies.replies import RunFacts


class FedReGStrategy(DynamicState):
    works_from_average = True

    def __init__(self, config: RunConfig, facts: RunFacts | None = None) -> None:
        super().__init__(config, facts)
        options = config.options_as(FedReGOptions)
        head_weight = EFFECTIVE_EXAMPLES if options.head_weight == "effective" else NUM_EXAMPLES
        self.group_weights = {BASE: NUM_EXAMPLES, HEAD_G: head_weight}
        self.dyn_alpha = options.dyn_alpha

    def aggregate_updates(self, server_round: int, updates: list[Update]) -> dict[str, np.ndarray]:
        average = self.average_updates(server_round, updates)
        if self.dyn_alpha == 0:
            return average
        return dynamic_step(
            self._current, average, updates, self.h, self.dyn_alpha, self.num_partitions,
            drift_from_average=self.from_aggregate_only,
        )  # fmt: skip
