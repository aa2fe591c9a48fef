"""FedALA server: FedAvg's; the adaptive local aggregation happens on each client."""

from __future__ import annotations

from strategies.fedavg import FedAvgStrategy


class FedALAStrategy(FedAvgStrategy):
    """Same aggregation as FedAvg: the whole model, weighted by |D_k|."""
