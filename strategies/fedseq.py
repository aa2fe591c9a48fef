"""FedSeq server (``004_…``): in the layer-by-layer phase only the unfrozen base layers
are sent and averaged (|D_k|); in the last ``fedseq-finetune-rounds`` rounds the whole
model goes to every client, which fine-tunes its own copy locally (from the second
fine-tune round on, its own fine-tuned model: what the server sends then is not used).
The clients' fine-tuned models are averaged only for the evaluation-only global figure.
Evaluation gets the whole model."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from clients.fedseq import base_layers, is_finetuning, of_layers, unfreeze_rounds, unfrozen_at
from fedreg_app.core.config import RunConfig
from fedreg_app.core.models import SplitModel
from strategies.base import PersonalizedStrategy
from strategies.replies import RunFacts


class FedSeqStrategy(PersonalizedStrategy):
    anti = False

    def __init__(self, config: RunConfig, facts: RunFacts | None = None) -> None:
        super().__init__(config, facts)
        self._model: SplitModel | None = None

    def prepare_model(self, model: SplitModel) -> None:
        self._model = model
        unfreeze_rounds(self.config, len(base_layers(model)))  # a bad schedule fails now

    def sample_partitions(self, server_round: int) -> list[int]:
        """Fine-tuning rounds train every client (``004_…``)."""
        if is_finetuning(self.config, server_round):
            return self.partitions.available()
        return super().sample_partitions(server_round)

    def arrays_to_send(
        self, arrays: dict[str, np.ndarray], server_round: int | None
    ) -> dict[str, np.ndarray]:
        return self.layer_phase_arrays(arrays, server_round)

    def expected_reply_arrays(
        self, server_round: int, current: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Clients return the layers they trained: the unfrozen ones, or base + head."""
        every = super().expected_reply_arrays(server_round, current)
        return self.layer_phase_arrays(every, server_round)

    def layer_phase_arrays(
        self, arrays: dict[str, np.ndarray], server_round: int | None
    ) -> dict[str, np.ndarray]:
        """In a layer-by-layer round only the unfrozen base layers; else everything."""
        if server_round is None or self._model is None or is_finetuning(self.config, server_round):
            return arrays
        return of_layers(arrays, unfrozen_at(self._model, self.config, self.anti, server_round))


class FedSeqAntiStrategy(FedSeqStrategy):
    anti = True
