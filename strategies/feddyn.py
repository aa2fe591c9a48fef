"""FedDyn server (Acar et al. 2021), with N clients in all and S sampled this round:

h   <- h - alpha * (1/N) * sum_{k in S} (w_k - w_g)
w_g <- (1/|S|) * sum_{k in S} w_k - h / alpha

h starts at zero and is the strategy's state. alpha = ``dyn-alpha`` (0.01).

Where a wrapper lets the server see only an aggregate (central DP's noisy
fixed-denominator average of the clipped updates, ``strategies/privacy.py``), the mean
update (1/|S|) sum (w_k - w_g) is replaced by that release, and h and w_g are computed
from it (post-processing, so DP's guarantee holds for h too). That release weights
clients by their sample counts, as FedAvg's does, where FedDyn's own mean is uniform over
the sampled clients.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from clients.feddyn import FedDynOptions
from fedreg_app.core.config import RunConfig
from strategies.base import PersonalizedStrategy, Update
from strategies.replies import RunFacts


def dynamic_step(
    current: dict[str, np.ndarray],
    average: dict[str, np.ndarray],
    updates: list[Update],
    h: dict[str, np.ndarray],
    alpha: float,
    num_partitions: int,
    drift_from_average: bool,
) -> dict[str, np.ndarray]:
    """FedDyn's server step from an average of the clients' weights: h is updated in
    place, h <- h - alpha/N * sum_k (w_k - w_g), and average - h / alpha returned. The
    drift is the clients' own, or, with ``drift_from_average`` (central DP, where only
    the private average may be used; a robust aggregation), |S| (average - w_g)."""
    new_global = {}
    for key in updates[0][0]:
        w_g = current[key].astype(np.float64)
        mean = np.asarray(average[key], dtype=np.float64)
        if drift_from_average:
            drift = len(updates) * (mean - w_g)
        else:
            drift = sum(np.asarray(a[key], dtype=np.float64) - w_g for a, _ in updates)
        h[key] = h.get(key, np.zeros_like(w_g)) - alpha * drift / num_partitions
        new_global[key] = (mean - h[key] / alpha).astype(current[key].dtype)
    return new_global


class DynamicState(PersonalizedStrategy):
    """A server that keeps FedDyn's h (one array per aggregated parameter, filled by
    :func:`dynamic_step`) in its checkpoint, so that a resume continues it."""

    def __init__(self, config: RunConfig, facts: RunFacts | None = None) -> None:
        super().__init__(config, facts)
        self.h: dict[str, np.ndarray] = {}

    @property
    def from_aggregate_only(self) -> bool:
        """Whether h must follow the aggregate rather than each client's own drift:
        under central DP only the released aggregate may be used, and under a robust
        ``aggregation`` a lying client's drift must not steer h either."""
        return self.release is not None or self.config.aggregation != "mean"

    def state_dict(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, state = super().state_dict()
        return {**arrays, **self.h}, state

    def load_state_dict(self, arrays: dict[str, np.ndarray], state: dict[str, Any]) -> None:
        super().load_state_dict(arrays, state)
        self.h = dict(arrays)


class FedDynStrategy(DynamicState):
    works_from_average = True

    def __init__(self, config: RunConfig, facts: RunFacts | None = None) -> None:
        super().__init__(config, facts)
        self.alpha = config.options_as(FedDynOptions).alpha

    def aggregate_updates(self, server_round: int, updates: list[Update]) -> dict[str, np.ndarray]:
        if self.from_aggregate_only:  # only the released (or robust) aggregate may be used
            average = self.average_updates(server_round, updates)
        else:  # FedDyn's own mean, uniform over the sampled clients
            average = {
                key: sum(np.asarray(a[key], dtype=np.float64) for a, _ in updates) / len(updates)
                for key in updates[0][0]
            }
        return dynamic_step(
            self._current, average, updates, self.h, self.alpha, self.num_partitions,
            drift_from_average=self.from_aggregate_only,
        )  # fmt: skip
