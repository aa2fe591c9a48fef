"""FedBABU client (Oh et al. 2022): the head stays at its shared random initialisation
during federated training; only the base is trained (E epochs) and aggregated.

Personal model (``finetune-when``):

- ``"final"`` (default), when PFLlib fine-tunes (``servers/serverbabu.py``: ``client.fine_tune()``
  for every client once the rounds are over, then one evaluation): before the last round
  (``server_round == num-server-rounds``) a client's personal model is the global base
  with the shared initial head, the global model itself (P = G in every earlier round,
  as the FedReG paper's Table 2 has it for FMNIST, G = P = 80.49%); at the final round's
  evaluation each client fine-tunes the head ``finetune-epochs`` (10) epochs on its
  train split and tests that, the run's final personal accuracy. It starts from the
  final aggregated base; PFLlib, which sends no model after the last aggregation,
  fine-tunes each client's model as it stands: a client trained in the last round its
  own locally trained base, the others the previous round's global base.
- ``"every-eval"``: that fine-tuning before every evaluation (the behaviour before
  0.2.0), so every round reports a fine-tuned personal accuracy.

Fine-tuning touches the head only, as the FedReG paper describes FedBABU (Section 4.2:
"the head part is re-tuned with local data for local testing"); it trains on the frozen
base's features, computed once (``fit_head``). ``finetune-base = true`` fine-tunes base and
head instead, as PFLlib's ``clientBABU.fine_tune`` does by default (``which_module=['base',
'head']``). Nothing of the fine-tuning is kept: it is a copy for that evaluation only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from clients.base import ClientProcedure, TrainResult
from fedreg_app.core.config import AlgorithmOptions, at_least, option
from fedreg_app.core.models import BASE

#: ``finetune-when``: fine-tune at the final round's evaluation only, or at every one.
FINETUNE_WHEN = ("final", "every-eval")


@dataclass(frozen=True)
class FedBABUOptions(AlgorithmOptions):
    #: Before 0.2.0 FedBABU fine-tuned before every evaluation.
    earlier_meaning: ClassVar[Mapping[str, Any]] = {"finetune-when": "every-eval"}

    finetune_epochs: int = option(
        "finetune-epochs", 10, "an integer >= 0", at_least(0),
        doc="Epochs of fine-tuning the head on the client's own data.",
        source="paper §4.2, thesis §5.3",
    )  # fmt: skip
    finetune_base: bool = option(
        "finetune-base", False, "true or false",
        doc="Fine-tune the base and the head, not the head only.",
        source='paper §4.2 ("the head part is re-tuned"); PFLlib\'s `fine_tune` defaults '
        "to base and head (`true`)",
    )  # fmt: skip
    finetune_when: str = option(
        "finetune-when", "final", f"one of {', '.join(FINETUNE_WHEN)}",
        lambda value: value in FINETUNE_WHEN,
        doc="`final`: fine-tune once, after the last round, from the final aggregated "
        "base: the final personal accuracy (before it, P = G: the aggregated base with "
        "the shared initial head). `every-eval`: fine-tune before every evaluation.",
        source="PFLlib `serverbabu.py` (after the last round; the paper's FMNIST cell has "
        "G = P = 80.49). PFLlib sends no model after the last aggregation, so it "
        "fine-tunes a client's own base if it trained in the last round, else the "
        "previous global base",
    )  # fmt: skip


class FedBABUClient(ClientProcedure):
    #: The head is the shared initial one, which the client builds itself.
    shared_groups = (BASE,)
    schedule_over_rounds = True  # the fine-tune of the last round(s)

    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        self.load_global(global_arrays)
        processed = self.fit(
            self.model.parameters_of(BASE),
            self.cross_entropy(self.model),
            self.data.train,
            self.config.local_epochs,
            server_round,
        )
        return TrainResult(self.model.group_state(BASE), self.train_metrics(processed))

    def fine_tunes_at(self, server_round: int) -> bool:
        """Whether this round's evaluation fine-tunes: the final round's only, unless
        ``finetune-when = "every-eval"``."""
        options = self.config.options_as(FedBABUOptions)
        return options.finetune_when == "every-eval" or (
            server_round == self.config.num_server_rounds
        )

    def prepare_personal_model(self, server_round: int) -> None:
        """Fine-tune this evaluation's copy: the head (or, with ``finetune-base``, the
        whole model) for ``finetune-epochs`` epochs on the train split."""
        if self.fine_tunes_at(server_round):
            options = self.config.options_as(FedBABUOptions)
            self.fine_tune(options.finetune_epochs, server_round, options.finetune_base)
