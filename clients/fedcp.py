"""FedCP client (Zhang et al., KDD 2023): a conditional policy splits each feature in two.

Model. z = base(x), of dimension D. The client's condition c is the column sum of its
personal head's weight product (W_L ... W_1 over the head's Linear layers), scaled to unit
length: it says which feature dimensions the personal head weighs. The Conditional Policy
Network (CPN, ``extra.cpn.*``), Linear(D, 2D) -> LayerNorm -> ReLU, reads z * c and gives
two logits per feature dimension; a softmax over each pair, after Gumbel noise in
training (drawn from the run's seed per client and round), gives the policies
p (personal) and g = 1 - p, each in [0, 1]. The feature is
split as z = z*p + z*g, and

    logits = head_p(z * p) + head_g(z * g).

Loss per batch, with z' = the features of the base as received this round (frozen):

    CE(logits, y) + lambda * MMD(z, z')

MMD is the biased estimate with a sum of four RBF kernels, exp(-d^2 / (2 s)) for
s in 10, 15, 20, 50, as the reference code computes it. The base, ``head_p`` and the CPN
train with one optimizer; ``head_g`` is frozen: it carries the other clients' knowledge.

Shared and kept. The server sends base, ``head_g`` and CPN; the client uploads its base,
its CPN and, in the ``head_g`` slot, the mean of its trained ``head_p`` and the
``head_g`` it received (the reference's upload rule: a frozen ``head_g`` would otherwise
never move). ``head_p`` stays in the client's state; it never leaves the client as it
is, though a server that knows the ``head_g`` it sent can recover it from the mean.

Personal model: the two-head output above, with the client's own condition and the
deterministic policy (the softmax of the CPN's logits, no noise), so that evaluation
counts do not depend on a draw or on the evaluation batch size.

Global model (for the global figure only): the server's base and ``head_g`` on the whole
feature, head_g(base(x)). A policy needs a client's condition, which never leaves the
client, so the server has none to split by; and since p + g = 1, two equal one-layer
heads W would give W z + 2b, the global head's prediction up to its bias.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 - the usual name

from clients.base import ClientProcedure, ClientSetup, TrainResult
from fedreg_app.core.config import AlgorithmOptions, ConfigError, RunConfig, at_least, option
from fedreg_app.core.models import BASE, EXTRA, HEAD_G, HEAD_P, SplitModel
from fedreg_app.core.seeds import seed_int, torch_generator

CPN = "cpn"  # keys extra.cpn.*
#: Gumbel-softmax temperature; the reference fixes it at 1 with soft (not hard) samples.
TAU = 1.0
#: The RBF kernels' s in exp(-d^2 / (2 s)), the reference's "bandwidth_range".
MMD_BANDWIDTHS = (10.0, 15.0, 20.0, 50.0)
#: Weight of the client's own head in the head it uploads as ``head_g``.
HEAD_MIX = 0.5


@dataclass(frozen=True)
class FedCPOptions(AlgorithmOptions):
    """FedCP's one coefficient, the weight of its feature alignment."""

    lam: float = option(
        "fedcp-lambda", 5.0, "a number >= 0", at_least(0),
        doc="λ: the weight of the MMD between the client base's features and those of the "
        "base it received (FedCP's feature alignment). 0 drops the term.",
        source="the authors' code (TsingZ0/FedCP `system/run_me.sh`: `-lam 5`, MNIST CNN). "
        "PFLlib's `main.py` leaves `--lamda` at 1.0, a default shared with other "
        "algorithms, not a FedCP setting",
    )  # fmt: skip

    def check(self, config: RunConfig) -> None:
        """A replayed CUDA graph would repeat the first step's Gumbel noise forever."""
        if config.cuda_graphs:
            raise ConfigError(
                "cuda-graphs=True is not allowed with algo='fedcp': expected false (its "
                "Gumbel noise is drawn for every step, which a replayed graph would repeat)"
            )


# --------------------------------------------------------------- the modules
class ConditionalPolicyNetwork(nn.Module):
    """CPN: from the conditioned feature z * c, a (personal, global) policy per dimension."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.layers = nn.Sequential(nn.Linear(dim, 2 * dim), nn.LayerNorm(2 * dim), nn.ReLU())

    def forward(
        self, features: torch.Tensor, condition: torch.Tensor, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(p, g), each of the features' shape, p + g = 1. ``noise``: Gumbel noise of shape
        (batch, 2, dim) in training; None for the deterministic policy."""
        logits = self.layers(features * condition).view(-1, 2, self.dim)
        if noise is not None:
            logits = logits + noise
        policy = torch.softmax(logits / TAU, dim=1)
        return policy[:, 0], policy[:, 1]


def attach_fedcp_modules(model: SplitModel, seed: int) -> None:
    """Add the CPN under ``model.extra`` unless already there. Seeded, so that every
    process (clients and server) builds the same initial CPN."""
    if CPN in model.extra:
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_int(seed, "fedcp-init"))
        model.extra[CPN] = ConditionalPolicyNetwork(model.feature_dim)
    model.extra.to(next(model.base.parameters()).device)


def policy_network(model: SplitModel) -> ConditionalPolicyNetwork:
    return model.extra[CPN]


# ------------------------------------------------------ condition and losses
def head_condition(head: nn.Module) -> torch.Tensor:
    """c: the column sum of W_L ... W_1 over the head's Linear layers, of unit length
    (no gradient: the condition is fixed for a round)."""
    weights = [m.weight.detach() for m in head.modules() if isinstance(m, nn.Linear)]
    product = weights[-1]
    for weight in reversed(weights[:-1]):
        product = product @ weight
    return F.normalize(product.sum(dim=0), dim=0)


def gumbel_noise(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """-log(E), E ~ Exp(1), drawn on the CPU from ``generator`` (any device gives the
    same numbers); E is kept above 0 so that no draw is infinite."""
    draws = torch.empty(shape).exponential_(generator=generator)
    return -draws.clamp_min(torch.finfo(draws.dtype).tiny).log()


def split_features(
    features: torch.Tensor, policies: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(z * p, z * g): the personal and the global part; they sum to z."""
    personal, generic = policies
    return features * personal, features * generic


def two_head_logits(
    model: SplitModel,
    features: torch.Tensor,
    condition: torch.Tensor,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """head_p(z * p) + head_g(z * g), with the CPN's policies for this condition."""
    policies = policy_network(model)(features, condition, noise)
    personal, generic = split_features(features, policies)
    return model.head_p(personal) + model.head_g(generic)


def squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """||a_i - b_j||^2 for every pair of rows."""
    return (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * a @ b.T


def rbf_kernel(distances: torch.Tensor) -> torch.Tensor:
    return sum(torch.exp(-distances / (2 * s)) for s in MMD_BANDWIDTHS)


def mmd(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The biased estimate of the squared MMD between the rows of x and of y: exactly 0
    where x equals y, positive where the two samples differ."""
    xx = rbf_kernel(squared_distances(x, x))
    yy = rbf_kernel(squared_distances(y, y))
    xy = rbf_kernel(squared_distances(x, y))
    return (xx + yy - 2 * xy).mean()


def frozen_copy(module: nn.Module) -> nn.Module:
    """A copy that neither trains nor carries gradients: the round's received base."""
    return copy.deepcopy(module).requires_grad_(False).eval()


@torch.no_grad()
def mix_into_global_head(model: SplitModel) -> None:
    """``head_g`` <- mean of ``head_p`` and ``head_g``: the head uploaded as global."""
    for generic, personal in zip(model.head_g.parameters(), model.head_p.parameters(), strict=True):
        generic.copy_(HEAD_MIX * personal + (1 - HEAD_MIX) * generic)


# ------------------------------------------------------------------ the client
class FedCPClient(ClientProcedure):
    shared_groups = (BASE, HEAD_G, EXTRA)
    private_head = True
    private_groups = (HEAD_P,)

    def __init__(self, setup: ClientSetup) -> None:
        super().__init__(setup)
        attach_fedcp_modules(self.model, self.config.seed)
        self.lam = self.config.options_as(FedCPOptions).lam
        self.condition = head_condition(self.model.head_p)

    def restore_private(self) -> None:
        """Restore ``head_p`` and fix the round's condition from it."""
        super().restore_private()
        self.condition = head_condition(self.model.head_p)

    # ----------------------------------------------------------------- the round
    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        self.load_global(global_arrays)
        self.restore_private()
        received = frozen_copy(self.model.base)
        noise = torch_generator(
            self.config.seed, "fedcp-gumbel", self.data.partition_id, server_round
        )
        processed = self.fit(
            self.model.parameters_of(BASE, HEAD_P, EXTRA),
            lambda x, y: self.loss(x, y, received, noise),
            self.data.train,
            self.config.local_epochs,
            server_round,
        )
        self.save_private()
        mix_into_global_head(self.model)
        return TrainResult(
            self.model.group_state(BASE, HEAD_G, EXTRA), self.train_metrics(processed)
        )

    def loss(
        self, x: torch.Tensor, y: torch.Tensor, received: nn.Module, noise: torch.Generator
    ) -> torch.Tensor:
        return torch.stack(list(self.loss_terms(x, y, received, noise).values())).sum()

    def loss_terms(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        received: nn.Module,
        noise: torch.Generator | None = None,
    ) -> dict[str, torch.Tensor]:
        """FedCP's loss terms, each already multiplied by its coefficient. ``noise``
        draws the Gumbel noise (None: the deterministic policy)."""
        features = self.model.base(x)
        gumbel = None
        if noise is not None:
            gumbel = gumbel_noise((len(x), 2, features.shape[1]), noise).to(features.device)
        logits = two_head_logits(self.model, features, self.condition, gumbel)
        return {"ce": F.cross_entropy(logits, y), "mmd": self.alignment(x, features, received)}

    def alignment(
        self, x: torch.Tensor, features: torch.Tensor, received: nn.Module
    ) -> torch.Tensor:
        """lambda * MMD(z, z'); with lambda = 0 the received base need not run."""
        if self.lam == 0:
            return features.new_zeros(())
        with torch.no_grad():
            target = received(x)
        return self.lam * mmd(features, target)

    def personal_head(self, features: torch.Tensor) -> torch.Tensor:
        """Personal prediction: both heads on their parts of the feature, no noise."""
        return two_head_logits(self.model, features, self.condition)
