"""FedBABU server: only the base is aggregated and sent; the head stays at its
initialisation, which every client already holds (seeded, or the ``init-model`` file),
so it never travels: a round costs the base only, as in ``004_…``'s cost comparison."""

from __future__ import annotations

from fedreg_app.core.models import BASE
from fedreg_app.core.protocol import NUM_EXAMPLES
from strategies.base import PersonalizedStrategy


class FedBABUStrategy(PersonalizedStrategy):
    group_weights = {BASE: NUM_EXAMPLES}
    sent_groups = (BASE,)
