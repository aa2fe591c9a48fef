"""What every strategy shares: seeded client sampling, aggregation by parameter group,
evaluation of the personal models on all clients.

Personal accuracy is measured on every client (thesis 5.3; PFLlib's
``serverbase.test_metrics`` loops over all ``self.clients``, ``evaluate`` divides the
summed correct by the summed test samples), so a client never sampled yet is scored with
a private part that has not been trained. Beside that headline figure,
``personal-accuracy-sampled`` is the same sample-weighted figure over the clients that
have trained at least once: a client counts from the round whose training reply the
server accepted (passed the checks), not from the round it was merely sampled in; a
client whose reply failed, timed out or was rejected does not count for that round (even
if it trained locally).

Strategies are Flower ``Strategy`` subclasses. Differences between algorithms are
declared, not coded: ``group_weights`` says which train-reply metric weights each
parameter group in the weighted average (FedReG: base by |D_k|, head_g by e_k).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from logging import INFO, WARNING
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from torch import nn

from fedreg_app.core.config import ConfigError, RunConfig
from fedreg_app.core.models import BASE, HEAD_G, SplitModel, group_of
from fedreg_app.core.new_clients import held_out, held_out_count
from fedreg_app.core.partition_map import PartitionMap
from fedreg_app.core.protocol import (
    ARRAYS,
    CONFIG,
    COST_SECONDS,
    GLOBAL_ARRAYS,
    GLOBAL_CORRECT,
    METRICS,
    NUM_EXAMPLES,
    NUM_PROCESSED,
    NUM_TEST,
    NUM_TRAINED_PARAMS,
    PARTITION_ID,
    PERSONAL_CORRECT,
    PERSONAL_GLOBAL_WEIGHT,
    SERVER_ROUND,
    STATE_KEY,
)
from fedreg_app.core.records import from_record, to_record
from fedreg_app.core.robustness import attackers
from strategies.replies import ReplyLedger, RunFacts, eval_reply_problem, train_reply_problem
from strategies.robust import bound, removal_verdicts, robust_aggregate
from strategies.root_reference import ROOT_RULES, RootReference
from strategies.sampling import ClientSampler, addressed_messages, held_state_versions, sample_size

if TYPE_CHECKING:
    from fedreg_app.core.data import TensorData


def normalised(weights: list[float], what: str) -> list[float]:
    total = float(sum(weights))
    if total <= 0:
        raise ValueError(f"aggregation weights for {what} sum to {total}; nothing to average")
    return [w / total for w in weights]


Update = tuple[Mapping[str, np.ndarray], Mapping[str, float]]
#: A model as (base, head on base features).
ModelParts = tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor]]


def aggregation_weights(
    updates: list[Update], group_weights: Mapping[str, str]
) -> dict[str, list[float]]:
    """Per group, each client's share: its metric ``group_weights[group]`` over the sum."""
    return {
        group: normalised([float(metrics[key]) for _, metrics in updates], f"{group} ({key})")
        for group, key in group_weights.items()
    }


def weighted_average_by_group(
    updates: list[Update], group_weights: Mapping[str, str]
) -> dict[str, np.ndarray]:
    """Average each parameter group over the clients with its own weights.

    ``updates`` holds (arrays, metrics) per client; ``group_weights[g]`` names the metric
    whose normalised values weight group ``g``. Keys of groups not listed are an error:
    a strategy must say how everything it receives is aggregated.
    """
    averaged: dict[str, np.ndarray] = {}
    weights = aggregation_weights(updates, group_weights)
    for client, (arrays, _) in enumerate(updates):
        for key, value in arrays.items():
            group = group_of(key)
            if group not in weights:
                raise KeyError(f"received {key!r} but the strategy aggregates only {list(weights)}")
            contribution = value.astype(np.float64) * weights[group][client]
            averaged[key] = averaged[key] + contribution if key in averaged else contribution
    reference = updates[0][0]
    return {key: value.astype(reference[key].dtype) for key, value in averaged.items()}


class PersonalizedStrategy(Strategy):
    """Base strategy: FedAvg behaviour over the groups in ``group_weights``."""

    #: For each parameter group clients send: the train-reply metric that weights it.
    group_weights: Mapping[str, str] = {BASE: NUM_EXAMPLES, HEAD_G: NUM_EXAMPLES}
    #: The groups clients receive; None: the whole global model.
    sent_groups: tuple[str, ...] | None = None
    #: The algorithm's default for ``global-eval = "auto"``: clients evaluate the global
    #: model on their test splits, or the ServerApp on its copy of the union test set
    #: (LG-FedAvg: sending it to every client would cost too much). See ``evaluation_of``.
    global_on_clients: bool = True
    #: Whether an overridden ``aggregate_updates`` can work from ``average_updates``
    #: alone, when a wrapper lets the server see only the aggregate (FedDyn, FedReG);
    #: other overrides need every client's update.
    works_from_average: bool = False
    #: Whether the algorithm has a global model at all (local training has none: its
    #: runs report no global accuracy).
    has_global_model: bool = True

    def __init__(self, config: RunConfig, facts: RunFacts | None = None) -> None:
        self.check_config(config)
        self.config = config
        #: What the ServerApp knows of the run's clients before the first round.
        self.facts = facts or RunFacts()
        self.sampler = ClientSampler(config)
        self.partitions = PartitionMap(0)
        self.last_sampled: list[int] = []
        self._current: dict[str, np.ndarray] = {}
        #: This round's training replies decoded, by ``id`` of the message (kept with it,
        #: so that an id is never reused for another message): see :meth:`reply_arrays`.
        self._decoded: dict[int, tuple[Message, dict[str, np.ndarray]]] = {}
        #: The server's model, once ``prepare_model`` has been given it.
        self.model: SplitModel | None = None
        #: The root dataset of ``fltrust`` and ``lfr``, and the server's copy of the model.
        self.root: RootReference | None = None
        #: What accepted replies said, which later replies must repeat (checkpointed).
        self.ledger = ReplyLedger()
        #: The aggregate that replaces the weighted average of the updates, where a
        #: wrapper lets the server see only an aggregate (None: the weighted average).
        self.release: Callable[[int, list[Update]], dict[str, np.ndarray]] | None = None
        #: Per group, the largest update-norm ratio among this round's accepted replies.
        self.norm_ratio_max: dict[str, float] = {}
        #: Under a trust rule, the last aggregation's trust in each update: group ->
        #: {partition: ReLU of its cosine with the reference} (0: no weight); under
        #: ``flame`` and ``lfr``, 1 (admitted, kept) or 0.
        self.update_trust: dict[str, dict[str, float]] = {}
        #: New clients: partitions held out of training, evaluated apart (``held_out``).
        self.held_out: frozenset[int] = frozenset()
        #: Partitions that lie in a simulated attack (``attack``): the honest clients'
        #: personal accuracy is reported apart, as a liar's own model is of its lie.
        self.liars: frozenset[int] = frozenset()
        #: Partitions whose training reply was accepted in some round so far (checkpointed).
        self.trained_partitions: set[int] = set()
        #: The newest private-state version each partition said it holds (``state-round``
        #: of its last accepted reply; checkpointed), sent back to it as ``state-held``.
        self.state_rounds: dict[int, int] = {}

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        """Settings this algorithm refuses, checked before any work (a ConfigError)."""
        if config.new_client_fraction > 0 and not cls.has_global_model:
            raise ConfigError(
                f"new-client-fraction={config.new_client_fraction!r} is not allowed with "
                f"algo={config.algo!r}, which has no global model to give a new client: "
                "expected 0"
            )
        if config.global_eval != "auto" and not cls.has_global_model:
            raise ConfigError(
                f"global-eval={config.global_eval!r} is not allowed with "
                f"algo={config.algo!r}, which has no global model: expected 'auto'"
            )
        if config.aggregation != "mean" and not cls.group_weights:  # nothing to aggregate
            raise ConfigError(
                f"aggregation={config.aggregation!r} is not allowed with "
                f"algo={config.algo!r}: no client update reaches the server; expected 'mean'"
            )

    @classmethod
    def evaluation_of(cls, config: RunConfig) -> str:
        """Who evaluates the global model: "clients", "server" (the ServerApp, on its copy
        of the union test set) or "none" (the algorithm has no global model)."""
        if not cls.has_global_model:
            return "none"
        if config.global_eval != "auto":
            return config.global_eval
        return "clients" if cls.global_on_clients else "server"

    @property
    def global_evaluation(self) -> str:
        return self.evaluation_of(self.config)

    @property
    def state_key(self) -> str:
        """Names the clients' on-disk state for this run."""
        return self.facts.state_key

    # -------------------------------------------------------------- clients
    def set_partitions(self, partitions: PartitionMap) -> None:
        """The ServerApp's map of which node serves which partition; it stays the owner
        (it refreshes the map between rounds), the strategy reads it."""
        self.partitions = partitions
        self.sampler.set_population(partitions.num_partitions)
        self.held_out = held_out(self.config, partitions.num_partitions)
        self.liars = attackers(self.config, partitions.num_partitions)

    @property
    def num_partitions(self) -> int:
        return self.partitions.num_partitions

    def sample_partitions(self, server_round: int) -> list[int]:
        """Round ``server_round``'s clients: a seeded draw without replacement over the
        partitions that have a node now (all of them unless devices dropped out), the
        held-out new clients excepted."""
        return self.sampler.sample(self.partitions, self.held_out)

    def training_partitions(self) -> list[int]:
        """Every partition that trains and has a node now (a round that trains all)."""
        return [p for p in self.partitions.available() if p not in self.held_out]

    def note_trained(self, partitions: Iterable[int]) -> None:
        """Partitions whose training reply was accepted this round: from now on they count
        for ``personal-accuracy-sampled``."""
        self.trained_partitions.update(int(p) for p in partitions)

    def note_state_versions(self, replies: Iterable[Message], server_round: int) -> None:
        """The private-state version each accepted reply says its partition holds."""
        self.state_rounds.update(held_state_versions(replies, server_round))

    @classmethod
    def clients_per_round(cls, config: RunConfig, num_partitions: int) -> int:
        """How many clients an ordinary training round samples (min-train-replies must
        not exceed it)."""
        trained = num_partitions - held_out_count(config.new_client_fraction, num_partitions)
        return sample_size(trained, config.fraction_train)

    # ------------------------------------------------------------- run end
    def finished(self, server_round: int) -> bool:
        """True when the algorithm ends the run after this round (before
        num-server-rounds, e.g. deviation tracking's fine-tuning is done)."""
        return False

    def report(self) -> dict[str, Any]:
        """Algorithm facts for results.json's ``run`` (e.g. the chosen fine-tune round)."""
        return {}

    # ---------------------------------------------------------- checkpoint
    def state_dict(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """What a checkpoint must hold to continue exactly: arrays, and JSON-able state
        (here the sampling generator's, so a resumed run samples the same clients, and the
        clients that have trained, so it reports the same sampled personal accuracy)."""
        state: dict[str, Any] = {
            "sampling_rng": self.sampler.generator.bit_generator.state,
            "trained_partitions": sorted(self.trained_partitions),
            "state_rounds": {str(p): r for p, r in sorted(self.state_rounds.items())},
            **self.ledger.state(),
        }
        return {}, state

    def load_state_dict(self, arrays: dict[str, np.ndarray], state: dict[str, Any]) -> None:
        """Checkpoints of earlier versions lack ``trained_partitions``: the set is left as
        it is (the ServerApp rebuilds it from the kept rounds)."""
        self.sampler.generator.bit_generator.state = state["sampling_rng"]
        if "trained_partitions" in state:
            self.trained_partitions = {int(p) for p in state["trained_partitions"]}
        self.state_rounds = {int(p): int(r) for p, r in state.get("state_rounds", {}).items()}
        self.ledger.load(state)

    def _messages(
        self, partitions: Iterable[int], record: RecordDict, message_type: str
    ) -> list[Message]:
        return addressed_messages(self.partitions, partitions, record, message_type,
                                  self.state_rounds)  # fmt: skip

    # --------------------------------------------------------- the model
    @classmethod
    def add_modules(cls, config: RunConfig, model: SplitModel) -> None:
        """Add algorithm-specific modules (under ``model.extra``) to a model before its
        initial arrays are taken; nothing by default. The ClientApp builds the server's
        model with it, without a strategy."""

    def prepare_model(self, model: SplitModel) -> None:
        """The server's model, before the initial arrays are taken."""
        self.add_modules(self.config, model)
        self.model = model

    @classmethod
    def global_parts(
        cls, config: RunConfig, model: SplitModel, arrays: Mapping[str, np.ndarray]
    ) -> ModelParts:
        """The global model as (base, head on base features), with the aggregated arrays
        loaded into ``model``: head_g(base(x)) by default. The clients evaluate it with
        the same code, without a strategy (and share the base's pass with their personal
        model when the weights are the same)."""
        model.load_group_state(dict(arrays), BASE, HEAD_G)
        model.eval()
        return model.base, model.head_g

    def global_predictor(
        self, model: SplitModel, arrays: Mapping[str, np.ndarray]
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The global model's forward: its head on its base."""
        base, head = self.global_parts(self.config, model, arrays)
        return lambda x: head(base(x))

    # ------------------------------------------------------------ training
    def arrays_to_send(
        self, arrays: dict[str, np.ndarray], server_round: int | None
    ) -> dict[str, np.ndarray]:
        """What clients receive for training in ``server_round`` (None: for evaluation):
        the ``sent_groups`` (default: the whole global model). Parts the server keeps only
        for the global figure, or that clients already hold, stay out."""
        if self.sent_groups is None:
            return arrays
        return {key: value for key, value in arrays.items() if group_of(key) in self.sent_groups}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._current = from_record(arrays)
        self._decoded.clear()
        self.last_sampled = self.sample_partitions(server_round)
        sent = self.arrays_to_send(self._current, server_round)
        config[SERVER_ROUND] = server_round
        config[STATE_KEY] = self.state_key
        record = RecordDict({ARRAYS: to_record(sent), CONFIG: config})
        return self._messages(self.last_sampled, record, MessageType.TRAIN)

    def expected_reply_arrays(
        self, server_round: int, current: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """The arrays (names, shapes, dtypes) a training reply must carry, among this
        round's global model (or ``current``): see :meth:`reply_entries`."""
        current = self._current if current is None else current
        return self.reply_entries(self.config, self.model, current, server_round)

    @classmethod
    def reply_entries(
        cls, config: RunConfig, model: SplitModel | None,
        entries: Mapping[str, np.ndarray], server_round: int,
    ) -> dict[str, np.ndarray]:  # fmt: skip
        """Which of the global model's ``entries`` a training reply of ``server_round``
        carries: those of the aggregated groups. Class-level, so that a client names them
        before it trains without building a strategy (local DP's reference); ``model`` is
        the server's model, for schedules that depend on its layers (FedSeq)."""
        return {k: v for k, v in entries.items() if group_of(k) in cls.group_weights}

    def model_size(self) -> int:
        """Parameters of this round's global model (bounds a reply's trained count)."""
        return sum(int(v.size) for v in self._current.values())

    def reply_arrays(self, msg: Message) -> dict[str, np.ndarray]:
        """A training reply's arrays, decoded once a round: its checks, the bound on its
        update and the aggregation read the same arrays, none of them writes into them."""
        kept = self._decoded.get(id(msg))
        if kept is None or kept[0] is not msg:
            kept = (msg, from_record(msg.content[ARRAYS]))
            self._decoded[id(msg)] = kept
        return kept[1]

    def train_reply_problem(self, msg: Message, partition_id: int, server_round: int) -> str:
        """Why a training reply cannot be aggregated ("" if it can): see
        :func:`strategies.replies.train_reply_problem`."""
        return train_reply_problem(
            msg, partition_id, self.facts, self.ledger, self.group_weights.values(),
            self.expected_reply_arrays(server_round), self.model_size(), self.reply_arrays,
        )  # fmt: skip

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate replies the ServerApp has already checked (``train_reply_problem``);
        with fewer than ``min-train-replies`` of them the global model is kept. Replies
        are taken in partition order, not arrival order, so that floating-point sums do
        not depend on which client answered first."""
        valid = sorted(replies, key=lambda msg: int(msg.content[METRICS][PARTITION_ID]))
        self.update_trust = {}
        if len(valid) < self.config.min_train_replies:
            log(WARNING, "round %d: %d training results, fewer than min-train-replies=%d; "
                "the global model is kept as it was", server_round, len(valid),
                self.config.min_train_replies)  # fmt: skip
            return None, None
        updates = [(self.reply_arrays(msg), dict(msg.content[METRICS])) for msg in valid]
        self._decoded.clear()  # the round's last reader: held no longer than it needs
        merged = {**self._current, **self.aggregate_updates(server_round, updates)}
        return to_record(merged), MetricRecord(training_summary([m for _, m in updates]))

    def aggregate_updates(self, server_round: int, updates: list[Update]) -> dict[str, np.ndarray]:
        """New values of the aggregated groups; override for non-averaging servers."""
        return self.average_updates(server_round, updates)

    def average_updates(self, server_round: int, updates: list[Update]) -> dict[str, np.ndarray]:
        """The average of the updates by group, the robust rule's aggregate in its place
        (``aggregation``), or the aggregate a wrapper releases (``release``)."""
        if self.release is not None:
            return self.release(server_round, updates)
        if self.config.aggregation != "mean":
            weights = aggregation_weights(updates, self.group_weights)
            reference = None
            if self.config.aggregation == "fltrust":
                processed = [int(m[NUM_PROCESSED]) for _, m in updates]
                reference = self.root_reference(server_round, processed)
            replies = [arrays for arrays, _ in updates]
            verdicts = None
            if self.config.aggregation == "lfr":
                verdicts = self.removal_verdicts(replies, weights)
            trust: dict[str, dict[int, float]] = {}
            merged = robust_aggregate(replies, weights, self._current,
                                      self.config, reference, trust, server_round,
                                      verdicts)  # fmt: skip
            self.update_trust = {group: self.by_partition(updates, given)
                                 for group, given in trust.items()}  # fmt: skip
            return merged
        return weighted_average_by_group(updates, self.group_weights)

    @staticmethod
    def by_partition(updates: list[Update], given: dict[int, float]) -> dict[str, float]:
        """Per-reply figures (by index into ``updates``) keyed by the replies' partitions."""
        return {str(int(updates[i][1][PARTITION_ID])): round(t, 6) for i, t in given.items()}

    def norm_outliers(self, replies: list[Message]) -> dict[int, str]:
        """Replies (by index) whose change of some group is far above the round's others
        (``update-norm-factor``), each with why; see :func:`strategies.robust.bound`."""
        factor = self.config.update_norm_factor
        self.norm_ratio_max = {}
        if factor == 0 or not replies:
            return {}
        checked = bound(
            [self.reply_arrays(msg) for msg in replies],
            [msg.content[METRICS] for msg in replies],
            self._current, self.group_weights, factor, self.ledger.norm_medians,
        )  # fmt: skip
        self.norm_ratio_max = checked.ratio_max
        return checked.refused

    # ---------------------------------------------------------- evaluation
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Personal accuracy is measured on every client, not only the sampled ones."""
        if not self.config.is_eval_round(server_round):
            return []
        config[SERVER_ROUND] = server_round
        config[STATE_KEY] = self.state_key
        everything = from_record(arrays)
        sent = self.arrays_to_send(everything, None)
        record = RecordDict({ARRAYS: to_record(sent), CONFIG: config})
        if self.global_evaluation == "clients":  # the rest of the global model, for it
            rest = {k: v for k, v in everything.items() if k not in sent}
            record[GLOBAL_ARRAYS] = to_record(rest)
        return self._messages(self.partitions.available(), record, MessageType.EVALUATE)

    def eval_reply_problem(self, msg: Message, partition_id: int) -> str:
        """Why an evaluation reply cannot be counted ("" if it can): see
        :func:`strategies.replies.eval_reply_problem`."""
        on_clients = self.global_evaluation == "clients"
        counted = [PERSONAL_CORRECT, *([GLOBAL_CORRECT] if on_clients else [])]
        return eval_reply_problem(
            msg, partition_id, self.facts, self.ledger, counted, self.model_size()
        )

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Sum the checked replies' counts (None when there are none)."""
        valid = list(replies)
        if not valid:
            return None
        results = sorted(
            (dict(msg.content[METRICS]) for msg in valid), key=lambda m: m[PARTITION_ID]
        )
        self.ledger.test_sizes.update((int(r[PARTITION_ID]), int(r[NUM_TEST])) for r in results)
        return MetricRecord(
            evaluation_summary(
                results,
                self.trained_partitions,
                self.global_evaluation == "clients",
                self.held_out,
                self.liars,
            )  # fmt: skip
        )

    @classmethod
    def server_splits(cls, config: RunConfig) -> tuple[str, ...]:
        """The unions of the clients' splits the ServerApp needs decoded ("train",
        "test"): it decodes them in the pass that digests the partitions (``fltrust`` and
        ``lfr`` draw their root dataset from the train splits')."""
        test = ("test",) if cls.evaluation_of(config) == "server" else ()
        return (*test, "train") if config.aggregation in ROOT_RULES else test

    def keep_server_splits(self, unions: dict[str, TensorData]) -> None:
        """Keeps what :meth:`server_splits` asked for beyond the global test set (which
        the ServerApp holds itself): the root dataset of ``fltrust`` and ``lfr``."""
        if self.config.aggregation in ROOT_RULES:
            self.root = RootReference(self.config, unions["train"])

    def root_reference(self, server_round: int, processed: list[int]) -> dict[str, np.ndarray]:
        """``fltrust``'s reference: the global model after the server's training on its
        root dataset this round, as much as the median client trained (``processed``:
        each reply's samples). The ServerApp hands over the root (``keep_server_splits``)
        and the model (``prepare_model``) before the first round."""
        if self.root is None or self.model is None:
            raise RuntimeError("fltrust needs the ServerApp's train splits and model first")
        return self.root.trained(self.model, self._current, server_round, processed)

    def removal_verdicts(
        self, replies: list[dict[str, np.ndarray]], weights: Mapping[str, Sequence[float]]
    ) -> list[float]:
        """``lfr``'s verdict on each reply (1 kept, 0 rejected): whether the global
        model's loss on the root dataset is lower without it in the round's average
        (:func:`strategies.robust.removal_verdicts`)."""
        if self.root is None or self.model is None:
            raise RuntimeError("lfr needs the ServerApp's train splits and model first")
        root, model = self.root, self.root.scratch_model(self.model)
        device = next(model.parameters()).device

        def loss_of(arrays: dict[str, np.ndarray]) -> float:
            return root.loss(self.global_predictor(model, arrays), device)

        _, verdicts = removal_verdicts(replies, weights, self._current, loss_of,
                                       self.config.lfr_reject)  # fmt: skip
        return [float(v) for v in verdicts]

    def known_test_samples(self) -> int | None:
        """The size of the union test set, once every partition's split size is known."""
        if len(self.ledger.test_sizes) < self.num_partitions:
            return None
        return sum(n for p, n in self.ledger.test_sizes.items() if p not in self.held_out)

    def summary(self) -> None:
        log(INFO, "\t├──> %s: %s", type(self).__name__, dict(self.group_weights))
        log(INFO, "\t└──> fraction-train %.3f, seed %d", self.config.fraction_train,
            self.config.seed)  # fmt: skip


def training_summary(replies: list[Mapping[str, Any]]) -> dict[str, Any]:
    """A round's training: the clients' seconds, samples processed, parameters trained
    and how many replies were averaged."""
    return {
        **cost_totals(replies),
        NUM_PROCESSED: sum(int(m[NUM_PROCESSED]) for m in replies),
        NUM_TRAINED_PARAMS: sum(int(m.get(NUM_TRAINED_PARAMS, 0)) for m in replies),
        "num-results": len(replies),
    }


def evaluation_summary(
    results: list[dict[str, float]],
    trained: set[int],
    global_on_clients: bool,
    held_out: frozenset[int] = frozenset(),
    liars: frozenset[int] = frozenset(),
) -> dict[str, Any]:
    """A round's evaluation: personal accuracy (all clients, and those that have
    trained), the clients' seconds and, where they evaluated it, the global accuracy;
    the ``held_out`` new clients' figures apart, outside the others; with ``liars``,
    also the personal accuracy of the clients that do not lie."""
    taking_part = [r for r in results if int(r[PARTITION_ID]) not in held_out]
    newcomers = [r for r in results if int(r[PARTITION_ID]) in held_out]
    summary: dict[str, Any] = cost_totals(results)
    if taking_part:  # none where every client that answered was a new client
        summary.update(personal_metrics(taking_part))
        summary.update(sampled_personal_metrics(taking_part, trained))
        if global_on_clients:
            summary["global-accuracy"] = correct_share(taking_part, GLOBAL_CORRECT)
        honest = [r for r in taking_part if int(r[PARTITION_ID]) not in liars]
        if liars and honest:
            summary["personal-accuracy-honest"] = correct_share(honest, PERSONAL_CORRECT)
        weights = [float(r[PERSONAL_GLOBAL_WEIGHT]) for r in taking_part
                   if PERSONAL_GLOBAL_WEIGHT in r]  # fmt: skip
        if weights:  # FedReG's weighted personal prediction: the clients' mean λ
            summary[PERSONAL_GLOBAL_WEIGHT] = float(np.mean(weights))
    if newcomers:
        summary["new-clients"] = len(newcomers)
        summary["new-client-personal-accuracy"] = correct_share(newcomers, PERSONAL_CORRECT)
        if global_on_clients:
            summary["new-client-global-accuracy"] = correct_share(newcomers, GLOBAL_CORRECT)
    return summary


def correct_share(results: list[dict[str, float]], key: str) -> float:
    """Σ correct (``key``) over Σ test samples of ``results``: the figure over the union
    of their test splits (thesis 5.3)."""
    return sum(int(r[key]) for r in results) / max(1, sum(int(r[NUM_TEST]) for r in results))


def personal_metrics(results: list[dict[str, float]]) -> dict[str, float | list[float]]:
    """Sum of correct over sum of test samples (thesis 5.3), plus the per-client spread."""
    total = sum(int(r[NUM_TEST]) for r in results)
    per_client = [int(r[PERSONAL_CORRECT]) / max(1, int(r[NUM_TEST])) for r in results]
    return {
        "personal-accuracy": correct_share(results, PERSONAL_CORRECT),
        "personal-accuracy-std": float(np.std(per_client)),
        "num-test": total,
        "client-partitions": [int(r[PARTITION_ID]) for r in results],
        "client-accuracies": per_client,
    }


def sampled_personal_metrics(
    results: list[dict[str, float]], trained: set[int]
) -> dict[str, float | int]:
    """``personal_metrics``' accuracy over the replies of partitions that have trained:
    sum of correct over sum of test samples, and how many such clients it covers. Empty
    when none of them answered (no client trained yet)."""
    chosen = [r for r in results if int(r[PARTITION_ID]) in trained]
    total = sum(int(r[NUM_TEST]) for r in chosen)
    if not chosen or total < 1:
        return {}
    return {
        "personal-accuracy-sampled": correct_share(chosen, PERSONAL_CORRECT),
        "sampled-clients-evaluated": len(chosen),
    }


def cost_totals(results: list[Mapping[str, float]]) -> dict[str, float]:
    """Client seconds summed over the replies (the work the round bought)."""
    return {key: float(sum(float(r.get(key, 0.0)) for r in results)) for key in COST_SECONDS}
