"""FedDyn server (Acar et al. 2021), with N clients in all and S sampled this round:

h   <- h - alpha * (1/N) * sum_{k in S} (w_k - w_g)
w_g <- (1/|S|) * sum_{k in S} w_k - h / alpha

h starts at zero and is the strategy's state. alpha = ``dyn-alpha`` (0.01).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from clients.feddyn import FedDynOptions
from fedreg_app.config import RunConfig
from strategies.base import PersonalizedStrategy, Update


class FedDynStrategy(PersonalizedStrategy):
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
        new_global = {}
        for key in updates[0][0]:
            w_g = self._current[key].astype(np.float64)
            client_weights = [np.asarray(arrays[key], dtype=np.float64) for arrays, _ in updates]
            drift = sum(w_k - w_g for w_k in client_weights)
            h = self.h.get(key, np.zeros_like(w_g)) - self.alpha * drift / self.num_partitions
            self.h[key] = h
            mean = sum(client_weights) / len(client_weights)
            new_global[key] = (mean - h / self.alpha).astype(self._current[key].dtype)
        return new_global
