"""FedAvg2Rep server (``003_…``, Algorithm 3): FedAvg on the server side throughout. The
whole global model is sent every round (line 6 during the warm-up, line 15 after it:
``FedRepClientUpdate(w^(t-1), ...)``), the clients return the whole model and the server
averages all of it (lines 9 and 18), weighted by |D_k| (003's eq. 1). After the warm-up the
averaged head is therefore the head every sampled client starts its next round from, and
the global model's head."""

from __future__ import annotations

from strategies.fedavg import FedAvgStrategy


class FedAvg2RepStrategy(FedAvgStrategy):
    """Same as FedAvg: whole model sent, returned and averaged, every round."""
