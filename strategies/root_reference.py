"""The server's root dataset. FLTrust's reference update (``aggregation = "fltrust"``,
Cao et al., NDSS 2021): each round the server trains the global model on a small root
dataset of its own and judges every client's update by its direction against that one,
which no client can shape. ``lfr`` measures on the same dataset the loss of the round's
average with and without each reply (:meth:`RootReference.loss`).

The root dataset is a seeded uniform draw of ``fltrust-root-samples`` from the union of
the clients' train splits (FLTrust's experiments draw it uniformly from the training
data). In FLTrust the server runs the clients' number of local iterations; clients here
run epochs over data of different sizes, so the server trains as many passes over the
root dataset as bring its samples trained nearest to the round's median client's (at
least one), with the run's batch size, learning rate and momentum, on the global model
(base and global head, cross entropy), from a fresh optimizer and a shuffle seeded by the
run's seed and the round. The reference's norm is what every update is rescaled to: with
the ``local-epochs`` passes alone over 100 samples it would be a fraction of a client's,
and the global model would move at that pace. The same round and replies give the same
reference, so a resumed run aggregates as the uninterrupted one.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch.nn import functional as F  # noqa: N812 - the usual name

from fedreg_app.core.config import RunConfig
from fedreg_app.core.data import TensorData
from fedreg_app.core.models import BASE, HEAD_G, SplitModel
from fedreg_app.core.seeds import rng, torch_generator
from fedreg_app.core.training import eval_batches, train_epochs

#: The rules that need the server's root dataset.
ROOT_RULES = ("fltrust", "lfr")


def root_sample(train: TensorData, size: int, seed: int) -> TensorData:
    """``size`` samples (all, if fewer) drawn uniformly without replacement, seeded."""
    if size >= len(train):
        return train
    chosen = np.sort(rng(seed, "fltrust-root").choice(len(train), size=size, replace=False))
    index = torch.as_tensor(chosen)
    return TensorData(train.x[index], train.y[index])


class RootReference:
    """The server's root dataset and the model it trains on it each round."""

    def __init__(self, config: RunConfig, train_union: TensorData) -> None:
        self.config = config
        self.root = root_sample(train_union, config.fltrust_root_samples, config.seed)
        self._model: SplitModel | None = None

    def passes(self, processed: Sequence[int]) -> int:
        """Passes over the root dataset whose samples come nearest to the median of the
        clients' samples processed this round (``processed``), at least one."""
        median = float(np.median(processed)) if len(processed) else 0.0
        return max(1, round(median / max(1, len(self.root))))

    def scratch_model(self, server_model: SplitModel) -> SplitModel:
        """The server's own copy of the model for the root dataset's work, made once: what
        it loads or trains never moves the model of the global evaluation."""
        if self._model is None:
            self._model = copy.deepcopy(server_model)
        return self._model

    @torch.no_grad()
    def loss(self, predict: Callable[[torch.Tensor], torch.Tensor], device: torch.device) -> float:
        """Mean cross entropy of ``predict`` (inputs -> logits) over the root dataset."""
        total = torch.zeros((), dtype=torch.float64)
        for x, y in eval_batches(self.root, device):
            total += F.cross_entropy(predict(x), y, reduction="sum").double().cpu()
        return float(total) / max(1, len(self.root))

    def trained(
        self,
        server_model: SplitModel,
        current: dict[str, np.ndarray],
        server_round: int,
        processed: Sequence[int],
    ) -> dict[str, np.ndarray]:
        """The global model's base and global head after this round's training on the
        root dataset, as much of it as the round's median client trained (``processed``:
        each reply's samples processed). Values, not the change: the rule subtracts the
        global model as it does from the clients' replies. A copy of the server's model
        trains, so the global evaluation's is never moved."""
        model, config = self.scratch_model(server_model), self.config
        model.load_group_state(current, BASE, HEAD_G)
        trainable = model.parameters_of(BASE, HEAD_G)
        train_epochs(
            model,
            trainable,
            lambda x, y: F.cross_entropy(model.head_g(model.base(x)), y),
            self.root,
            epochs=self.passes(processed),
            batch_size=config.batch_size,
            lr=config.lr,
            momentum=config.momentum,
            generator=torch_generator(config.seed, "fltrust-shuffle", server_round),
            device=next(model.parameters()).device,
            drop_last=config.drop_last,
        )
        names = model.parameter_names_of(BASE, HEAD_G)
        return {n: p.detach().cpu().numpy().copy() for n, p in zip(names, trainable, strict=True)}
