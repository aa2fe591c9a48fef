"""FedCP server: base, global head and policy network averaged by |D_k| and sent back.

Clients upload their base, their CPN (``extra.cpn.*``) and, as ``head_g``, the mean of
their personal head and the global head they received; each group is averaged with
weights |D_k| and the whole model goes to the next round's clients. Personal heads
(``head_p``) never reach the server: a reply carrying one is refused.

The global model, for the global figure only, is the default head_g(base(x)): the shared
feature extractor and global head on the whole feature, with no policy (a policy needs a
client's condition, which stays on the client; see ``clients/fedcp.py``).
"""

from __future__ import annotations

from clients.fedcp import attach_fedcp_modules
from fedreg_app.core.config import RunConfig
from fedreg_app.core.models import BASE, EXTRA, HEAD_G, SplitModel
from fedreg_app.core.protocol import NUM_EXAMPLES
from strategies.fedavg import FedAvgStrategy


class FedCPStrategy(FedAvgStrategy):
    group_weights = {BASE: NUM_EXAMPLES, HEAD_G: NUM_EXAMPLES, EXTRA: NUM_EXAMPLES}
    sent_groups = (BASE, HEAD_G, EXTRA)

    @classmethod
    def add_modules(cls, config: RunConfig, model: SplitModel) -> None:
        attach_fedcp_modules(model, config.seed)
