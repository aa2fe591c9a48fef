"""FedDBE server: FedAvg on base and head, and the global mean g fixed once.

g is the |D_k|-weighted mean of the clients' running feature means m_k after a training
without DBE. The server's model carries it as ``extra.mr.mean`` (zeros at first), so it
lives in the global model and in every checkpoint of it; the strategy remembers the
round that fixed it (``mean_round``, in its checkpoint state), so that a resumed run
neither fixes it again nor sends the zeros.

- Until g is fixed (round 1, unless that round aggregates nothing): the server sends base
  and head, no ``extra``. The clients train without DBE and reply with base, head and
  their m_k as ``extra.mr.mean``; the |D_k|-weighted average of the replies gives the new
  base, head and, in ``extra.mr.mean``, g. The round counts as an ordinary FedAvg round.
- From the next round on: the server sends base, head and g; the clients train with the
  bias and MR and reply with base and head only; g is never averaged again.

Our adaptation of the one-off global mean. PFLlib's ``serverdbe.py`` (and the authors'
``serverDBE.py``) runs an extra pass before federated training: every client trains once
without DBE, g is the sample-weighted mean of all their m_k, and that pass's training is
thrown away (``send_models`` overwrites every client's model before round 0). This app
has no phase before round 1, so round 1 is that pass: g comes from round 1's sampled
clients only (a ``fraction-train`` share, not every client), and their round-1 training
is kept and aggregated as in any FedAvg round. Replies that fail or are refused do not
count toward g; where round 1 aggregates nothing, the first round that does fixes it.
Under differential privacy or a robust ``aggregation``, g is that round's released or
robust aggregate of the m_k, as for every other averaged entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord

from clients.feddbe import attach_mean
from fedreg_app.core.config import RunConfig
from fedreg_app.core.models import BASE, EXTRA, HEAD_G, SplitModel, group_of
from fedreg_app.core.protocol import NUM_EXAMPLES
from strategies.base import PersonalizedStrategy
from strategies.replies import RunFacts

#: Base and head: averaged every round, as FedAvg.
SHARED = {BASE: NUM_EXAMPLES, HEAD_G: NUM_EXAMPLES}
#: The round whose replies carry m_k when nothing has failed (class-level, see
#: :meth:`FedDBEStrategy.reply_entries`).
MEAN_ROUND = 1


class FedDBEStrategy(PersonalizedStrategy):
    def __init__(self, config: RunConfig, facts: RunFacts | None = None) -> None:
        #: The round whose aggregate fixed g (None: not yet); the groups depend on it.
        self.mean_round: int | None = None
        super().__init__(config, facts)

    @property
    def mean_fixed(self) -> bool:
        return self.mean_round is not None

    @property
    def group_weights(self) -> dict[str, str]:  # type: ignore[override]
        """Base and head by |D_k|; until g is fixed, the clients' m_k too."""
        return dict(SHARED) if self.mean_fixed else {**SHARED, EXTRA: NUM_EXAMPLES}

    @property
    def sent_groups(self) -> tuple[str, ...]:  # type: ignore[override]
        """Base and head; g too once it is fixed (before, the zeros mean nothing)."""
        return (BASE, HEAD_G, EXTRA) if self.mean_fixed else (BASE, HEAD_G)

    # --------------------------------------------------------- the model
    @classmethod
    def add_modules(cls, config: RunConfig, model: SplitModel) -> None:
        attach_mean(model)

    @classmethod
    def reply_entries(
        cls, config: RunConfig, model: SplitModel | None,
        entries: Mapping[str, np.ndarray], server_round: int,
    ) -> dict[str, np.ndarray]:  # fmt: skip
        """Base and head; in round 1 the client's m_k too. Where round 1 aggregated
        nothing, the later round that fixes g also receives m_k, which no class-level
        code can know; the server then names ``extra.mr.mean`` among what it expects
        (:meth:`expected_reply_arrays`), so local DP's reference covers it."""
        groups = (BASE, HEAD_G, EXTRA) if server_round == MEAN_ROUND else (BASE, HEAD_G)
        return {k: v for k, v in entries.items() if group_of(k) in groups}

    def expected_reply_arrays(
        self, server_round: int, current: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Base and head, and ``extra.mr.mean`` until g is fixed."""
        current = self._current if current is None else current
        return {k: v for k, v in current.items() if group_of(k) in self.group_weights}

    # ------------------------------------------------------------ training
    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """FedAvg; the first round that aggregates fixes g (its average of the m_k)."""
        aggregated, metrics = super().aggregate_train(server_round, replies)
        if aggregated is not None and not self.mean_fixed:
            self.mean_round = server_round
        return aggregated, metrics

    def report(self) -> dict[str, Any]:
        return {"global_mean_round": self.mean_round}

    # ---------------------------------------------------------- checkpoint
    def state_dict(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, state = super().state_dict()
        state["global_mean_round"] = self.mean_round
        return arrays, state

    def load_state_dict(self, arrays: dict[str, np.ndarray], state: dict[str, Any]) -> None:
        super().load_state_dict(arrays, state)
        self.mean_round = state["global_mean_round"]
