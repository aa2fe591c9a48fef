"""Client-level differential privacy as a wrapper around any strategy, the way Flower's
``DifferentialPrivacyServerSideFixedClipping`` wraps one: the wrapped strategy knows
nothing of DP; the wrapper changes what it aggregates and what it sends.

- ``dp-mode = "central"``: the wrapped strategy's weighted average is replaced by the
  fixed-denominator noisy average of the clipped updates, group by group with the
  algorithm's own weights (FedReG's base by |D_k| and head_g by e_k), from every
  partition's weights declared before the first round (``fedreg_app/core/privacy.py``).
  A strategy whose server does more than average may take part only when it can work
  from that aggregate alone (``works_from_average``: FedDyn, FedReG).
- ``dp-mode = "local"``: the clients add the noise; the wrapper sends each one the
  reference its whole update is clipped around and counts its releases.

The privacy ledger (each round's sample, each partition's releases) is checkpointed with
the wrapped strategy's state, and gives ε at ``dp-delta``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid

from fedreg_app.core.config import ConfigError, RunConfig
from fedreg_app.core.privacy import (
    central_release,
    local_epsilon,
    noise_generator,
    noise_std,
    population_denominators,
    sum_epsilon,
)
from fedreg_app.core.protocol import ARRAYS, DP_REFERENCE, METRICS
from fedreg_app.core.records import to_record
from strategies.base import PersonalizedStrategy, Update


def check_privacy_allowed(config: RunConfig, strategy: type[PersonalizedStrategy]) -> None:
    """DP needs updates to privatise, and central DP a server that averages them (or
    works from the average alone). Checked before any work."""
    mode, algo = config.dp_mode, config.algo
    if mode == "off":
        return
    if not strategy.group_weights:
        raise ConfigError(
            f"dp-mode={mode!r} is not allowed with algo={algo!r}: no client update "
            "reaches the server; expected 'off'"
        )
    overridden = strategy.aggregate_updates is not PersonalizedStrategy.aggregate_updates
    if mode == "central" and overridden and not strategy.works_from_average:
        raise ConfigError(
            f"dp-mode='central' is not allowed with algo={algo!r}: its server does more "
            "than average the updates; expected 'off' or 'local'"
        )


class DifferentialPrivacy:
    """``inner`` with client-level DP; everything else is ``inner``'s (attributes and
    methods not defined here are read from it, and set on it)."""

    _OWN = frozenset({"inner", "mode", "population_weights", "releases", "local_releases"})

    def __init__(
        self,
        inner: PersonalizedStrategy,
        population_weights: Mapping[int, Mapping[str, float]] | None = None,
    ) -> None:
        """``population_weights``: central DP's every partition's aggregation weights, as
        the clients declared them before the first round."""
        config = inner.config
        check_privacy_allowed(config, type(inner))
        self.inner = inner
        self.mode = config.dp_mode
        self.population_weights = {int(p): dict(w) for p, w in (population_weights or {}).items()}
        #: Central: (clients sampled, clients available) of each round that released an
        #: update. Local: each partition's releases.
        self.releases: list[tuple[int, int]] = []
        self.local_releases: dict[int, int] = {}
        if self.mode == "central":
            if not self.population_weights:
                raise RuntimeError("dp-mode='central' needs every partition's declared weights")
            population_denominators(self.population_weights, inner.group_weights, 1)  # fails now
            inner.release = self.central_release

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)

    # ------------------------------------------------------------- central
    def central_release(self, server_round: int, updates: list[Update]) -> dict[str, np.ndarray]:
        """This round's noisy fixed-denominator average of the clipped updates, for the
        groups it aggregates and the clients it sampled: a round that trains every client
        (FedSeq's and deviation tracking's fine-tuning) or adds a group (the head, from
        deviation tracking's fine-tune phase on) is averaged as such."""
        inner, config = self.inner, self.inner.config
        scales, denominators = population_denominators(
            self.population_weights, inner.group_weights, len(inner.last_sampled)
        )
        released = central_release(
            inner._current, updates, inner.group_weights, scales, denominators,
            noise_std(config), config.dp_clip,
            noise_generator(config, "dp-noise", server_round),
        )  # fmt: skip
        sampled_from = max(len(inner.training_partitions()), len(inner.last_sampled))
        self.releases.append((len(inner.last_sampled), sampled_from))
        return released

    def train_reply_problem(self, msg: Message, partition_id: int, server_round: int) -> str:
        """Central DP: a reply must name the weights its partition declared (the fixed
        denominators were built on them); then the wrapped strategy's checks."""
        declared = self.population_weights.get(partition_id)
        if declared is not None and METRICS in msg.content.metric_records:
            metrics = msg.content[METRICS]
            for key in sorted(set(self.inner.group_weights.values())):
                if key in metrics and metrics[key] != declared.get(key):
                    return f"metric {key}={metrics[key]!r}, declared {declared.get(key)!r}"
        return self.inner.train_reply_problem(msg, partition_id, server_round)

    # --------------------------------------------------------------- local
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Local DP: each message carries the reference for the entries of the update the
        server does not send (a client clips its whole update around it), and counts as a
        release of its partition."""
        messages = list(self.inner.configure_train(server_round, arrays, config, grid))
        if self.mode != "local" or not messages:
            return messages
        sent = set(messages[0].content[ARRAYS].keys())
        expected = self.inner.expected_reply_arrays(server_round)
        reference = to_record({k: v for k, v in expected.items() if k not in sent})
        for msg in messages:
            msg.content[DP_REFERENCE] = reference
            pid = self.inner.partitions.partition_of(msg.metadata.dst_node_id)
            self.local_releases[pid] = self.local_releases.get(pid, 0) + 1
        return messages

    # -------------------------------------------------------------- ledger
    def privacy_epsilon(self) -> float:
        """ε spent so far at ``dp-delta``."""
        config = self.inner.config
        if self.mode == "central":
            return sum_epsilon(self.releases, config)
        most = max(self.local_releases.values(), default=0)
        return local_epsilon(config.dp_noise_multiplier, most, config.dp_delta)

    def state_dict(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, state = self.inner.state_dict()
        state["dp_releases"] = [list(r) for r in self.releases]
        state["dp_local_releases"] = {str(p): n for p, n in self.local_releases.items()}
        return arrays, state

    def load_state_dict(self, arrays: dict[str, np.ndarray], state: dict[str, Any]) -> None:
        self.inner.load_state_dict(arrays, state)
        self.releases = [(int(k), int(n)) for k, n in state.get("dp_releases", [])]
        local = state.get("dp_local_releases", {})
        self.local_releases = {int(p): int(n) for p, n in local.items()}
