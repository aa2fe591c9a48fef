"""FedALA client (Zhang et al., "FedALA: Adaptive Local Aggregation for Personalized
Federated Learning", AAAI 2023).

Instead of overwriting its model with the server's, a client merges the two: the lower
layers take the global model, and each weight θ of the top ``ala-layers`` layers becomes

    θ = θ_local + (θ_global − θ_local) ⊙ W,   W ∈ [0, 1] element-wise,

with W learned on an ``ala-sample-percent`` share of its train split by gradient steps
W ← clip(W − η ∇θ L ⊙ (θ_global − θ_local), 0, 1) (η = ``ala-eta``), one pass per round;
in a client's first adaptation, until the standard deviation of the last
``ala-loss-window`` losses falls below ``ala-loss-threshold``. The merged model is then
trained as in FedAvg, sent whole, and kept as the client's local model (with W) for its
next round. The server averages as FedAvg.

Personal model: the same merge of the current global model into the client's local model,
learned afresh at each evaluation from the client's W (one pass) and not kept: the next
training repeats it on the same sample (the sample is drawn from the round the global
model comes from), so the evaluated model is the one the next round trains from, as in
the reference, where the evaluation follows the merge. A client that has not trained yet
has no local model: its personal model is the global one.

Where ours differs from the authors' code (PFLlib ``utils/ALA.py``, ``clientala.py``):
the reference merges on every client every round (the server sends the model to all),
ours on a client when it trains or is evaluated, keeping the merge of its training
rounds only; the reference's first-round merge starts from the initial model, which ours
does not hold as a local model; the sample is a seeded random subset (the reference: a
contiguous window at a random start); the first adaptation stops after
``ala-max-start-passes`` passes if the losses have not settled (the reference loops until
they do); at an evaluation before any training adaptation the weights take one pass from
W = 1, not the first adaptation's many.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F  # noqa: N812 - the usual name

from clients.base import TrainResult
from clients.fedavg import FedAvgClient
from fedreg_app.core.config import AlgorithmOptions, at_least, option, positive
from fedreg_app.core.data import TensorData
from fedreg_app.core.models import BASE, HEAD_G, SplitModel, checked_value
from fedreg_app.core.records import from_record, to_record
from fedreg_app.core.seeds import torch_generator
from fedreg_app.core.training import batches

LOCAL_MODEL = "ala-local-model"
ALA_WEIGHTS = "ala-weights"


@dataclass(frozen=True)
class FedALAOptions(AlgorithmOptions):
    eta: float = option(
        "ala-eta", 1.0, "a number > 0", positive,
        doc="FedALA: η, the learning rate of the merge weights W.",
        source="FedALA paper §5 (η = 1.0); PFLlib `main.py` `-et` 1.0",
    )  # fmt: skip
    sample_percent: int = option(
        "ala-sample-percent", 80, "an integer from 1 to 100", lambda value: 1 <= value <= 100,
        doc="FedALA: s, the percent of the client's train split W is learned on.",
        source="FedALA paper §5 (s = 80); PFLlib `main.py` `-s` 80",
    )  # fmt: skip
    layers: int = option(
        "ala-layers", 1, "an integer >= 1", at_least(1),
        doc="FedALA: p, how many top layers (output side) are merged with learned "
        "weights; the layers below take the global model.",
        source="FedALA paper §5 (p = 1); PFLlib `main.py` `-p` 2 counts parameter "
        "tensors: the last layer's weight and bias",
    )  # fmt: skip
    loss_threshold: float = option(
        "ala-loss-threshold", 0.1, "a number > 0", positive,
        doc="FedALA: the first adaptation learns W until the std of the recent losses "
        "is below this.",
        source="PFLlib `utils/ALA.py` (`threshold` 0.1)",
    )  # fmt: skip
    loss_window: int = option(
        "ala-loss-window", 10, "an integer >= 2", at_least(2),
        doc="FedALA: how many recent losses (one per pass) that std is taken over.",
        source="PFLlib `utils/ALA.py` (`num_pre_loss` 10)",
    )  # fmt: skip
    max_start_passes: int = option(
        "ala-max-start-passes", 200, "an integer >= 1", at_least(1),
        doc="FedALA: the first adaptation stops after this many passes even if the "
        "losses have not settled.",
        source="our choice: a bound the reference does not have (it loops until the "
        "losses settle)",
    )  # fmt: skip


def merge_layers(model: SplitModel, depth: int) -> list[str]:
    """State-dict names of the parameters of the top ``depth`` layers (output side) of
    base and head: the ones FedALA merges with learned weights."""
    names = model.parameter_names_of(BASE, HEAD_G)
    layers: list[str] = []
    for name in names:
        layer = name.rsplit(".", 1)[0]
        if layer not in layers:
            layers.append(layer)
    top = set(layers[-depth:])
    return [name for name in names if name.rsplit(".", 1)[0] in top]


def merged(local: torch.Tensor, global_: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """θ_local + (θ_global − θ_local) ⊙ W."""
    return local + (global_ - local) * weight


def loss_settled(losses: Sequence[float], window: int, threshold: float) -> bool:
    """The reference's stop rule: more than ``window`` losses, the last ``window`` of
    which have a (population) std below ``threshold``."""
    return len(losses) > window and float(np.std(losses[-window:])) < threshold


@dataclass
class Adaptation:
    """The outcome of one merge: its weights by parameter name, and the work it took."""

    weights: dict[str, torch.Tensor]
    processed: int


class FedALAClient(FedAvgClient):
    state_records = (LOCAL_MODEL, ALA_WEIGHTS)

    def __init__(self, setup) -> None:
        super().__init__(setup)
        self.options = self.config.options_as(FedALAOptions)

    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        self.load_global(global_arrays)
        adapted = self.adapt(global_round=server_round - 1, first_may_settle=True)
        if adapted is not None:
            self.setup.state[ALA_WEIGHTS] = to_record(
                {name: w.cpu().numpy() for name, w in adapted.weights.items()}
            )
        trainable = self.model.parameters_of(BASE, HEAD_G)
        processed = self.fit(
            trainable, self.cross_entropy(self.model), self.data.train,
            self.config.local_epochs, server_round,
        )  # fmt: skip
        self.setup.state[LOCAL_MODEL] = to_record(self.model.group_state(BASE, HEAD_G))
        processed += adapted.processed if adapted is not None else 0
        return TrainResult(self.model.group_state(BASE, HEAD_G), self.train_metrics(processed))

    def prepare_personal_model(self, server_round: int) -> None:
        self.adapt(global_round=server_round, first_may_settle=False)

    def adapt(self, global_round: int, first_may_settle: bool) -> Adaptation | None:
        """Merge the global model the client holds into its local model, in place. None
        where there is nothing to merge: no local model yet, or one equal to the global
        model in the merged layers (the reference's first round)."""
        stored = self.setup.state.get(LOCAL_MODEL)
        if stored is None:
            return None
        local = from_record(stored)
        names = merge_layers(self.model, self.options.layers)
        params = dict(self.model.named_parameters())
        global_values = {n: params[n].detach().clone() for n in names}
        local_values = self.stored(LOCAL_MODEL, local, global_values)
        if all(torch.equal(global_values[n], local_values[n]) for n in names):
            return None
        kept = self.setup.state.get(ALA_WEIGHTS)
        weights = (
            self.stored(ALA_WEIGHTS, from_record(kept), global_values)
            if kept is not None
            else {n: torch.ones_like(global_values[n]) for n in names}
        )
        adaptation = self.learn_weights(
            names, local_values, global_values, weights, global_round,
            settle=first_may_settle and kept is None,
        )  # fmt: skip
        with torch.no_grad():
            for n in names:
                params[n].copy_(merged(local_values[n], global_values[n], adaptation.weights[n]))
        return adaptation

    def stored(
        self, record: str, arrays: dict[str, np.ndarray], like: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The merged layers' entries of a client-state record, each checked against the
        model's (shape, dtype, finite: the file is the node's), on the model's device."""
        return {
            n: checked_value(f"client state {record!r}: {n}", arrays.get(n), into).to(self.device)
            for n, into in like.items()
        }

    def ala_sample(self, global_round: int) -> TensorData:
        """The seeded ``ala-sample-percent`` share of the train split W is learned on;
        the same for the evaluation after a round and the training that follows it."""
        train = self.data.train
        size = int(self.options.sample_percent / 100 * len(train))
        generator = torch_generator(
            self.config.seed, "ala-sample", self.data.partition_id, global_round
        )
        chosen = torch.randperm(len(train), generator=generator)[:size]
        return TensorData(x=train.x[chosen], y=train.y[chosen])

    def learn_weights(
        self,
        names: list[str],
        local: dict[str, torch.Tensor],
        global_: dict[str, torch.Tensor],
        weights: dict[str, torch.Tensor],
        global_round: int,
        settle: bool,
    ) -> Adaptation:
        """W by the reference's rule, on the model whose merged layers are tried with
        the current W and whose lower layers are the global model's (already loaded).
        One pass, or with ``settle`` passes until the losses settle."""
        sample = self.ala_sample(global_round)
        params = dict(self.model.named_parameters())
        tried = [params[n] for n in names]
        frozen = [p for n, p in params.items() if n not in names and p.requires_grad]
        with torch.no_grad():
            for n in names:
                params[n].copy_(merged(local[n], global_[n], weights[n]))
        self.model.train()
        losses: list[float] = []  # one per pass, its last batch's, as the reference keeps
        passes = processed = 0
        for p in frozen:  # the lower layers need no gradient
            p.requires_grad_(False)
        try:
            while True:
                last = None
                for x, y in batches(sample, self.config.batch_size, None, self.device, True):
                    loss = F.cross_entropy(self.model(x), y)
                    grads = torch.autograd.grad(loss, tried)
                    with torch.no_grad():
                        for n, grad in zip(names, grads, strict=True):
                            step = self.options.eta * grad * (global_[n] - local[n])
                            weights[n] = torch.clamp(weights[n] - step, 0, 1)
                            params[n].copy_(merged(local[n], global_[n], weights[n]))
                    processed += len(y)
                    last = loss.item()
                passes += 1
                if last is None:  # fewer samples than a batch: nothing to learn from
                    break
                losses.append(last)
                options = self.options
                if (
                    not settle
                    or loss_settled(losses, options.loss_window, options.loss_threshold)
                    or passes >= options.max_start_passes
                ):
                    break
        finally:
            for p in frozen:
                p.requires_grad_(True)
        return Adaptation(weights, processed)
