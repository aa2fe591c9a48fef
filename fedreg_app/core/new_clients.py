"""Clients that never train: a seeded share of the partitions held out of every training
round, evaluated as newcomers (the generalisation to new clients that pFL-Bench and
PFLlib report beside the participating clients' accuracy).

A held-out client is never sampled. At each evaluation it gets the current global model
like every client; its global figure is that model on its test split, and its personal
figure is the model it trains from it in one local round of the run's algorithm with
``new-client-epochs`` epochs (its personal head, where the algorithm has one), on a
state of its own that is thrown away afterwards. Both are reported apart from the
participating clients' figures, which they do not enter.
"""

from __future__ import annotations

import math
from typing import Protocol

from fedreg_app.core.keys import core_key, fail

NEW_CLIENT_FRACTION = core_key(
    0.0,
    "a fraction in [0, 1), leaving at least one client to train",
    doc="Share of the partitions held out of training, drawn once from the run's seed; "
    "each evaluation reports them apart, with the global model and after "
    "`new-client-epochs` of local training. 0: every client takes part.",
    source="PFLlib's `-nnc` (`num_new_clients`, default 0) and pFL-Bench's unseen clients",
)
NEW_CLIENT_EPOCHS = core_key(
    1,
    "an integer >= 0",
    doc="Epochs of the held-out clients' one local round before their personal figure "
    "(0: the personal model an untrained client of the algorithm has).",
    source="our choice: one epoch, a short adaptation (PFLlib's `-ften`, default 0, "
    "fine-tunes the whole global model that many epochs)",
)


class NewClientSettings(Protocol):
    """What :func:`check_new_clients` and :func:`held_out` read of a run config."""

    seed: int
    new_client_fraction: float
    new_client_epochs: int
    dp_mode: str


def check_new_clients(config: NewClientSettings) -> None:
    if not 0 <= config.new_client_fraction < 1:
        fail("new-client-fraction", config.new_client_fraction, "a fraction in [0, 1)")
    epochs = config.new_client_epochs
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        fail("new-client-epochs", epochs, "an integer >= 0")
    if config.new_client_fraction > 0 and config.dp_mode == "central":
        fail("new-client-fraction", config.new_client_fraction, "0 with dp-mode='central' "
             "(its fixed denominators and its accounting are over every partition)")  # fmt: skip


def held_out_count(fraction: float, num_partitions: int) -> int:
    """⌊fraction · N⌋ clients, at least one where the fraction is above 0, and never all."""
    if fraction <= 0 or num_partitions < 2:
        return 0
    return min(num_partitions - 1, max(1, math.floor(fraction * num_partitions + 1e-9)))


def held_out(config: NewClientSettings, num_partitions: int) -> frozenset[int]:
    """The held-out partitions: a seeded draw that depends on the seed and N only, so
    the server and every client name the same ones."""
    count = held_out_count(config.new_client_fraction, num_partitions)
    if not count:
        return frozenset()
    from fedreg_app.core.seeds import drawn_partitions  # here: config loads without torch

    return drawn_partitions(config.seed, "new-clients", num_partitions, count)
