"""FedDyn server (Acar et al. 2021), with N clients in all and S sampled this round:

h   <- h - alpha * (1/N) * sum_{k in S} (w_k - w_g)
w_g <- (1/|S|) * sum_{k in S} w_k - h / alpha

h starts at zero and is the strategy's state. alpha = ``dyn-alpha`` (0.01).

Under central DP the server sees only the private release: the mean update
(1/|S|) sum (w_k - w_g) is replaced by the base strategy's noisy fixed-denominator average
of the clipped updates, and h and w_g are computed from it (post-processing, so the
guarantee holds for h too). That release weights clients by their sample counts, as
FedAvg's does, where FedDyn's own mean is uniform over the sampled clients.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from clients.feddyn import FedDynOptions
from fedreg_app.config import RunConfig
from strategies.base import PersonalizedStrategy, Update


class FedDynStrategy(PersonalizedStrategy):
    #: ``aggregate_updates`` works from the private release under central DP.
    private_aggregation = True

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.alpha = config.options_as(FedDynOptions).alpha
        self.h: dict[str, np.ndarray] = {}

    def state_dict(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, state = super().state_dict()
        return {**arrays, **self.h}, state

    def load_state_dict(self, arrays: dict[str, np.ndarray], state: dict[str, Any]) -> None:
        super().load_state_dict(arrays, state)
        self.h = dict(arrays)

    def aggregate_updates(self, server_round: int, updates: list[Update]) -> dict[str, np.ndarray]:
        released = (
            super().aggregate_updates(server_round, updates)
            if self.config.dp_mode == "central"
            else None
        )
        new_global = {}
        for key in updates[0][0]:
            w_g = self._current[key].astype(np.float64)
            if released is None:
                client_weights = [np.asarray(a[key], dtype=np.float64) for a, _ in updates]
                drift = sum(w_k - w_g for w_k in client_weights)
                mean = sum(client_weights) / len(client_weights)
            else:  # the private mean, w_g plus the noisy average update, and its drift
                mean = np.asarray(released[key], dtype=np.float64)
                drift = len(updates) * (mean - w_g)
            h = self.h.get(key, np.zeros_like(w_g)) - self.alpha * drift / self.num_partitions
            self.h[key] = h
            new_global[key] = (mean - h / self.alpha).astype(self._current[key].dtype)
        return new_global
