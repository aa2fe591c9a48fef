"""FedAvg-FT server: FedAvg's; the fine-tuning happens on each client at evaluation."""

from __future__ import annotations

from strategies.fedavg import FedAvgStrategy


class FedAvgFTStrategy(FedAvgStrategy):
    """Same aggregation as FedAvg."""
