"""FedAS server: the clients' models averaged with weights proportional to the traces of
their Fisher information (``fim-trace``), the base sent back (the heads stay private; their
average serves the global figure only, as in FedPer).

The traces are what each client reports of itself: the server takes them only when
finite and positive. Under a robust ``aggregation`` rule the clients' sample counts weight
them instead (a trace is a number a lying client chooses), and central DP is refused (its
fixed denominators need weights known before the first round).
"""

from __future__ import annotations

import math

import numpy as np
from flwr.app import Message

from clients.fedas import FIM_TRACE
from fedreg_app.core.models import BASE, HEAD_G
from fedreg_app.core.protocol import METRICS
from strategies.base import Update, weighted_average_by_group
from strategies.fedper import FedPerStrategy


def trace_problem(trace: object) -> str:
    """Why a reported Fisher trace cannot weight a client ("" if it can)."""
    if isinstance(trace, bool) or not isinstance(trace, int | float):
        return f"metric {FIM_TRACE}={trace!r} is missing or not a number"
    if not math.isfinite(trace) or trace <= 0:
        return f"metric {FIM_TRACE}={trace!r} is not a finite number > 0"
    return ""


class FedASStrategy(FedPerStrategy):
    def train_reply_problem(self, msg: Message, partition_id: int, server_round: int) -> str:
        """The checks of every reply, and a usable weight (before they, which record an
        accepted reply's counts)."""
        metrics = msg.content[METRICS] if METRICS in msg.content.metric_records else {}
        problem = trace_problem(metrics.get(FIM_TRACE))
        return problem or super().train_reply_problem(msg, partition_id, server_round)

    def aggregate_updates(self, server_round: int, updates: list[Update]) -> dict[str, np.ndarray]:
        if self.config.aggregation != "mean":
            return self.average_updates(server_round, updates)
        return weighted_average_by_group(updates, {BASE: FIM_TRACE, HEAD_G: FIM_TRACE})
