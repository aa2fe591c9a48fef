"""FedDyn client (Acar et al. 2021): local loss CE - <grad_k, w> + alpha/2 ||w - w_g||^2.

``grad_k`` (the client's linear correction, zero at first) lives in the client's state and
after training becomes grad_k - alpha (w_k - w_g). alpha = ``dyn-alpha`` (0.01).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from clients.base import snapshot, squared_distance
from clients.fedavg import FedAvgClient
from fedreg_app.config import AlgorithmOptions, option
from fedreg_app.models import BASE, HEAD_G, check_keys, checked_value
from fedreg_app.records import from_record, to_record
from fedreg_app.training import LossFn

CORRECTION = "feddyn-correction"


@dataclass(frozen=True)
class FedDynOptions(AlgorithmOptions):
    #: The server divides by alpha (w_g = mean - h / alpha): it must be positive.
    alpha: float = option(
        "dyn-alpha", 0.01, "a number > 0", lambda v: v > 0,
        doc="α of the regulariser α/2‖w − w_g‖², squared as in the FedDyn paper.",
        source="paper §4.2, thesis §5.3. PFLlib's `clientdyn.py` adds α/2‖w − w_g‖ "
        "unsquared (a gradient of constant length α/2): the thesis's FedDyn figures may "
        "come from that form",
    )  # fmt: skip


class FedDynClient(FedAvgClient):
    state_records = (CORRECTION,)

    def local_loss(self, trainable: Sequence[nn.Parameter]) -> LossFn:
        alpha = self.config.options_as(FedDynOptions).alpha
        self._global_weights = snapshot(trainable)
        self._correction = self.load_correction(trainable)
        ce = self.cross_entropy(self.model)
        anchors, correction = self._global_weights, self._correction

        def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            linear = sum((g * p).sum() for g, p in zip(correction, trainable, strict=True))
            return ce(x, y) - linear + alpha / 2 * squared_distance(trainable, anchors)

        return loss

    def load_correction(self, trainable: Sequence[nn.Parameter]) -> list[torch.Tensor]:
        if CORRECTION not in self.setup.state:
            return [torch.zeros_like(p) for p in trainable]
        stored = from_record(self.setup.state[CORRECTION])
        names = self.model.parameter_names_of(BASE, HEAD_G)
        check_keys(f"client state {CORRECTION!r}", names, stored)  # read from the disk
        return [
            checked_value(f"client state {CORRECTION!r}: {name}", stored[name], p).to(self.device)
            for name, p in zip(names, trainable, strict=True)
        ]

    def after_local_training(self, trainable: Sequence[nn.Parameter]) -> None:
        alpha = self.config.options_as(FedDynOptions).alpha
        names = self.model.parameter_names_of(BASE, HEAD_G)
        updated = {
            name: (g - alpha * (p.detach() - w_g)).cpu().numpy()
            for name, g, p, w_g in zip(
                names, self._correction, trainable, self._global_weights, strict=True
            )
        }
        self.setup.state[CORRECTION] = to_record(updated)
