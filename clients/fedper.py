"""FedPer client: base and head trained together for E epochs; only the base comes from
the server, the head is the client's own (kept in its state).

The head is uploaded with the base only so the server can form the paper's
evaluation-only global model (FedReG paper, Section 4.1); it is never sent back.
"""

from __future__ import annotations

from clients.fedavg import FedAvgClient
from fedreg_app.core.models import BASE, HEAD_G


class FedPerClient(FedAvgClient):
    shared_groups = (BASE,)
    private_groups = (HEAD_G,)
