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


class FedSeqStrategy(PersonalizedStrategy):
    anti = False

    def prepare_model(self, model: SplitModel) -> None:
        super().prepare_model(model)
        unfreeze_rounds(self.config, len(base_layers(model)))  # a bad schedule fails now

    def sample_partitions(self, server_round: int) -> list[int]:
        """Fine-tuning rounds train every client (``004_…``)."""
        if is_finetuning(self.config, server_round):
            return self.partitions.available()
        return super().sample_partitions(server_round)

    def arrays_to_send(
        self, arrays: dict[str, np.ndarray], server_round: int | None
    ) -> dict[str, np.ndarray]:
        return self.layer_phase_arrays(self.config, self.model, arrays, server_round)

    @classmethod
    def reply_entries(
        cls, config: RunConfig, model: SplitModel | None,
        entries: Mapping[str, np.ndarray], server_round: int,
    ) -> dict[str, np.ndarray]:  # fmt: skip
        """Clients return the layers they trained: the unfrozen ones, or base + head."""
        every = super().reply_entries(config, model, entries, server_round)
        return cls.layer_phase_arrays(config, model, every, server_round)

    @classmethod
    def layer_phase_arrays(
        cls, config: RunConfig, model: SplitModel | None,
        arrays: Mapping[str, np.ndarray], server_round: int | None,
    ) -> dict[str, np.ndarray]:  # fmt: skip
        """In a layer-by-layer round only the unfrozen base layers; else everything."""
        if server_round is None or model is None or is_finetuning(config, server_round):
            return dict(arrays)
        return of_layers(dict(arrays), unfrozen_at(model, config, cls.anti, server_round))


class FedSeqAntiStrategy(FedSeqStrategy):
    anti = True
