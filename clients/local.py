"""Local training (``algo = "local"``): each client trains only on its own data and
never communicates a parameter; the reference point below which federation does not pay.

Each client's whole model (base and head) is private: it starts from the run's seeded
initial model (identical on every client) and, whenever the client is sampled, trains E
epochs on its train split, as PFLlib's ``serverlocal`` runs it (the same client sampling
as the federated algorithms, no aggregation). The personal model is that model; there is
no global model, so a local run reports no global accuracy.
"""

from __future__ import annotations

import numpy as np

from clients.base import TrainResult
from clients.fedavg import FedAvgClient
from fedreg_app.core.models import BASE, HEAD_G


class LocalClient(FedAvgClient):
    shared_groups = ()
    private_groups = (BASE, HEAD_G)

    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        """Train the client's own model; the reply carries metrics and no arrays."""
        result = super().train(global_arrays, server_round)
        return TrainResult({}, result.metrics)
