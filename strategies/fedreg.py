"""FedReG server (paper eq. 4-5, thesis eq. 3.5-3.10).

base <- sum_k |D_k| / sum|D| * base_k ;  head_g <- sum_k e_k / sum e * head_g,k
with e_k the effective (non-augmented) samples of client k's rebalanced dataset.
Ablation (a), ``fedreg-head-weight = "original"``, weights head_g by |D_k| too.
"""

from __future__ import annotations

from clients.fedreg import FedReGOptions
from fedreg_app.config import RunConfig
from fedreg_app.models import BASE, HEAD_G
from fedreg_app.protocol import EFFECTIVE_EXAMPLES, NUM_EXAMPLES
from strategies.base import PersonalizedStrategy


class FedReGStrategy(PersonalizedStrategy):
    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        options = config.options_as(FedReGOptions)
        head_weight = EFFECTIVE_EXAMPLES if options.head_weight == "effective" else NUM_EXAMPLES
        self.group_weights = {BASE: NUM_EXAMPLES, HEAD_G: head_weight}
