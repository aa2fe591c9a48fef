"""Ditto client (Li et al. 2021): a FedAvg round for the global model, plus a personal
model v_k trained ``personal-epochs`` (5) epochs with CE + lambda/2 ||v_k - w_g||^2
(lambda = ``ditto-lambda``), before the global copy, anchored at the global model the
client just received (PFLlib's order: ``ptrain`` then ``train``). v_k lives in the
client's state and is the personal model at evaluation.

Before a client's first training it has no v_k of its own (``ditto-personal-init``):

- ``"initial"`` (default), as PFLlib (``clients/clientditto.py``: ``self.model_per =
  copy.deepcopy(self.model)`` at construction, i.e. the initial model, which ``ptrain``
  trains in place and no server message ever overwrites): v_k starts as the run's
  initial model (seeded, or ``init-model``: identical on every client). A never-sampled
  client is evaluated with that untrained model, and a client's first personal training
  starts from it (pulled toward the current global model).
- ``"global"``: v_k starts as a copy of the current global model, for both (the
  behaviour before 0.2.0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from torch import nn

from clients.base import PersonalEpochs, TrainResult, snapshot, squared_distance
from clients.fedavg import FedAvgClient
from fedreg_app.core.config import at_least, option
from fedreg_app.core.models import BASE, HEAD_G, SplitModel
from fedreg_app.core.protocol import NUM_PROCESSED
from fedreg_app.core.records import from_record, to_record
from fedreg_app.core.training import Forward

PERSONAL_MODEL = "ditto-personal"
#: ``ditto-personal-init``: what v_k is before the client's first personal training.
PERSONAL_INITS = ("initial", "global")


@dataclass(frozen=True)
class DittoOptions(PersonalEpochs):
    #: Before 0.2.0 Ditto's personal model started from the global one.
    earlier_meaning: ClassVar[Mapping[str, Any]] = {"ditto-personal-init": "global"}

    lam: float = option(
        "ditto-lambda", 0.1, "a number >= 0 (pull toward the global model)", at_least(0),
        doc="λ: the pull of the personal model toward the global one.",
        source="our choice: neither paper nor thesis gives λ. PFLlib takes it from the "
        "`-mu` flag it shares with FedProx (default 0.0: no pull), so the thesis's runs "
        "had 0.0 or FedProx's 0.001, which cannot be told",
    )  # fmt: skip
    personal_init: str = option(
        "ditto-personal-init", "initial", f"one of {', '.join(PERSONAL_INITS)}",
        lambda value: value in PERSONAL_INITS,
        doc="A client's personal model before its first training: `initial`, the seeded "
        "initial model (a never-sampled client is evaluated with it); `global`, the "
        "current global model.",
        source="PFLlib `clientditto.py` (`model_per` copied from the initial model at "
        "construction, never overwritten by the server's)",
    )  # fmt: skip


class DittoClient(FedAvgClient):
    state_records = (PERSONAL_MODEL,)

    def __init__(self, setup) -> None:
        super().__init__(setup)
        self.options = self.config.options_as(DittoOptions)
        #: v_k: the initial model until ``restore_personal`` loads the client's own.
        self.personal: SplitModel = self.new_model()

    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        self.load_global(global_arrays)
        self.restore_personal(global_arrays)
        lam = self.options.lam
        global_weights = snapshot(self.model.parameters_of(BASE, HEAD_G))
        personal_params = self.personal.parameters_of(BASE, HEAD_G)
        ce = self.cross_entropy(self.personal)
        processed = self.fit(
            personal_params,
            lambda x, y: ce(x, y) + lam / 2 * squared_distance(personal_params, global_weights),
            self.data.train,
            self.options.personal_epochs,
            server_round,
            stream=1,
            model=self.personal,
        )
        self.setup.state[PERSONAL_MODEL] = to_record(self.personal.group_state(BASE, HEAD_G))
        result = super().train(global_arrays, server_round)
        result.metrics[NUM_PROCESSED] = int(result.metrics[NUM_PROCESSED]) + processed
        return result

    def restore_personal(self, global_arrays: dict[str, np.ndarray]) -> None:
        """v_k: the client's own from its state; without one, the initial model it was
        built with (``ditto-personal-init = "initial"``) or ``global_arrays``."""
        stored = self.setup.state.get(PERSONAL_MODEL)
        if stored is not None:
            self.personal.load_group_state(from_record(stored), BASE, HEAD_G)
        elif self.options.personal_init == "global":
            self.personal.load_group_state(global_arrays, BASE, HEAD_G)

    def prepare_personal_model(self, server_round: int) -> None:
        self.restore_personal(self.model.group_state(BASE, HEAD_G))
        self.personal.eval()

    def personal_parts(self) -> tuple[nn.Module, Forward]:
        return self.personal.base, self.personal.head_g
