"""FedRoD client (Chen & Chao 2022): base + generic head (aggregated) + personal head.

Per batch, with rep = base(x): the generic loss is the balanced-softmax CE,
CE(head_g(rep) + log n_c, y) with the client's class counts n_c, training base and
head_g; the personal loss CE(head_g(rep).detach() + head_p(rep.detach()), y) trains
head_p only. The two losses touch disjoint parameters, so one SGD step on their sum is
exactly the two optimisers of the reference implementation. Classes the client lacks get
a finite, very negative prior (probability 0 without inf arithmetic).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F  # noqa: N812

from clients.base import ClientProcedure, TrainResult
from fedreg_app.core.models import BASE, HEAD_G, HEAD_P

ABSENT_CLASS_LOG_PRIOR = -1e4


def log_class_prior(counts: torch.Tensor) -> torch.Tensor:
    """log n_c, with a large negative finite value for classes the client does not have."""
    counts = counts.float()
    return torch.where(
        counts > 0, counts.clamp(min=1).log(), torch.full_like(counts, ABSENT_CLASS_LOG_PRIOR)
    )


def balanced_softmax_loss(
    logits: torch.Tensor, y: torch.Tensor, log_prior: torch.Tensor
) -> torch.Tensor:
    return F.cross_entropy(logits + log_prior, y)


class FedRoDClient(ClientProcedure):
    private_head = True
    private_groups = (HEAD_P,)

    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        self.load_global(global_arrays)
        self.restore_private()
        model = self.model
        log_prior = log_class_prior(self.data.train.class_counts(self.setup.info.num_classes)).to(
            self.device
        )

        def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            rep = model.base(x)
            generic_logits = model.head_g(rep)
            generic = balanced_softmax_loss(generic_logits, y, log_prior)
            personal = F.cross_entropy(generic_logits.detach() + model.head_p(rep.detach()), y)
            return generic + personal

        processed = self.fit(
            model.parameters_of(BASE, HEAD_G, HEAD_P),
            loss,
            self.data.train,
            self.config.local_epochs,
            server_round,
        )
        self.save_private()
        return TrainResult(model.group_state(BASE, HEAD_G), self.train_metrics(processed))
