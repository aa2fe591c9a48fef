"""FedBABU with deviation tracking, server side (``002_…``, eq. 7-9).

After every round the server has each client's test accuracy. sigma_w(t) is the standard
deviation of all clients' accuracies over the last w rounds pooled together (eq. 8). The
fine-tune round R is the first round where sigma_w is falling (first difference < 0) and
flat (|second difference| < epsilon); if none is found, R = num-server-rounds - F. Rounds
R+1 .. R+F fine-tune base + head on every client, averaged as FedAvg; then the run ends.
Keys: ``deviation-window`` (w), ``deviation-epsilon``, ``deviation-finetune-rounds`` (F).
R is written into results.json (``run.fine_tune_round``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid

from clients.fedbabu_deviation import FINETUNE_PHASE, DeviationOptions
from fedreg_app.core.config import RunConfig, is_whole
from fedreg_app.core.metrics import ENDED_AFTER_ROUND
from fedreg_app.core.models import BASE, HEAD_G, SplitModel, group_of
from fedreg_app.core.protocol import NUM_EXAMPLES
from strategies.fedbabu import FedBABUStrategy
from strategies.replies import RunFacts


def window_sigma(history: list[list[float]], window: int) -> float | None:
    """sigma_w: std of every client accuracy of the last ``window`` rounds (eq. 7-8)."""
    if len(history) < window:
        return None
    pooled = [a for accuracies in history[-window:] for a in accuracies]
    return float(np.std(pooled)) if pooled else None


def deviation_round(sigmas: list[float], epsilon: float) -> int | None:
    """Index of the first sigma that is falling and flat (eq. 9), or None."""
    for t in range(2, len(sigmas)):
        first = sigmas[t] - sigmas[t - 1]
        second = sigmas[t] - 2 * sigmas[t - 1] + sigmas[t - 2]
        if first < 0 and abs(second) < epsilon:
            return t
    return None


def recorded_end(document: Mapping[str, Any]) -> int | None:
    """The round a deviation-tracking record says its run ended after:
    ``run.ended_after_round`` (its fine-tuning done), or, in records written before that
    key, its fine-tune round R plus its F rounds (None when it says neither)."""
    run, config = document["run"], document["config"]
    ended = run.get(ENDED_AFTER_ROUND)
    if ended is None and is_whole(run.get("fine_tune_round")):
        finetune = config.get("deviation-finetune-rounds")
        ended = run["fine_tune_round"] + finetune if is_whole(finetune) else None
    return ended


class FedBABUDeviationStrategy(FedBABUStrategy):
    def __init__(self, config: RunConfig, facts: RunFacts | None = None) -> None:
        self.fine_tune_round: int | None = None  # R; the groups depend on it from the start
        super().__init__(config, facts)
        options = config.options_as(DeviationOptions)
        self.window, self.epsilon = options.window, options.epsilon
        self.finetune_rounds = options.finetune_rounds
        self.history: list[list[float]] = []  # per round: every client's accuracy
        self.sigma_rounds: list[tuple[int, float]] = []  # (round, sigma_w)

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        super().check_config(config)
        config.options_as(DeviationOptions).check(config)

    def finetuning(self, server_round: int) -> bool:
        return self.fine_tune_round is not None and server_round > self.fine_tune_round

    @property
    def group_weights(self) -> dict[str, str]:  # type: ignore[override]
        if self.fine_tune_round is not None:
            return {BASE: NUM_EXAMPLES, HEAD_G: NUM_EXAMPLES}
        return {BASE: NUM_EXAMPLES}

    @classmethod
    def reply_entries(
        cls, config: RunConfig, model: SplitModel | None,
        entries: Mapping[str, np.ndarray], server_round: int,
    ) -> dict[str, np.ndarray]:  # fmt: skip
        """The base's entries. From the fine-tune phase on replies also carry the head,
        but the phase starts at a round the server decides at run time (R), which no
        class-level code can know; the server sends the head in that phase, so a
        client's local-DP reference, which holds every sent entry, covers it."""
        return {k: v for k, v in entries.items() if group_of(k) == BASE}

    def expected_reply_arrays(
        self, server_round: int, current: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """The groups of the phase: the base, then base and head."""
        current = self._current if current is None else current
        return {k: v for k, v in current.items() if group_of(k) in self.group_weights}

    @property
    def sent_groups(self) -> tuple[str, ...]:  # type: ignore[override]
        """The base, and the head from the fine-tune phase on (it trains from then)."""
        return (BASE, HEAD_G) if self.fine_tune_round is not None else (BASE,)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        config[FINETUNE_PHASE] = self.finetuning(server_round)
        return super().configure_train(server_round, arrays, config, grid)

    def sample_partitions(self, server_round: int) -> list[int]:
        if self.finetuning(server_round):
            return self.training_partitions()  # fine-tuning involves every client
        return super().sample_partitions(server_round)

    def aggregate_evaluate(self, server_round: int, replies) -> MetricRecord | None:
        metrics = super().aggregate_evaluate(server_round, replies)
        if metrics is not None and self.fine_tune_round is None:
            self.record_accuracies(server_round, list(metrics["client-accuracies"]))
        return metrics

    def record_accuracies(self, server_round: int, accuracies: list[float]) -> None:
        """Track sigma_w; fix R once it is found, or at the last round that leaves F."""
        self.history.append(accuracies)
        sigma = window_sigma(self.history, self.window)
        if sigma is not None:
            self.sigma_rounds.append((server_round, sigma))
        found = deviation_round([s for _, s in self.sigma_rounds], self.epsilon)
        if found is not None:
            self.fine_tune_round = self.sigma_rounds[found][0]
        elif server_round >= self.config.num_server_rounds - self.finetune_rounds:
            self.fine_tune_round = server_round

    def finished(self, server_round: int) -> bool:
        return (
            self.fine_tune_round is not None
            and server_round >= self.fine_tune_round + self.finetune_rounds
        )

    def report(self) -> dict[str, Any]:
        return {"fine_tune_round": self.fine_tune_round,
                "sigma_w": [[r, round(s, 6)] for r, s in self.sigma_rounds]}  # fmt: skip

    def state_dict(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, state = super().state_dict()
        state.update(history=self.history, sigma_rounds=self.sigma_rounds,
                     fine_tune_round=self.fine_tune_round)  # fmt: skip
        return arrays, state

    def load_state_dict(self, arrays: dict[str, np.ndarray], state: dict[str, Any]) -> None:
        super().load_state_dict(arrays, state)
        self.history = [list(r) for r in state["history"]]
        self.sigma_rounds = [(int(r), float(s)) for r, s in state["sigma_rounds"]]
        self.fine_tune_round = state["fine_tune_round"]
