"""FedCP server: base, global head and policy network averaged by |D_k| and sent back.

Clients upload their base, their CPN (``extra.cpn.*``) and, as ``head_g``, the mean of
their personal head and the global head they received; each group is averaged with
weights |D_k| and the whole model goes to the next round's clients. Personal heads
(``head_p``) never reach the server: a reply carrying one is refused.

The global model, for the global figure only, is head_g(base(x)): the shared feature
extractor and global head on the whole feature, with no policy (a policy needs a
client's condition, which stays on the client; see ``clients/fedcp.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from clients.fedcp import attach_fedcp_modules
from fedreg_app.core.config import RunConfig
from fedreg_app.core.models import BASE, EXTRA, HEAD_G, SplitModel
from fedreg_app.core.protocol import NUM_EXAMPLES
from strategies.base import ModelParts
from strategies.fedavg import FedAvgStrategy


class FedCPStrategy(FedAvgStrategy):
    group_weights = {BASE: NUM_EXAMPLES, HEAD_G: NUM_EXAMPLES, EXTRA: NUM_EXAMPLES}
    sent_groups = (BASE, HEAD_G, EXTRA)

    @classmethod
    def add_modules(cls, config: RunConfig, model: SplitModel) -> None:
        attach_fedcp_modules(model, config.seed)

    @classmethod
    def global_parts(
        cls, config: RunConfig, model: SplitModel, arrays: Mapping[str, np.ndarray]
    ) -> ModelParts:
        """base, and the global head on its whole feature, with the aggregated arrays."""
        cls.add_modules(config, model)  # idempotent: the ServerApp has usually done it
        model.load_group_state(dict(arrays), BASE, HEAD_G, EXTRA)
        model.eval()
        return model.base, model.head_g
