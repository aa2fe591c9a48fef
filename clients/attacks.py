"""Clients that lie, simulated to measure what the server's defences do against them
(``attack``, ``attack-fraction``, ``attack-scale``; research only).

The lying partitions are drawn once from the run's seed, so every algorithm and every
aggregation rule of a comparison faces the same liars. An attack works on any algorithm:
on its data before training (``label-flip``) or on the reply after it, relative to the
arrays the server sent (the others). Entries of the reply the server did not send are
left as trained.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import numpy as np
from flwr.app import RecordDict

from clients.base import ClientProcedure
from fedreg_app.core.config import RunConfig
from fedreg_app.core.data import TensorData
from fedreg_app.core.records import from_record, to_record
from fedreg_app.core.seeds import rng

#: The replay attacker's first update, kept in its private state.
REPLAYED_UPDATE = "attack-replayed-update"

Arrays = Mapping[str, np.ndarray]


def flipped(train: TensorData, num_classes: int) -> TensorData:
    """Labels y -> C − 1 − y (Fang et al. 2020's label flipping)."""
    return TensorData(train.x, (num_classes - 1) - train.y)


@contextmanager
def lying_data(procedure: ClientProcedure) -> Iterator[None]:
    """Under ``label-flip``, the procedure trains on flipped labels; its data is its own
    again afterwards (its reply still names the data it was given)."""
    if procedure.config.attack != "label-flip":
        yield
        return
    honest = procedure.data
    lying = dataclasses.replace(
        honest, train=flipped(honest.train, procedure.setup.info.num_classes)
    )
    procedure.data = lying
    try:
        yield
    finally:
        procedure.data = honest


def lie(
    trained: Arrays, sent: Arrays, config: RunConfig, state: RecordDict,
    partition_id: int, server_round: int,
) -> dict[str, np.ndarray]:  # fmt: skip
    """The reply a lying client sends instead of ``trained`` (``label-flip`` lied
    before training, so its reply is what it trained)."""
    keys = [key for key in trained if key in sent]
    update = {k: np.asarray(trained[k], np.float64) - np.asarray(sent[k], np.float64) for k in keys}
    attack = config.attack
    if attack == "scale":
        update = {k: config.attack_scale * d for k, d in update.items()}
    elif attack == "sign-flip":
        update = {k: -d for k, d in update.items()}
    elif attack == "noise":
        update = noise_like(update, rng(config.seed, "attack-noise", partition_id, server_round))
    elif attack == "replay":
        update = replayed(update, state)
    elif attack != "label-flip":
        raise ValueError(f"attack={attack!r} has no reply to send")
    lied = {k: (np.asarray(sent[k], np.float64) + d).astype(np.asarray(trained[k]).dtype)
            for k, d in update.items()}  # fmt: skip
    return {**trained, **lied}


def noise_like(update: Mapping[str, np.ndarray], generator: np.random.Generator) -> dict:
    """Gaussian noise with the honest update's spread (std over all its coordinates),
    in its place: as large as an honest update, pointing nowhere."""
    values = np.concatenate([d.ravel() for d in update.values()]) if update else np.zeros(1)
    std = float(values.std())
    return {k: generator.normal(0.0, std, size=d.shape) for k, d in update.items()}


def replayed(update: Mapping[str, np.ndarray], state: RecordDict) -> dict[str, np.ndarray]:
    """The first update this client sent, again (kept in its private state); in its
    first round it sends the honest one and keeps it. Entries the first update lacks
    (a schedule that sends other layers later) are sent as trained."""
    if REPLAYED_UPDATE not in state.array_records:
        state[REPLAYED_UPDATE] = to_record(
            {k: np.asarray(d, np.float32) for k, d in update.items()}
        )
        return dict(update)
    first = from_record(state[REPLAYED_UPDATE])
    return {k: np.asarray(first[k], np.float64) if k in first else d for k, d in update.items()}
