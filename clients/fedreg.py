"""FedReG client (paper Algorithm 1; thesis Algorithm 2 and Section 4.3).

Round: (1) E epochs on the original data with loss CE(head_g(z) + head_p(z), y), z =
base(x); gradients flow through both heads into the base, but only base and head_p move
(head_g stays as received — the paper's and the thesis's prose; the thesis pseudo-code
also lists head_g, which we do not follow). (2) E epochs on the rebalanced data with
CE(head_g(base(x)), y), updating base and head_g; head_p untouched. Sent: base and head_g
with |D_k| and the effective sample count e_k. head_p stays in the client's state.

Ablations of the paper's Section 4.7 / Table 5, one switch each (defaults = FedReG):
(a) ``fedreg-head-weight = "original"``: head_g averaged by |D_k| like the base;
(b) ``fedreg-private-head = false``: no head_p; one head trained on the original data,
    then on the rebalanced data; the personal model is the global one;
(c) ``fedreg-rebalance = false``: step (2) runs on the original data;
(d) ``fedreg-original-step = false``: only step (2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clients.base import ClientProcedure, ClientSetup, TrainResult
from clients.rebalance import (
    RebalancedData,
    cached_rebalanced,
    class_threshold,
    effective_samples,
)
from fedreg_app.config import AlgorithmOptions, option
from fedreg_app.data import TensorData
from fedreg_app.models import BASE, HEAD_G, HEAD_P
from fedreg_app.protocol import EFFECTIVE_EXAMPLES
from fedreg_app.seeds import seed_int

HEAD_WEIGHTS = ("effective", "original")


@dataclass(frozen=True)
class FedReGOptions(AlgorithmOptions):
    """The switches of the paper's Section 4.7 ablations; the defaults are FedReG."""

    head_weight: str = option(
        "fedreg-head-weight",
        "effective",
        f"one of {', '.join(HEAD_WEIGHTS)}",
        lambda v: v in HEAD_WEIGHTS,
    )
    private_head: bool = option("fedreg-private-head", True, "true or false")
    rebalance: bool = option("fedreg-rebalance", True, "true or false")
    original_step: bool = option("fedreg-original-step", True, "true or false")


class FedReGClient(ClientProcedure):
    private_head = True
    private_groups = (HEAD_P,)

    def __init__(self, setup: ClientSetup) -> None:
        self.options = setup.config.options_as(FedReGOptions)
        if not self.options.private_head:  # ablation (b)
            self.private_head, self.private_groups = False, ()
        super().__init__(setup)

    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        self.load_global(global_arrays)
        self.restore_private()
        model, epochs = self.model, self.config.local_epochs
        processed = 0
        if self.options.original_step:
            processed += self.fit(
                *self.original_step(), self.data.train, epochs, server_round, stream=1
            )
        processed += self.fit(
            model.parameters_of(BASE, HEAD_G),
            self.cross_entropy(model),
            self.second_step_data(),
            epochs,
            server_round,
            stream=2,
        )
        self.save_private()
        metrics = self.train_metrics(processed, **{EFFECTIVE_EXAMPLES: self.effective_samples()})
        return TrainResult(model.group_state(BASE, HEAD_G), metrics)

    def original_step(self):
        """Trainable parameters and loss of step (1)."""
        model = self.model
        if not self.options.private_head:  # ablation (b): the one head learns both data
            return model.parameters_of(BASE, HEAD_G), self.cross_entropy(model)

        # CE of the personal prediction head_g(z) + head_p(z), z = base(x)
        return model.parameters_of(BASE, HEAD_P), self.cross_entropy(self.personal_predict)

    def second_step_data(self) -> TensorData:
        return self.rebalanced().data if self.options.rebalance else self.data.train

    def rebalanced(self) -> RebalancedData:
        cfg = self.config
        seed = seed_int(cfg.seed, "rebalance", self.data.partition_id)
        name = f"rebalanced-{self.data.partition_id}-{cfg.threshold}-{cfg.augment}-{seed}.npz"
        return cached_rebalanced(
            self.data.train,
            self.setup.info.num_classes,
            cfg.threshold,
            cfg.augment,
            seed,
            disk=self.setup.cache / name if self.setup.cache else None,
        )

    def effective_samples(self) -> int:
        """e_k = sum_c min(n_c, t); defined by t even when no rebalanced set is built."""
        counts = self.data.train.class_counts(self.setup.info.num_classes)
        return effective_samples(counts, class_threshold(counts, self.config.threshold))
