"""LG-FedAvg client (Liang et al. 2020), the reverse of FedPer: the lower layers (the
representation, ``base``) stay on the client, the upper layers (``head_g``) are shared and
averaged. Base and head train together for E epochs; the client's own base is kept in its
state (first time: the seeded initial base, identical on every client).

The base is uploaded with the head only so the server can form an evaluation-only global
model, as for FedPer (FedReG paper, Section 4.1); it is never sent back.
"""

from __future__ import annotations

from clients.fedavg import FedAvgClient
from fedreg_app.core.models import BASE, HEAD_G


class LGFedAvgClient(FedAvgClient):
    shared_groups = (HEAD_G,)
    private_groups = (BASE,)
