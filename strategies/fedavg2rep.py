"""FedAvg2Rep server: FedAvg throughout on the server side. The whole model is sent every
round; during the warm-up clients train and return all of it, afterwards (FedRep) the
averaged head serves the evaluation-only global model and the starting head of a client's
first FedRep round."""

from __future__ import annotations

from strategies.fedavg import FedAvgStrategy


class FedAvg2RepStrategy(FedAvgStrategy):
    pass
