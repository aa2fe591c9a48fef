"""LG-FedAvg server: only the head (the upper layers) is sent to clients and averaged by
|D_k|; the averaged base exists only for the evaluation-only global model."""

from __future__ import annotations

from fedreg_app.core.models import HEAD_G
from strategies.fedper import FedPerStrategy


class LGFedAvgStrategy(FedPerStrategy):
    sent_groups = (HEAD_G,)
    #: The global model's base never goes to clients: evaluating it there would send the
    #: whole base to every client each evaluation round; the ServerApp evaluates it.
    global_on_clients = False
