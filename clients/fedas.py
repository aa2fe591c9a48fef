"""FedAS client (Yang et al., "FedAS: Bridging Inconsistency in Personalized Federated
Learning", CVPR 2024): parameter alignment and client synchronisation.

Each client keeps its own whole model. When it trains:

1. *Parameter alignment.* It computes its class prototypes, the mean feature of each of
   its classes under its own base, and trains a copy of the global base so that the
   global base maps its samples onto those prototypes (MSE per class present in the batch,
   ``fedas-align-epochs`` epochs at ``fedas-align-lr``). The aligned global base replaces
   its base; its head stays its own.
2. It trains base and head as FedAvg does, and keeps the result as its model.
3. *Synchronisation.* It reports the trace of the Fisher information of its trained
   model on its train split (the summed squared gradients of the batch-mean negative
   log-likelihood, ``fim-trace``); the server averages the clients' models weighted by
   these traces, so that clients whose parameters carry more information count more.

Personal model: the client's own model (a client that has not trained yet: the run's
initial model, as the reference's clients start). Global figure: the server's average,
the base of which the clients receive.

Where ours differs from the code the authors contributed to PFLlib (``clientas.py``,
``serveras.py``): alignment and the Fisher trace run over the run's batch size and the
whole train split (the reference: batches of 16 for alignment, and the shuffled batches
of its loader with the last partial one dropped for the trace); the clients not sampled
do no work (the reference computes their trace for its log only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 - the usual name

from clients.base import TrainResult
from clients.fedavg import FedAvgClient
from fedreg_app.core.config import AlgorithmOptions, at_least, option, positive
from fedreg_app.core.data import TensorData
from fedreg_app.core.models import BASE, HEAD_G, SplitModel
from fedreg_app.core.training import LossFn, batches, eval_batches

#: The train-reply metric that weights a client in FedAS's average.
FIM_TRACE = "fim-trace"
#: The optimizer stream of the alignment (training is stream 0).
ALIGN_STREAM = 1


@dataclass(frozen=True)
class FedASOptions(AlgorithmOptions):
    align_lr: float = option(
        "fedas-align-lr", 0.01, "a number > 0", positive,
        doc="FedAS: learning rate of the parameter alignment of the global base.",
        source="PFLlib `clientas.py` (`set_parameters`: SGD, lr 0.01); the paper gives "
        "no value",
    )  # fmt: skip
    align_epochs: int = option(
        "fedas-align-epochs", 1, "an integer >= 0", at_least(0),
        doc="FedAS: epochs of the parameter alignment (0: the global base as received).",
        source="PFLlib `clientas.py` (one epoch)",
    )  # fmt: skip


@torch.no_grad()
def class_prototypes(base: nn.Module, data: TensorData, device: torch.device) -> torch.Tensor:
    """Mean feature of each class present in ``data`` under ``base``, one row per class
    (NaN rows for classes the client does not have)."""
    base.eval()
    sums: torch.Tensor | None = None
    counts = torch.zeros(int(data.y.max()) + 1 if len(data) else 0, device=device)
    for x, y in eval_batches(data, device):
        features = base(x).flatten(1)
        if sums is None:
            sums = torch.zeros(len(counts), features.shape[1], device=device)
        sums.index_add_(0, y, features)
        counts += torch.bincount(y, minlength=len(counts)).to(counts.dtype)
    if sums is None:
        return torch.empty(0, 0, device=device)
    return sums / counts.unsqueeze(1).where(counts.unsqueeze(1) > 0, torch.nan)


def alignment_loss(base: nn.Module, prototypes: torch.Tensor) -> LossFn:
    """The sum over the batch's classes of the MSE between their features under ``base``
    and the class's prototype."""

    def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        features = base(x).flatten(1)
        return sum(
            F.mse_loss(features[y == c], prototypes[c].expand_as(features[y == c]))
            for c in torch.unique(y).tolist()
        )

    return loss


def fisher_trace(model: nn.Module, data: TensorData, batch_size: int, device) -> float:
    """Σ over batches of ‖∇θ mean NLL‖²: the empirical Fisher information's trace as the
    reference estimates it, over every parameter of ``model``."""
    model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    total = 0.0
    for x, y in batches(data, batch_size, None, device):
        grads = torch.autograd.grad(F.cross_entropy(model(x), y), params)
        total += sum(float((g.double() ** 2).sum()) for g in grads)
    return total


class FedASClient(FedAvgClient):
    #: The client's own model, base and head; the server's base is aligned into it.
    shared_groups = (BASE,)
    private_groups = (BASE, HEAD_G)

    def __init__(self, setup) -> None:
        super().__init__(setup)
        self.options = self.config.options_as(FedASOptions)

    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        self.restore_private()  # its own model (the initial one before it first trains)
        prototypes = class_prototypes(self.model.base, self.data.train, self.device)
        aligned, processed = self.aligned_base(global_arrays, prototypes, server_round)
        self.model.load_group_state(aligned, BASE)
        trainable = self.model.parameters_of(BASE, HEAD_G)
        processed += self.fit(
            trainable, self.cross_entropy(self.model), self.data.train,
            self.config.local_epochs, server_round,
        )  # fmt: skip
        self.save_private()
        trace = fisher_trace(self.model, self.data.train, self.config.batch_size, self.device)
        metrics = self.train_metrics(processed, **{FIM_TRACE: trace})
        return TrainResult(self.model.group_state(BASE, HEAD_G), metrics)

    def aligned_base(
        self, global_arrays: dict[str, np.ndarray], prototypes: torch.Tensor, server_round: int
    ) -> tuple[dict[str, np.ndarray], int]:
        """The global base trained to map this client's samples onto its prototypes."""
        received: SplitModel = self.new_model()
        received.load_group_state(global_arrays, BASE)
        processed = self.fit(
            received.parameters_of(BASE),
            alignment_loss(received.base, prototypes),
            self.data.train,
            self.options.align_epochs,
            server_round,
            stream=ALIGN_STREAM,
            model=received,
        )
        for param in received.parameters():  # the base the client trains is counted once
            self.trained_numel.pop(id(param), None)
        return received.group_state(BASE), processed

    def stream_lr(self, stream: int) -> float:
        return self.options.align_lr if stream == ALIGN_STREAM else self.config.lr
