"""Which clients a round trains, and how each message reaches its partition's node.

Sampling is over partition ids with the run's seed: every algorithm run with the same
seed trains the same clients in the same rounds (the generator's state is checkpointed,
so a resumed run samples as the uninterrupted one would).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from logging import WARNING

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import log

from fedreg_app.core.config import RunConfig
from fedreg_app.core.partition_map import PartitionMap
from fedreg_app.core.protocol import CONFIG, METRICS, PARTITION_ID, STATE_HELD, STATE_ROUND
from fedreg_app.core.seeds import rng


def sample_size(num_clients: int, fraction: float) -> int:
    """Clients per round: floor(N * fraction), at least one (0.25 of 20 -> 5)."""
    return max(1, math.floor(num_clients * fraction + 1e-9))


class ClientSampler:
    """A seeded draw without replacement over the partitions that have a node now, with
    Dirichlet(``participation-gamma``) weights when participation is skewed."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.generator = rng(config.seed, "sampling")
        self.participation: np.ndarray | None = None  # per-partition probabilities

    def set_population(self, num_partitions: int) -> None:
        gamma = self.config.participation_gamma
        if gamma > 0:  # skewed participation (003, Section 4.4): fixed for the whole run
            draw = rng(self.config.seed, "participation")
            self.participation = draw.dirichlet(np.full(num_partitions, gamma))

    def sample(self, partitions: PartitionMap, held_out: frozenset[int] = frozenset()) -> list[int]:
        """``fraction-train`` of the partitions that train (all but ``held_out``), drawn
        among those that have a node now."""
        available = [p for p in partitions.available() if p not in held_out]
        if not available:
            return []
        wanted = sample_size(partitions.num_partitions - len(held_out), self.config.fraction_train)
        weights = None
        if self.participation is not None:
            weights = self.participation[available] + 1e-12  # every client keeps a chance
            weights = weights / weights.sum()
        chosen = self.generator.choice(available, size=min(wanted, len(available)),
                                       replace=False, p=weights)  # fmt: skip
        return sorted(int(p) for p in chosen)


def addressed_messages(
    partitions: PartitionMap, chosen: Iterable[int], record: RecordDict, message_type: str,
    state_rounds: Mapping[int, int],
) -> list[Message]:  # fmt: skip
    """One message per chosen partition that has a node, carrying ``state-held`` where
    the partition has said which private-state version it holds (the arrays are shared,
    not copied)."""
    messages = []
    for pid in chosen:
        node = partitions.node_of(pid)
        if node is None:
            log(WARNING, "partition %d has no connected node; skipped this round", pid)
            continue
        content = record
        held = state_rounds.get(pid)
        if held is not None:
            content = RecordDict(dict(record.items()))
            content[CONFIG] = ConfigRecord({**record[CONFIG], STATE_HELD: held})
        messages.append(Message(content=content, message_type=message_type, dst_node_id=node))
    return messages


def held_state_versions(replies: Iterable[Message], server_round: int) -> dict[int, int]:
    """The newest private-state version each accepted reply says its partition holds: the
    next message to it carries it (``state-held``), so a client whose state-dir was wiped
    or replaced since can tell, and counts the loss. A round beyond this one cannot be
    held yet: such a value is not kept."""
    held_by: dict[int, int] = {}
    for msg in replies:
        metrics = msg.content[METRICS]
        held = metrics.get(STATE_ROUND)
        if held is None:
            continue
        if held > server_round:
            log(WARNING, "partition %s says it holds its state of round %s in round %d; "
                "not kept", metrics[PARTITION_ID], held, server_round)  # fmt: skip
            continue
        held_by[int(metrics[PARTITION_ID])] = int(held)
    return held_by
