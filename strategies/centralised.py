"""Centralised training (``algo = "centralised"``): one model trained on the union of
the clients' train splits, the ceiling a federated algorithm is measured against (``003``
reports centralised baselines beside its federated runs).

It runs in the ServerApp, on the same partition as the federated runs (the union of the
clients' seeded train splits, decoded into the ServerApp's own copy), with the run's model,
optimizer settings and seed. A round is ``local-epochs`` epochs over the whole union, the
passes a participating client makes over its own data in a round, and the run has
``num-server-rounds`` of them. No client trains. Evaluation is the federated algorithms':
every client tests the model on its own split, so the global accuracy is the union test
set's, and the personal accuracy (the same model on each client's split) adds the spread
over clients.

With ``optimizer-state = persistent`` (the default) one optimizer runs the whole training:
its momentum is kept across rounds and in the checkpoint, so a resumed run continues as
if never stopped.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from functools import cached_property
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from torch.nn import functional as F  # noqa: N812 - the usual name

from fedreg_app.core.config import ConfigError, RunConfig
from fedreg_app.core.data import PartitionKey, TensorData, load_info, load_union_split
from fedreg_app.core.models import BASE, HEAD_G, SplitModel, initial_model
from fedreg_app.core.protocol import (
    COMPUTE_SECONDS,
    HANDLER_SECONDS,
    NUM_PROCESSED,
    NUM_TRAINED_PARAMS,
)
from fedreg_app.core.records import from_record, to_record
from fedreg_app.core.seeds import torch_generator
from fedreg_app.core.training import MomentumSGD, select_device, train_epochs
from strategies.base import PersonalizedStrategy
from strategies.replies import RunFacts

#: Prefix of the optimizer's momentum buffers among the checkpoint's strategy arrays.
MOMENTUM = "momentum/"


class CentralisedStrategy(PersonalizedStrategy):
    """Trains in ``aggregate_train``; the clients only evaluate."""

    group_weights: dict[str, str] = {}

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        """It trains on every client's train split: no client can be new to it."""
        super().check_config(config)
        if config.new_client_fraction > 0:
            raise ConfigError(
                f"new-client-fraction={config.new_client_fraction!r} is not allowed with "
                "algo='centralised', which trains on every client's train split: expected 0"
            )

    def __init__(self, config: RunConfig, facts: RunFacts | None = None) -> None:
        super().__init__(config, facts)
        #: The optimizer's momentum buffers by parameter name, kept across rounds.
        self.momentum: dict[str, np.ndarray] = {}

    @cached_property
    def device(self) -> torch.device:
        return select_device(self.config.device)

    @cached_property
    def partition_key(self) -> PartitionKey:
        return PartitionKey.from_config(self.config, self.num_partitions)

    @cached_property
    def train_set(self) -> TensorData:
        """The union of the clients' train splits (without a ServerApp to hand it over,
        decoded on the first round)."""
        return load_union_split(self.partition_key, "train")

    @classmethod
    def server_splits(cls, config: RunConfig) -> tuple[str, ...]:
        return (*super().server_splits(config), "train")

    def keep_server_splits(self, unions: dict[str, TensorData]) -> None:
        """The union of the train splits, decoded in the ServerApp's digest pass."""
        self.train_set = unions["train"]

    @cached_property
    def model(self) -> SplitModel:
        return initial_model(load_info(self.partition_key), self.config).to(self.device)

    @classmethod
    def clients_per_round(cls, config: RunConfig, num_partitions: int) -> int:
        """No client trains, so no training reply is needed."""
        return config.min_train_replies

    # ---------------------------------------------------------------- training
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """No client trains: the ServerApp does, in :meth:`aggregate_train`."""
        self._current = from_record(arrays)
        self.last_sampled = []
        return []

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """``local-epochs`` epochs over the union of the train splits, with a shuffle
        seeded by the run's seed and the round."""
        started = time.perf_counter()
        model = self.model
        model.load_group_state(self._current, BASE, HEAD_G)
        trainable = model.parameters_of(BASE, HEAD_G)
        names = model.parameter_names_of(BASE, HEAD_G)
        optimizer = MomentumSGD(trainable, self.config.lr, self.config.momentum,
                                self.restored_momentum(names, trainable))  # fmt: skip
        processed = train_epochs(
            model,
            trainable,
            lambda x, y: F.cross_entropy(model.head_g(model.base(x)), y),
            self.train_set,
            epochs=self.config.local_epochs,
            batch_size=self.config.batch_size,
            lr=self.config.lr,
            momentum=self.config.momentum,
            generator=torch_generator(self.config.seed, "central-shuffle", server_round),
            device=self.device,
            optimizer=optimizer,
            drop_last=self.config.drop_last,
        )
        if self.config.keeps_optimizers:
            self.momentum = {
                name: buffer.detach().cpu().numpy().copy()
                for name, buffer in zip(names, optimizer.buffers, strict=True)
                if buffer is not None
            }
        seconds = time.perf_counter() - started
        metrics = {
            NUM_PROCESSED: processed,
            NUM_TRAINED_PARAMS: sum(p.numel() for p in trainable),
            COMPUTE_SECONDS: seconds,
            HANDLER_SECONDS: seconds,
            "num-results": 0,
        }
        merged = {**self._current, **model.group_state(BASE, HEAD_G)}
        return to_record(merged), MetricRecord(metrics)

    def restored_momentum(
        self, names: list[str], trainable: list[torch.nn.Parameter]
    ) -> list[torch.Tensor | None]:
        """The kept buffers (from the previous round or the checkpoint), checked against
        the parameters: a checkpoint is data from disk, not trusted."""
        restored: list[torch.Tensor | None] = []
        for name, param in zip(names, trainable, strict=True):
            buffer = self.momentum.get(name)
            if buffer is not None and buffer.shape != tuple(param.shape):
                raise ValueError(
                    f"checkpoint: momentum of {name!r} has shape {buffer.shape}, the "
                    f"parameter {tuple(param.shape)}"
                )
            restored.append(None if buffer is None else torch.tensor(buffer, device=self.device))
        return restored

    # -------------------------------------------------------------- checkpoint
    def state_dict(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, state = super().state_dict()
        return {**arrays, **{MOMENTUM + k: v for k, v in self.momentum.items()}}, state

    def load_state_dict(self, arrays: dict[str, np.ndarray], state: dict[str, Any]) -> None:
        super().load_state_dict(arrays, state)
        self.momentum = {k[len(MOMENTUM):]: v for k, v in arrays.items()
                         if k.startswith(MOMENTUM)}  # fmt: skip
