"""FedDyn client (Acar et al. 2021): local loss CE - <grad_k, w> + alpha/2 ||w - w_g||^2.

``grad_k`` (the client's linear correction, zero at first) lives in the client's state and
after training becomes grad_k - alpha (w_k - w_g). alpha = ``dyn-alpha`` (0.01).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from clients.base import ClientProcedure, snapshot, squared_distance
from clients.fedavg import FedAvgClient
from fedreg_app.core.config import AlgorithmOptions, option, positive
from fedreg_app.core.models import BASE, HEAD_G, check_keys, checked_value
from fedreg_app.core.records import from_record, to_record
from fedreg_app.core.training import LossFn

CORRECTION = "feddyn-correction"


@dataclass(frozen=True)
class FedDynOptions(AlgorithmOptions):
    #: The server divides by alpha (w_g = mean - h / alpha): it must be positive.
    alpha: float = option(
        "dyn-alpha", 0.01, "a number > 0", positive,
        doc="α of the regulariser α/2‖w − w_g‖², squared as in the FedDyn paper.",
        source="paper §4.2, thesis §5.3. PFLlib's `clientdyn.py` adds α/2‖w − w_g‖ "
        "unsquared (a gradient of constant length α/2): the thesis's FedDyn figures may "
        "come from that form",
    )  # fmt: skip


class DynamicRegulariser:
    """FedDyn's client side on the shared parameters (base and head_g) of one round:
    the linear term <grad_k, w>, the distance ||w - w_g||^2 to the weights received, and
    the correction's update after training, kept in the client's state. FedReG's
    ``fedreg-dyn-alpha`` uses it too."""

    def __init__(self, client: ClientProcedure, alpha: float) -> None:
        self.client, self.alpha = client, alpha
        self.names = client.model.parameter_names_of(BASE, HEAD_G)
        self.shared = client.model.parameters_of(BASE, HEAD_G)
        self.anchors = snapshot(self.shared)
        self.correction = self.load_correction()

    def linear(self) -> torch.Tensor:
        return sum((g * p).sum() for g, p in zip(self.correction, self.shared, strict=True))

    def distance(self) -> torch.Tensor:
        return squared_distance(self.shared, self.anchors)

    def load_correction(self) -> list[torch.Tensor]:
        state = self.client.setup.state
        if CORRECTION not in state:
            return [torch.zeros_like(p) for p in self.shared]
        stored = from_record(state[CORRECTION])
        check_keys(f"client state {CORRECTION!r}", self.names, stored)  # read from the disk
        return [
            checked_value(f"client state {CORRECTION!r}: {name}", stored[name], p).to(
                self.client.device
            )
            for name, p in zip(self.names, self.shared, strict=True)
        ]

    def save_correction(self) -> None:
        """grad_k <- grad_k - alpha (w_k - w_g), into the client's state."""
        updated = {
            name: (g - self.alpha * (p.detach() - w_g)).cpu().numpy()
            for name, g, p, w_g in zip(
                self.names, self.correction, self.shared, self.anchors, strict=True
            )
        }
        self.client.setup.state[CORRECTION] = to_record(updated)


class FedDynClient(FedAvgClient):
    state_records = (CORRECTION,)

    def local_loss(self, trainable: Sequence[nn.Parameter]) -> LossFn:
        alpha = self.config.options_as(FedDynOptions).alpha
        self._regulariser = regulariser = DynamicRegulariser(self, alpha)
        ce = self.cross_entropy(self.model)

        def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            # the linear term's graph first, as FedDyn's recorded runs built it: the order
            # in which the backward pass sums a parameter's gradients follows it, and a
            # sum in another order differs in its last bits
            linear = regulariser.linear()
            return ce(x, y) - linear + alpha / 2 * regulariser.distance()

        return loss

    def after_local_training(self, trainable: Sequence[nn.Parameter]) -> None:
        self._regulariser.save_correction()
