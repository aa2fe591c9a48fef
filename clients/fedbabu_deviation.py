"""FedBABU with deviation tracking (``002_…``): FedBABU's base-only training until the
server finds the fine-tune round R from the spread of the clients' test accuracies, then
``deviation-finetune-rounds`` (F) rounds in which every client trains base + head and the
server averages both (FedAvg). The server says which phase a round is in
(``FINETUNE_PHASE`` in the message config). The clients evaluate the global model (base
with the shared initial head, later the fine-tuned model) without local fine-tuning: those
per-client accuracies are what the server tracks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clients.base import TrainResult
from clients.fedbabu import FedBABUClient
from fedreg_app.core.config import (
    AlgorithmOptions,
    ConfigError,
    RunConfig,
    at_least,
    option,
    positive,
)
from fedreg_app.core.models import BASE, HEAD_G, group_of

FINETUNE_PHASE = "deviation-finetune"


@dataclass(frozen=True)
class DeviationOptions(AlgorithmOptions):
    """w, epsilon and F of ``002_…`` eq. 7-9."""

    window: int = option(
        "deviation-window", 5, "an integer >= 1 (w)", at_least(1),
        doc="w: the rounds over which σ_w, the standard deviation of all clients' "
        "accuracies, is taken.",
        source="`002` eq. 7-8 (the value is ours)",
    )  # fmt: skip
    epsilon: float = option(
        "deviation-epsilon", 0.001, "a number > 0", positive,
        doc="ε: the fine-tune round R is the first at which σ_w falls and "
        "its second difference is below ε in size.",
        source="`002` eq. 9 (the value is ours)",
    )  # fmt: skip
    finetune_rounds: int = option(
        "deviation-finetune-rounds", 5, "an integer >= 1 (F)", at_least(1),
        doc="F: rounds after R in which every client trains base and head, averaged; the "
        "run ends after them. If no R is found, R = `num-server-rounds` − F.",
        source="`002` Algorithm 1 (the value is ours)",
    )  # fmt: skip

    def check(self, config: RunConfig) -> None:
        if config.eval_every != 1:
            raise ConfigError(
                f"eval-every={config.eval_every} is not allowed with algo='fedbabu-deviation':"
                " expected 1 (the fine-tune round is found from every round's accuracies)"
            )
        if self.finetune_rounds >= config.num_server_rounds:
            raise ConfigError(
                f"deviation-finetune-rounds={self.finetune_rounds} is not allowed: expected "
                f"1..{config.num_server_rounds - 1} (fewer than num-server-rounds)"
            )


class FedBABUDeviationClient(FedBABUClient):
    def load_global(self, arrays: dict[str, np.ndarray]) -> None:
        """The base always; the head once the server sends it (from the fine-tune phase
        on; before, it is the initial head the client holds already)."""
        sent = {group_of(key) for key in arrays}
        if BASE not in sent:
            raise KeyError(f"the server sent no {BASE} (groups sent: {sorted(sent)})")
        self.model.load_group_state(arrays, *(g for g in (BASE, HEAD_G) if g in sent))

    @staticmethod
    def check_training_arrays(arrays: dict[str, np.ndarray], finetuning: bool) -> None:
        """In training the phase says what the server sends: the base, and the head
        exactly in the fine-tune phase (a message without the base, or without the head
        there, would train from the seeded initial weights)."""
        groups = (BASE, HEAD_G) if finetuning else (BASE,)
        sent = {group_of(key) for key in arrays}
        if sent != set(groups):
            raise KeyError(f"{FINETUNE_PHASE}={finetuning}: expected the groups "
                           f"{list(groups)} from the server, got {sorted(sent)}")  # fmt: skip

    def finetuning(self) -> bool:
        """The server's word on the phase: a bool (what the strategy sends), else a
        ValueError naming the key: a truthy string such as "false" must not switch the
        client to training its head."""
        value = self.server_config.get(FINETUNE_PHASE, False)
        if not isinstance(value, bool):
            raise ValueError(
                f"{FINETUNE_PHASE}={value!r} from the server is not allowed: expected true/false"
            )
        return value

    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        finetuning = self.finetuning()
        self.check_training_arrays(global_arrays, finetuning)
        if not finetuning:
            return super().train(global_arrays, server_round)
        self.load_global(global_arrays)
        processed = self.fit(
            self.model.parameters_of(BASE, HEAD_G),
            self.cross_entropy(self.model),
            self.data.train,
            self.config.local_epochs,
            server_round,
        )
        return TrainResult(self.model.group_state(BASE, HEAD_G), self.train_metrics(processed))

    def prepare_personal_model(self, server_round: int) -> None:
        """No local fine-tuning: the tracked accuracy is the global model's on this client."""
