"""GPFL server: base, GCE and CoV averaged with weights |D_k| and sent to clients.

For the FedReG paper's evaluation-only global model (Section 4.1) the clients' heads and
personal conditions are averaged too, but, as in FedPer, never sent back: the global
model is head(CoV(base(x), p_mean)) with p_mean the |D_k|-weighted mean of the clients'
personal conditions (see ``clients/gpfl.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from clients.gpfl import attach_gpfl_modules, condition_input, conditioned_head
from fedreg_app.core.config import RunConfig
from fedreg_app.core.models import BASE, EXTRA, HEAD_G, SplitModel
from fedreg_app.core.protocol import NUM_EXAMPLES
from strategies.base import ModelParts
from strategies.fedper import FedPerStrategy


class GPFLStrategy(FedPerStrategy):
    group_weights = {BASE: NUM_EXAMPLES, HEAD_G: NUM_EXAMPLES, EXTRA: NUM_EXAMPLES}
    sent_groups = (BASE, EXTRA)

    @classmethod
    def add_modules(cls, config: RunConfig, model: SplitModel) -> None:
        attach_gpfl_modules(model, config.seed)

    @classmethod
    def global_parts(
        cls, config: RunConfig, model: SplitModel, arrays: Mapping[str, np.ndarray]
    ) -> ModelParts:
        """base, and z -> head(CoV(z, p_mean)), with the server's aggregated arrays."""
        cls.add_modules(config, model)  # idempotent: the ServerApp has usually done it
        model.load_group_state(dict(arrays), BASE, HEAD_G, EXTRA)
        model.eval()
        return model.base, conditioned_head(model, condition_input(model).personal)
