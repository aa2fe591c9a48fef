"""FedDBE client (Zhang et al., NeurIPS 2023): FedAvg with the Domain Bias Eliminator.

The eliminator has two parts, both on the base's feature z = base(x):

- PRBM, a personalized representation bias: a vector b_k of the feature's size, the
  client's own (zeros at first, kept in the client's state, never sent). The head reads
  z + b_k, so the client's domain bias collects in b_k instead of in the shared base and
  head. b_k is trained in the same steps as base and head, by the same optimizer (the
  run's ``lr`` and ``momentum``): the authors' code steps it with a separate plain SGD at
  the same lr, which is the same update where ``momentum = 0``.
- MR, mean regularisation: a running mean m_k of the batches' feature means,
  m_k <- (1 - mu) m_k + mu * mean(z over the batch) with mu = ``feddbe-momentum``, reset to
  zero at the start of each local training; the loss adds
  kappa * mean_j(0.5 (m_k - g)_j^2) (kappa = ``feddbe-kappa``), pulling the
  client's mean feature toward the global mean g. Only the current batch's mean carries a
  gradient (the earlier part of m_k is a constant), as in the authors' code.

Global mean. g is fixed once, from the clients' running means after a training without
DBE. A round the server has sent no g in is that training: plain cross-entropy on
head(base(x)), b_k untouched, and the reply carries m_k as ``extra.mr.mean`` beside base
and head (the server fixes g as their |D_k|-weighted mean, see ``strategies/feddbe.py``).
From then on every message carries g as ``extra.mr.mean`` and replies hold base and head.

Personal model: head(base(x) + b_k). Global model: head(base(x)), without any client's
bias (the server has none to add).

Keys: ``feddbe-kappa`` (kappa, 50) and ``feddbe-momentum`` (1.0): see their sources.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 - the usual name

from clients.base import ClientProcedure, ClientSetup, TrainResult
from fedreg_app.core.config import AlgorithmOptions, at_least, option
from fedreg_app.core.models import BASE, EXTRA, HEAD_G, SplitModel, checked_value, group_of
from fedreg_app.core.records import from_record, to_record
from fedreg_app.core.training import LossFn

MR = "mr"  # extra.mr.mean: a client's running mean in a reply, the global mean in a message
PRBM = "prbm"  # extra.prbm.bias: the client's bias; only clients' models have it
MEAN_KEY = f"{EXTRA}.{MR}.mean"
BIAS_KEY = f"{EXTRA}.{PRBM}.bias"
#: The client-state record that holds the bias b_k.
BIAS_RECORD = "feddbe-bias"


@dataclass(frozen=True)
class FedDBEOptions(AlgorithmOptions):
    """The authors' setting for Fashion-MNIST under Dirichlet 0.1, this app's default."""

    kappa: float = option(
        "feddbe-kappa", 50.0, "a number >= 0", at_least(0),
        doc="FedDBE: κ, the weight of the mean regularisation κ · mean(½ (m_k − g)²) between the "
        "client's running feature mean and the global one (0: no MR, the bias alone).",
        source="the authors' `system/run_me.sh` (TsingZ0/DBE: FMNIST, Dirichlet 0.1, "
        "`-m cnn`, i.e. PFLlib's FedAvgCNN, our `fedavgcnn`; `-klw 50`); the argparse "
        "default of their `main.py` and PFLlib's is `kl_weight = 0.0`, which leaves MR out",
    )  # fmt: skip
    momentum: float = option(
        "feddbe-momentum", 1.0, "a number in (0, 1]", lambda v: 0 < v <= 1,
        doc="FedDBE: the weight of each batch's feature mean in the running mean m_k (1: m_k is "
        "the current batch's mean).",
        source="the authors' `system/run_me.sh` (TsingZ0/DBE, `-mo 1`, with κ = 50); the "
        "argparse default of their `main.py` and PFLlib's is `momentum = 0.1`",
    )  # fmt: skip


# --------------------------------------------------------------- the modules
class FeatureMean(nn.Module):
    """Carries a feature mean as a buffer (computed, never trained): the client's running
    mean in its reply, the global mean in the server's model and messages."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))


class RepresentationBias(nn.Module):
    """PRBM: the client's trainable bias, added to the base's feature."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(dim))


def attach_mean(model: SplitModel) -> None:
    """Add ``extra.mr`` (zeros) unless already there: the server's and the clients'
    models carry the same entry, so a reply's running mean is checked like any array."""
    if MR not in model.extra:
        model.extra[MR] = FeatureMean(model.feature_dim).to(next(model.base.parameters()).device)


def mean_regulariser(running: torch.Tensor, global_mean: torch.Tensor) -> torch.Tensor:
    """MR before its weight: mean over the feature's entries of ½ (m_k − g)²."""
    return (0.5 * (running - global_mean) ** 2).mean()


# ------------------------------------------------------------------ the client
class FedDBEClient(ClientProcedure):
    """Shares base and head (FedAvg); keeps b_k. Its personal model is head(base(x) + b_k);
    the global model it evaluates for the server is head(base(x)), with no bias: b_k is
    the client's own domain, which the global figure must leave out."""

    state_records = (BIAS_RECORD,)

    def __init__(self, setup: ClientSetup) -> None:
        super().__init__(setup)
        attach_mean(self.model)
        dim = self.model.feature_dim
        self.model.extra[PRBM] = RepresentationBias(dim).to(self.device)
        options = self.config.options_as(FedDBEOptions)
        self.kappa, self.momentum = options.kappa, options.momentum
        #: g from the server's message; None until the server has fixed it.
        self.global_mean: torch.Tensor | None = None
        #: m_k of the current local training.
        self.running_mean = torch.zeros(dim, device=self.device)

    @property
    def bias(self) -> nn.Parameter:
        return self.model.extra[PRBM].bias

    # ---------------------------------------------------------- what travels
    def load_global(self, arrays: dict[str, np.ndarray]) -> None:
        """Base and head from the server, and g where the message carries it (nothing
        else of ``extra``: the bias never comes from the server)."""
        self.model.load_group_state(arrays, BASE, HEAD_G)
        extra = sorted(key for key in arrays if group_of(key) == EXTRA)
        if extra not in ([], [MEAN_KEY]):
            raise KeyError(f"the server sent {extra}: expected at most {[MEAN_KEY]}")
        self.global_mean = None
        if extra:
            into = self.model.extra[MR].mean
            self.global_mean = checked_value(MEAN_KEY, arrays[MEAN_KEY], into).to(self.device)

    def restore_private(self) -> None:
        """The bias from the client's state (zeros on its first round)."""
        super().restore_private()
        stored = self.setup.state.get(BIAS_RECORD)
        if stored is None:
            return
        value = from_record(stored).get(BIAS_KEY)
        if value is None:
            raise KeyError(f"client state {BIAS_RECORD!r} lacks {BIAS_KEY!r}")
        where = f"client state {BIAS_RECORD!r}: {BIAS_KEY}"
        with torch.no_grad():
            self.bias.copy_(checked_value(where, value, self.bias.detach()))

    def save_private(self) -> None:
        super().save_private()
        bias = self.bias.detach().cpu().numpy().copy()
        self.setup.state[BIAS_RECORD] = to_record({BIAS_KEY: bias})

    # ----------------------------------------------------------------- the round
    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        """One local training; without g, the training that g is made from."""
        self.load_global(global_arrays)
        self.restore_private()
        self.running_mean.zero_()
        shared, global_mean = self.model.parameters_of(BASE, HEAD_G), self.global_mean
        processed = self.fit(
            shared if global_mean is None else [*shared, self.bias],
            self.plain_loss() if global_mean is None else self.dbe_loss(global_mean),
            self.data.train,
            self.config.local_epochs,
            server_round,
        )
        self.save_private()
        arrays = self.model.group_state(BASE, HEAD_G)
        if global_mean is None:
            arrays[MEAN_KEY] = self.running_mean.cpu().numpy().copy()
        return TrainResult(arrays, self.train_metrics(processed))

    def track_mean(self, features: torch.Tensor) -> torch.Tensor:
        """m_k after this batch, with the batch mean's gradient; the stored m_k is
        updated in place (a captured CUDA graph replays the same copy)."""
        current = (1 - self.momentum) * self.running_mean + self.momentum * features.mean(dim=0)
        self.running_mean.copy_(current.detach())
        return current

    def plain_loss(self) -> LossFn:
        """Cross-entropy of head(base(x)), tracking m_k: the training before g exists."""

        def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            features = self.model.base(x)
            self.track_mean(features)
            return F.cross_entropy(self.model.head_g(features), y)

        return loss

    def dbe_loss(self, global_mean: torch.Tensor) -> LossFn:
        """Cross-entropy of head(base(x) + b_k) + kappa * MR(m_k, g)."""

        def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            features = self.model.base(x)
            running = self.track_mean(features)
            ce = F.cross_entropy(self.personal_head(features), y)
            return ce + self.kappa * mean_regulariser(running, global_mean)

        return loss

    def personal_head(self, features: torch.Tensor) -> torch.Tensor:
        """The personal prediction from base features: head(z + b_k)."""
        return self.model.head_g(features + self.bias)
