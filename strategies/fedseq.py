"""FedSeq server (``004_…``): in the layer-by-layer phase only the unfrozen base layers
are sent and averaged (|D_k|); in the last ``fedseq-finetune-rounds`` rounds the whole
model goes to every client, which fine-tunes its own copy locally (from the second
fine-tune round on, its own fine-tuned model: what the server sends then is not used).
The clients' fine-tuned models are averaged only for the evaluation-only global figure.
Evaluation gets the whole model."""

from __future__ import annotations

import numpy as np

from clients.fedseq import base_layers, is_finetuning, of_layers, unfreeze_rounds, unfrozen_at
from fedreg_app.models import SplitModel
from strategies.base import PersonalizedStrategy


class FedSeqStrategy(PersonalizedStrategy):
    anti = False

    def __init__(self, config) -> None:
        super().__init__(config)
        self._model: SplitModel | None = None

    def prepare_model(self, model: SplitModel) -> None:
        self._model = model
        unfreeze_rounds(self.config, len(base_layers(model)))  # a bad schedule fails now

    def sample_partitions(self) -> list[int]:
        """Fine-tuning rounds train every client (``004_…``)."""
        if self.training_round and is_finetuning(self.config, self.training_round):
            return sorted(self.partition_nodes)
        return super().sample_partitions()

    def arrays_to_send(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        round_ = self.training_round
        if round_ is None or self._model is None or is_finetuning(self.config, round_):
            return arrays
        return of_layers(arrays, unfrozen_at(self._model, self.config, self.anti, round_))


class FedSeqAntiStrategy(FedSeqStrategy):
    anti = True
