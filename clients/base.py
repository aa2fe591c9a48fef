"""What every client procedure shares: model, data, private state, the training core.

A client procedure is one algorithm's client side. Subclasses say which groups they share
(``shared_groups``), whether they keep a private head, how they train in a round and how
they predict personally; loading, saving private state, seeding and evaluation live here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from flwr.app import RecordDict
from torch import nn
from torch.nn import functional as F  # noqa: N812 - the usual name

from fedreg_app.core.config import AlgorithmOptions, RunConfig, at_least, option
from fedreg_app.core.data import ClientData, DatasetInfo, PartitionKey, TensorData
from fedreg_app.core.models import BASE, HEAD_G, SplitModel, checked_value, initial_model
from fedreg_app.core.protocol import (
    GLOBAL_CORRECT,
    NUM_EXAMPLES,
    NUM_PROCESSED,
    NUM_TEST,
    NUM_TRAINED_PARAMS,
    PERSONAL_CORRECT,
)
from fedreg_app.core.records import from_record, to_record
from fedreg_app.core.seeds import torch_generator
from fedreg_app.core.training import (
    Forward,
    LossFn,
    MomentumSGD,
    count_correct_each,
    eval_batches,
    select_device,
    train_epochs,
)


@dataclass(frozen=True)
class PersonalEpochs(AlgorithmOptions):
    """``personal-epochs``, shared by Ditto (v_k's epochs) and FedRep (the head's)."""

    personal_epochs: int = option(
        "personal-epochs", 5, "an integer >= 1", at_least(1),
        doc="Epochs of Ditto's personal model, and of FedRep's and FedAvg2Rep's head "
        "before their base.",
        source="paper §4.2, thesis §5.3",
    )  # fmt: skip


@dataclass(frozen=True)
class ClientSetup:
    """Everything a procedure is built from, assembled once per message by the ClientApp."""

    config: RunConfig
    info: DatasetInfo
    data: ClientData
    state: RecordDict = field(repr=False)
    #: Folder for this partitioning's expensive derived data (decoded partition, FedReG's
    #: rebalanced set) when the node has a ``state-dir``; None keeps them in memory only.
    cache: Path | None = None
    #: The partitioning ``data`` comes from (None: data given directly, as in tests):
    #: what a procedure needs to know of the other partitions, e.g. FedReG's global
    #: threshold (every client's train size), it computes from this, as every node can.
    partition_key: PartitionKey | None = None


@dataclass
class TrainResult:
    arrays: dict[str, np.ndarray]
    metrics: dict[str, float | int]


class ClientProcedure:
    """Base class: FedAvg-like defaults that the algorithms override where they differ."""

    #: Parameter groups the server sends and the client loads before training.
    shared_groups: tuple[str, ...] = (BASE, HEAD_G)
    #: Whether the model carries a second head ``head_p``.
    private_head: bool = False
    #: Groups kept in the client's state between rounds: the client trains from its own
    #: copy of these, whatever the server sends.
    private_groups: tuple[str, ...] = ()
    #: Other records the procedure keeps in the client's state (Ditto's v_k, ...).
    state_records: tuple[str, ...] = ()
    #: Whether its schedule is laid out over ``num-server-rounds`` (FedSeq's unfreezing,
    #: a fine-tune in or after the last rounds): a resume must then keep that number, or
    #: the rounds before and after it follow two different schedules.
    schedule_over_rounds: bool = False

    @classmethod
    def keeps_state(cls, config: RunConfig) -> bool:
        """Whether a client carries anything from one round to the next (private groups,
        other records, or its optimizers' momentum): a resumed run then needs it on disk."""
        private = cls.private_groups or cls.state_records or cls.private_head
        return bool(private) or config.keeps_optimizers

    def __init__(self, setup: ClientSetup) -> None:
        self.setup = setup
        self.config = setup.config
        self.data = setup.data
        self.device = select_device(self.config.device)
        self.model: SplitModel = self.new_model(private_head=self.private_head)
        self.trained_numel: dict[int, int] = {}  # parameter id -> size, over this round
        #: The message's config from the server (round, phase flags of some algorithms).
        self.server_config: dict = {}
        #: Whether ``fit`` keeps its optimizer's momentum in the client's state: in a
        #: training message, not in the fine-tuning some algorithms run to evaluate.
        self.keep_optimizers = self.config.keeps_optimizers
        #: Optimizers by (round, stream, parameters trained): a step split over several
        #: ``fit`` calls (FedReG's interleaved epochs) continues one optimizer.
        self.optimizers: dict[tuple[int, int, tuple[int, ...]], MomentumSGD] = {}

    def new_model(self, private_head: bool = False) -> SplitModel:
        """The run's model (``model``, ``head-depth``): seeded init, or ``init-model``."""
        return initial_model(self.setup.info, self.config, private_head).to(self.device)

    # ----------------------------------------------------------------- the round
    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        """One round of local training; returns what is sent to the server."""
        raise NotImplementedError

    def evaluate(
        self,
        global_arrays: dict[str, np.ndarray],
        server_round: int,
        global_parts: tuple[nn.Module, Forward] | None = None,
    ) -> dict[str, int]:
        """Correct counts on the client's own test split: its personal model's and, when
        ``global_parts`` (base, head) is given, the global model's, in one pass over the
        split; where both bases hold the same weights the base runs once. The server sums
        the counts: the union of the splits is the global test set."""
        self.load_global(global_arrays)
        self.restore_private()
        self.keep_optimizers = False  # evaluation leaves the client's state as it was
        self.prepare_personal_model(server_round)
        return self.count_correct(global_parts)

    def count_correct(self, global_parts: tuple[nn.Module, Forward] | None) -> dict[str, int]:
        """Correct counts of the personal model as the procedure holds it now and, when
        given, of the global model, in one pass over the test split."""
        self.model.eval()
        personal_base, personal_head = self.personal_parts()
        models = {PERSONAL_CORRECT: (personal_base, personal_head)}
        if global_parts is not None:
            base, head = global_parts
            if same_weights(base, personal_base):
                base = personal_base
                head = personal_head if self.personal_head_is(head) else head
            models[GLOBAL_CORRECT] = (base, head)
        correct = count_correct_each(models, self.data.test, self.device)
        return {NUM_TEST: len(self.data.test), **correct}

    def evaluate_as_new_client(
        self,
        global_arrays: dict[str, np.ndarray],
        server_round: int,
        global_parts: tuple[nn.Module, Forward] | None = None,
    ) -> dict[str, int]:
        """A held-out client (``new-client-fraction``): one local round of the algorithm
        from the global model, ``new-client-epochs`` epochs on a state of its own that
        is then dropped, and the personal model that round leaves (with 0 epochs: the
        one an untrained client has)."""
        epochs = self.config.new_client_epochs
        self.keep_optimizers = False
        if epochs == 0:
            return self.evaluate(global_arrays, server_round, global_parts)
        self.config = dataclasses.replace(self.config, local_epochs=epochs)
        self.setup = dataclasses.replace(self.setup, config=self.config, state=RecordDict())
        self.train(global_arrays, server_round)
        return self.count_correct(global_parts)

    def personal_parts(self) -> tuple[nn.Module, Forward]:
        """The personal model as (base, head on base features)."""
        return self.model.base, self.personal_head

    def personal_head_is(self, head: Forward) -> bool:
        """Whether the personal head computes what ``head`` does, so that one forward pass
        of the head serves both (FedAvg, FedProx, FedDyn: personal = global): the default
        personal head on a model without a private head, ``head`` a module with the same
        weights as the global head this client holds."""
        default = ClientProcedure.personal_parts, ClientProcedure.personal_head
        return (
            (type(self).personal_parts, type(self).personal_head) == default
            and self.model.head_p is None
            and isinstance(head, nn.Module)
            and same_weights(head, self.model.head_g)
        )

    # ----------------------------------------------------- hooks for algorithms
    def personal_predict(self, x: torch.Tensor) -> torch.Tensor:
        """The personal model's logits: its head on its base."""
        base, head = self.personal_parts()
        return head(base(x))

    def personal_head(self, features: torch.Tensor) -> torch.Tensor:
        """Personal prediction from base features: the sum of both heads' logits where the
        model has a private head (FedReG, FedRoD), else the global head's."""
        logits = self.model.head_g(features)
        return logits + self.model.head_p(features) if self.model.head_p is not None else logits

    def prepare_personal_model(self, server_round: int) -> None:
        """Hook run before personal evaluation (e.g. FedBABU's fine-tuning)."""

    # ------------------------------------------------------------------ helpers
    def load_global(self, arrays: dict[str, np.ndarray]) -> None:
        """Load the shared groups from the server's model."""
        self.model.load_group_state(arrays, *self.shared_groups)

    def restore_private(self) -> None:
        """Load the private groups from the client's state, over what the server sent.
        A client's first time keeps what it has: for ``head_p`` the initial head
        (identical on every client, because initialisation is seeded)."""
        for group in self.private_groups:
            if group in self.setup.state:
                self.model.load_group_state(from_record(self.setup.state[group]), group)

    def save_private(self) -> None:
        for group in self.private_groups:
            self.setup.state[group] = to_record(self.model.group_state(group))

    def fit(
        self,
        trainable: Sequence[nn.Parameter],
        loss_fn: LossFn,
        data: TensorData,
        epochs: int,
        server_round: int,
        stream: int = 0,
        model: nn.Module | None = None,
        generator: torch.Generator | None = None,
    ) -> int:
        """Train with the run's optimiser settings and a seeded shuffle for this client,
        round and ``stream`` (distinct streams for the distinct steps of one round).
        ``model`` defaults to the procedure's model (Ditto passes its personal one).
        ``generator``, if given, draws the shuffle instead: a caller splitting one step's
        epochs over several calls passes the same one, so each epoch gets its own order.

        Each stream is one optimizer of the algorithm (FedReG's opt_1 and opt_2, FedRep's
        head and base optimizers); with ``optimizer-state = persistent`` its momentum
        continues from the client's previous rounds (see :meth:`kept_optimizer`)."""
        model = self.model if model is None else model
        optimizer = self.kept_optimizer(server_round, stream, model, trainable)
        processed = train_epochs(
            model,
            trainable,
            loss_fn,
            data,
            epochs=epochs,
            batch_size=self.config.batch_size,
            lr=self.stream_lr(stream),
            momentum=self.config.momentum,
            generator=generator
            if generator is not None
            else torch_generator(
                self.config.seed, "shuffle", self.data.partition_id, server_round, stream
            ),
            device=self.device,
            optimizer=optimizer,
            drop_last=self.config.drop_last,
            cuda_graphs=self.config.cuda_graphs,
        )
        if self.keep_optimizers:
            self.keep_optimizer(stream, model, optimizer)
        if processed:  # none under drop-last where the data are fewer than a batch
            self.trained_numel.update((id(p), p.numel()) for p in trainable)
        return processed

    def kept_optimizer(
        self, server_round: int, stream: int, model: nn.Module, trainable: Sequence[nn.Parameter]
    ) -> MomentumSGD:
        """The stream's optimizer over ``trainable``, made once per round. Where
        optimizers are kept across rounds its momentum buffers are restored from the
        client's state (none yet on a client's first round); else (``optimizer-state =
        fresh``, momentum 0, an evaluation) it starts empty."""
        key = (server_round, stream, tuple(id(p) for p in trainable))
        if key not in self.optimizers:
            restored = (
                self.stored_momentum(stream, model, trainable) if self.keep_optimizers else None
            )
            self.optimizers[key] = MomentumSGD(
                trainable, self.stream_lr(stream), self.config.momentum, restored
            )
        return self.optimizers[key]

    def stream_lr(self, stream: int) -> float:
        """The learning rate of the stream's optimizer: the run's ``lr``. FedReG's two
        steps may each have their own (``fedreg-step1-lr``, ``fedreg-step2-lr``); the
        momentum kept in the client's state does not depend on it."""
        return self.config.lr

    def stored_momentum(
        self, stream: int, model: nn.Module, trainable: Sequence[nn.Parameter]
    ) -> list[torch.Tensor | None]:
        """The stream's momentum buffers for ``trainable`` from the client's state, by
        parameter name (None where a parameter has none yet)."""
        stored = self.setup.state.get(optimizer_record(stream))
        buffers = from_record(stored) if stored is not None else {}
        names = parameter_names(model, trainable)
        restored: list[torch.Tensor | None] = []
        for name, param in zip(names, trainable, strict=True):
            buffer = buffers.get(name)
            if buffer is None:
                restored.append(None)
                continue
            where = f"client state {optimizer_record(stream)!r}: momentum of {name!r}"
            checked = checked_value(where, buffer, param.detach())  # from the node's disk
            restored.append(checked.to(self.device, copy=True))
        return restored

    def keep_optimizer(self, stream: int, model: nn.Module, optimizer: MomentumSGD) -> None:
        """Store the stream's momentum buffers by parameter name; buffers of parameters
        this call did not train (FedSeq's other layers) are kept as they were, as one
        optimizer over the whole model would keep them."""
        key = optimizer_record(stream)
        stored = from_record(self.setup.state[key]) if key in self.setup.state else {}
        names = parameter_names(model, optimizer.params)
        for name, buffer in zip(names, optimizer.buffers, strict=True):
            if buffer is not None:
                stored[name] = buffer.detach().cpu().numpy().copy()
        self.setup.state[key] = to_record(stored)

    def fit_head(self, epochs: int, server_round: int, stream: int) -> int:
        """Train ``head_g`` with the base frozen, on the base's train features computed
        once: the same as training through the frozen base (the models have no dropout
        or batch norm), at a fraction of the cost. FedRep's head epochs, FedBABU's
        fine-tuning."""
        head = self.model.head_g
        features = self.base_features(self.data.train)
        return self.fit(
            list(head.parameters()),
            self.cross_entropy(head),
            features,
            epochs,
            server_round,
            stream=stream,
            model=head,
        )

    def fine_tune(self, epochs: int, server_round: int, whole_model: bool) -> int:
        """Train this evaluation's copy on the train split before its personal figure:
        the whole model, or the head on the frozen base's features (``fit_head``);
        FedBABU's and FedAvg-FT's fine-tuning. Its own optimizer stream, with fresh
        momentum (an evaluation keeps no optimizer)."""
        if not whole_model:
            return self.fit_head(epochs, server_round, stream=FINE_TUNE_STREAM)
        return self.fit(
            list(self.model.parameters()),
            self.cross_entropy(self.model),
            self.data.train,
            epochs,
            server_round,
            stream=FINE_TUNE_STREAM,
        )

    @torch.no_grad()
    def base_features(self, data: TensorData) -> TensorData:
        self.model.eval()
        parts = [self.model.base(x) for x, _ in eval_batches(data, self.device)]
        return TensorData(x=torch.cat(parts), y=data.y)

    def cross_entropy(self, predict: Callable[[torch.Tensor], torch.Tensor]) -> LossFn:
        return lambda x, y: F.cross_entropy(predict(x), y)

    def aggregation_weights(self) -> dict[str, float | int]:
        """The weight metrics this client's training replies carry, known before it
        trains: central DP's fixed denominators are built from every client's."""
        return {NUM_EXAMPLES: len(self.data.train)}

    def train_metrics(self, processed: int, **extra: float | int) -> dict[str, float | int]:
        return {
            NUM_EXAMPLES: len(self.data.train),
            NUM_PROCESSED: processed,
            NUM_TRAINED_PARAMS: sum(self.trained_numel.values()),
            **extra,
        }


#: The optimizer stream of fine-tuning before a personal evaluation (training steps use
#: streams 0-2).
FINE_TUNE_STREAM = 3


def optimizer_record(stream: int) -> str:
    """Name of the client-state record holding one optimizer's momentum buffers."""
    return f"optimizer-{stream}"


def parameter_names(model: nn.Module, params: Sequence[nn.Parameter]) -> list[str]:
    """State-dict names of ``params`` in ``model``: momentum is stored by name, so it
    follows its parameter whatever order a step lists them in."""
    names = {id(p): name for name, p in model.named_parameters()}
    missing = [i for i, p in enumerate(params) if id(p) not in names]
    if missing:
        raise ValueError(f"parameters {missing} to train are not in the model")
    return [names[id(p)] for p in params]


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    """Whether two modules compute the same function: the same structure and equal
    parameters and buffers (then one pass serves both)."""
    if a is b:
        return True
    ours, theirs = a.state_dict(), b.state_dict()
    return ours.keys() == theirs.keys() and all(
        ours[k].shape == theirs[k].shape and torch.equal(ours[k], theirs[k]) for k in ours
    )


def snapshot(params: Sequence[nn.Parameter]) -> list[torch.Tensor]:
    """Detached copies, e.g. of the global weights a proximal term pulls toward."""
    return [p.detach().clone() for p in params]


def squared_distance(
    params: Sequence[nn.Parameter], anchors: Sequence[torch.Tensor]
) -> torch.Tensor:
    """||w - w_anchor||^2 summed over all tensors (FedProx, FedDyn, Ditto)."""
    return sum(((p - a) ** 2).sum() for p, a in zip(params, anchors, strict=True))
