"""FedProx client: CE + mu/2 * ||w - w_g||^2 (mu = ``prox-mu``, 0.001 as in the paper)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from clients.base import snapshot, squared_distance
from clients.fedavg import FedAvgClient
from fedreg_app.core.config import AlgorithmOptions, at_least, option
from fedreg_app.core.training import LossFn


@dataclass(frozen=True)
class FedProxOptions(AlgorithmOptions):
    mu: float = option(
        "prox-mu", 0.001, "a number >= 0 (weight of the proximal term)", at_least(0),
        doc="μ: the weight of the proximal term.",
        source="paper §4.2, thesis §5.3 (FedProx's code, as FedRoD)",
    )  # fmt: skip


class FedProxClient(FedAvgClient):
    def local_loss(self, trainable: Sequence[nn.Parameter]) -> LossFn:
        mu = self.config.options_as(FedProxOptions).mu
        global_weights = snapshot(trainable)
        ce = self.cross_entropy(self.model)
        return lambda x, y: ce(x, y) + mu / 2 * squared_distance(trainable, global_weights)
