"""FedPer server: only the base is sent to clients for training.

Clients upload base and head; both are averaged by |D_k|, but the averaged head exists
only to form the evaluation-only global model of the FedReG paper (Section 4.1): it is
never sent back, so it cannot influence any client's training.
"""

from __future__ import annotations

from fedreg_app.core.models import BASE
from strategies.base import PersonalizedStrategy


class FedPerStrategy(PersonalizedStrategy):
    sent_groups = (BASE,)
