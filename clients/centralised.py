"""Centralised training's client (``algo = "centralised"``): it never trains (the
ServerApp trains one model on the union of the train splits, see
``strategies/centralised.py``); it evaluates that model on its own test split, where the
personal model is the global one."""

from __future__ import annotations

import numpy as np

from clients.base import ClientProcedure, TrainResult
from fedreg_app.core.config import RunConfig


class CentralisedClient(ClientProcedure):
    @classmethod
    def keeps_state(cls, config: RunConfig) -> bool:
        """Nothing is kept on a client: the optimizer is the ServerApp's."""
        return False

    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        raise RuntimeError("algo='centralised' trains in the ServerApp; no client trains")
