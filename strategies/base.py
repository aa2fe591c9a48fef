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

import math
from collections.abc import Callable, Iterable, Mapping
from logging import INFO, WARNING
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from torch import nn

from fedreg_app.core.config import ConfigError, RunConfig, is_whole
from fedreg_app.core.models import BASE, HEAD_G, SplitModel, group_of
from fedreg_app.core.partition_map import PartitionMap
from fedreg_app.core.privacy import (
    central_release,
    local_epsilon,
    noise_generator,
    noise_std,
    population_denominators,
    sum_epsilon,
)
from fedreg_app.core.protocol import (
    ARRAYS,
    COMPUTE_SECONDS,
    CONFIG,
    COST_COUNTS,
    COST_SECONDS,
    DATA,
    DIGEST,
    DP_REFERENCE,
    GLOBAL_ARRAYS,
    GLOBAL_CORRECT,
    HANDLER_SECONDS,
    INIT_MODEL_DIGEST,
    METRICS,
    NUM_EXAMPLES,
    NUM_PROCESSED,
    NUM_TEST,
    NUM_TRAINED_PARAMS,
    PARTITION_ID,
    PERSONAL_CORRECT,
    SERVER_ROUND,
    STATE_HELD,
    STATE_KEY,
    STATE_ROUND,
)
from fedreg_app.core.records import from_record, to_record
from fedreg_app.core.seeds import rng

if TYPE_CHECKING:
    from fedreg_app.core.data import TensorData


def sample_size(num_clients: int, fraction: float) -> int:
    """Clients per round: floor(N * fraction), at least one (0.25 of 20 -> 5)."""
    return max(1, math.floor(num_clients * fraction + 1e-9))


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
    #: Whether clients evaluate the global model on their test splits (the server sums
    #: the counts) or the ServerApp evaluates it on its own copy of the union test set
    #: (where sending the global model to every client would cost too much, LG-FedAvg).
    global_on_clients: bool = True
    #: Whether an overridden ``aggregate_updates`` works from the base class's private
    #: release under central DP (FedDyn); other overrides are refused with DP on.
    private_aggregation: bool = False
    #: Whether the algorithm has a global model at all (local training has none: its
    #: runs report no global accuracy).
    has_global_model: bool = True

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        # Sampling is over partition ids with the run's seed: every algorithm run with the
        # same seed trains the same clients in the same rounds.
        self.sampling_rng = rng(config.seed, "sampling")
        self.participation: np.ndarray | None = None  # per-partition probabilities
        self.partitions = PartitionMap(0)
        self.last_sampled: list[int] = []
        self._current: dict[str, np.ndarray] = {}
        #: Each partition's test-split size, as its evaluation replies gave it.
        self.test_sizes: dict[int, int] = {}
        #: Each partition's aggregation weights (its split sizes), as its first accepted
        #: training reply gave them: a later reply must say the same (a partition's data
        #: is fixed for a run), so a client cannot grow its share of the average.
        self.train_weights: dict[int, dict[str, float]] = {}
        #: Each partition's (train, test) split sizes, computed by the ServerApp from the
        #: seeded partitioning every node repeats to find its data: a reply's first claim
        #: is checked against them too (a first claim of 10^12 samples would dominate).
        self.split_sizes: dict[int, tuple[int, int]] = {}
        #: Each partition's content digest, computed alike: a reply's ``data`` record must
        #: name it, or the node trained or evaluated on other samples than the partition's.
        self.split_digests: dict[int, str] = {}
        #: The sha256 of the ServerApp's ``init-model`` file (None without one): a reply
        #: must name the same for the node's copy, whose weights its private parts start from.
        self.init_model_digest: str | None = None
        if config.global_eval != "auto":
            if not self.has_global_model:
                raise ConfigError(
                    f"global-eval={config.global_eval!r} is not allowed with "
                    f"algo={config.algo!r}, which has no global model: expected 'auto'"
                )
            self.global_on_clients = config.global_eval == "clients"
        if not self.has_global_model:
            self.global_on_clients = False
        self.check_privacy_allowed()
        #: Central DP: each partition's declared aggregation weights
        #: (``set_population_weights``); each round's weight scales and fixed denominators
        #: are derived from them.
        self.population_weights: dict[int, dict[str, float]] = {}
        #: Privacy ledger (checkpointed): central, (clients sampled, clients available) of
        #: each round that released an update; local, each partition's releases.
        self.dp_releases: list[tuple[int, int]] = []
        self.dp_local_releases: dict[int, int] = {}
        #: Names the clients' on-disk state for this run (set by the ServerApp).
        self.state_key = ""
        #: Partitions whose training reply was accepted in some round so far (checkpointed).
        self.trained_partitions: set[int] = set()
        #: The newest private-state version each partition said it holds (``state-round``
        #: of its last accepted reply; checkpointed), sent back to it as ``state-held``.
        self.state_rounds: dict[int, int] = {}

    # -------------------------------------------------------------- privacy
    def check_privacy_allowed(self) -> None:
        """DP needs updates to privatise, and central DP an averaging server."""
        mode, algo = self.config.dp_mode, self.config.algo
        if mode == "off":
            return
        if not self.group_weights:
            raise ConfigError(
                f"dp-mode={mode!r} is not allowed with algo={algo!r}: no client update "
                "reaches the server; expected 'off'"
            )
        overridden = type(self).aggregate_updates is not PersonalizedStrategy.aggregate_updates
        if mode == "central" and overridden and not self.private_aggregation:
            raise ConfigError(
                f"dp-mode='central' is not allowed with algo={algo!r}: its server does more "
                "than average the updates; expected 'off' or 'local'"
            )

    def set_population_weights(self, weights: Mapping[int, Mapping[str, float]]) -> None:
        """Central DP: every partition's aggregation weights, as the clients declared
        them before the first round (see ``fedreg_app/core/privacy.py``)."""
        self.population_weights = {int(p): dict(w) for p, w in weights.items()}
        population_denominators(self.population_weights, self.group_weights, 1)  # fails now

    def dp_round_denominators(self) -> tuple[dict[str, float], dict[str, float]]:
        """This round's weight scales and fixed denominators, for the groups it aggregates
        and the clients it sampled: a round that trains every client (FedSeq's and
        deviation tracking's fine-tuning) or adds a group (the head, from deviation
        tracking's fine-tune phase on) is averaged as such, not as an ordinary round."""
        if not self.population_weights:
            raise RuntimeError("dp-mode='central' needs set_population_weights first")
        return population_denominators(
            self.population_weights, self.group_weights, len(self.last_sampled)
        )

    def privacy_epsilon(self) -> float | None:
        """ε spent so far at ``dp-delta`` (None with DP off)."""
        config = self.config
        if config.dp_mode == "central":
            return sum_epsilon(self.dp_releases, config)
        if config.dp_mode == "local":
            most = max(self.dp_local_releases.values(), default=0)
            return local_epsilon(config.dp_noise_multiplier, most, config.dp_delta)
        return None

    # -------------------------------------------------------------- clients
    def set_partitions(self, partitions: PartitionMap) -> None:
        """The ServerApp's map of which node serves which partition; it stays the owner
        (it refreshes the map between rounds), the strategy reads it."""
        self.partitions = partitions
        gamma = self.config.participation_gamma
        if gamma > 0:  # skewed participation (003, Section 4.4): fixed for the whole run
            draw = rng(self.config.seed, "participation")
            self.participation = draw.dirichlet(np.full(partitions.num_partitions, gamma))

    @property
    def num_partitions(self) -> int:
        return self.partitions.num_partitions

    def sample_partitions(self, server_round: int) -> list[int]:
        """Round ``server_round``'s clients: a seeded draw without replacement over the
        partitions that have a node now (all of them unless devices dropped out)."""
        available = self.partitions.available()
        if not available:
            return []
        k = min(sample_size(self.num_partitions, self.config.fraction_train), len(available))
        weights = None
        if self.participation is not None:
            weights = self.participation[available] + 1e-12  # every client keeps a chance
            weights = weights / weights.sum()
        chosen = self.sampling_rng.choice(available, size=k, replace=False, p=weights)
        return sorted(int(p) for p in chosen)

    def note_trained(self, partitions: Iterable[int]) -> None:
        """Partitions whose training reply was accepted this round: from now on they count
        for ``personal-accuracy-sampled``."""
        self.trained_partitions.update(int(p) for p in partitions)

    def note_state_versions(self, replies: Iterable[Message], server_round: int) -> None:
        """The newest private-state version each accepted reply says its partition holds:
        the next message to it carries it (``state-held``), so a client whose state-dir
        was wiped or replaced since can tell, and counts the loss. A round beyond this one
        cannot be held yet: such a value is not kept."""
        for msg in replies:
            metrics = msg.content[METRICS]
            held = metrics.get(STATE_ROUND)
            if held is None:
                continue
            if held > server_round:
                log(WARNING, "partition %s says it holds its state of round %s in round %d; "
                    "not kept", metrics[PARTITION_ID], held, server_round)  # fmt: skip
                continue
            self.state_rounds[int(metrics[PARTITION_ID])] = int(held)

    def clients_per_round(self) -> int:
        """How many clients an ordinary training round samples (min-train-replies must
        not exceed it)."""
        return sample_size(self.num_partitions, self.config.fraction_train)

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
            "sampling_rng": self.sampling_rng.bit_generator.state,
            "trained_partitions": sorted(self.trained_partitions),
            "state_rounds": {str(p): r for p, r in sorted(self.state_rounds.items())},
            "test_sizes": {str(p): n for p, n in sorted(self.test_sizes.items())},
            "train_weights": {str(p): w for p, w in sorted(self.train_weights.items())},
        }
        if self.config.private:
            state["dp_releases"] = [list(r) for r in self.dp_releases]
            state["dp_local_releases"] = {str(p): n for p, n in self.dp_local_releases.items()}
        return {}, state

    def load_state_dict(self, arrays: dict[str, np.ndarray], state: dict[str, Any]) -> None:
        """Checkpoints of earlier versions lack ``trained_partitions``: the set is left as
        it is (the ServerApp rebuilds it from the kept rounds)."""
        self.sampling_rng.bit_generator.state = state["sampling_rng"]
        if "trained_partitions" in state:
            self.trained_partitions = {int(p) for p in state["trained_partitions"]}
        self.state_rounds = {int(p): int(r) for p, r in state.get("state_rounds", {}).items()}
        self.test_sizes = {int(p): int(n) for p, n in state.get("test_sizes", {}).items()}
        self.train_weights = {
            int(p): {str(k): float(v) for k, v in w.items()}
            for p, w in state.get("train_weights", {}).items()
        }
        self.dp_releases = [(int(k), int(n)) for k, n in state.get("dp_releases", [])]
        local = state.get("dp_local_releases", {})
        self.dp_local_releases = {int(p): int(n) for p, n in local.items()}

    def _messages(
        self, partitions: Iterable[int], record: RecordDict, message_type: str
    ) -> list[Message]:
        messages = []
        for pid in partitions:
            node = self.partitions.node_of(pid)
            if node is None:
                log(WARNING, "partition %d has no connected node; skipped this round", pid)
                continue
            content = self._addressed(record, pid)
            messages.append(Message(content=content, message_type=message_type, dst_node_id=node))
        return messages

    def _addressed(self, record: RecordDict, pid: int) -> RecordDict:
        """The message content for partition ``pid``: with ``state-held`` where the
        partition has said which private-state version it holds (the arrays are shared,
        not copied)."""
        held = self.state_rounds.get(pid)
        if held is None:
            return record
        content = RecordDict(dict(record.items()))
        content[CONFIG] = ConfigRecord({**record[CONFIG], STATE_HELD: held})
        return content

    # --------------------------------------------------------- the model
    def prepare_model(self, model: SplitModel) -> None:
        """Add algorithm-specific modules (under ``model.extra``) to the server's model
        before the initial arrays are taken; nothing by default."""

    def global_parts(self, model: SplitModel, arrays: Mapping[str, np.ndarray]) -> ModelParts:
        """The global model as (base, head on base features), with the aggregated arrays
        loaded into ``model``: head_g(base(x)) by default. The clients evaluate it with
        the same code (and share the base's pass with their personal model when the
        weights are the same)."""
        model.load_group_state(dict(arrays), BASE, HEAD_G)
        model.eval()
        return model.base, model.head_g

    def global_predictor(
        self, model: SplitModel, arrays: Mapping[str, np.ndarray]
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The global model's forward: its head on its base."""
        base, head = self.global_parts(model, arrays)
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
        self.last_sampled = self.sample_partitions(server_round)
        sent = self.arrays_to_send(self._current, server_round)
        config[SERVER_ROUND] = server_round
        config[STATE_KEY] = self.state_key
        record = RecordDict({ARRAYS: to_record(sent), CONFIG: config})
        if self.config.dp_mode == "local":  # each client needs its whole update's reference
            reference = self.expected_reply_arrays(server_round)
            record[DP_REFERENCE] = to_record({k: v for k, v in reference.items() if k not in sent})
        messages = self._messages(self.last_sampled, record, MessageType.TRAIN)
        if self.config.dp_mode == "local":  # counted as sent: a reply is a release
            for msg in messages:
                pid = self.partitions.partition_of(msg.metadata.dst_node_id)
                self.dp_local_releases[pid] = self.dp_local_releases.get(pid, 0) + 1
        return messages

    def expected_reply_arrays(
        self, server_round: int, current: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """The arrays (names, shapes, dtypes) a training reply must carry: the global
        model's entries of the aggregated groups. ``current`` (default: this round's
        global model) lets a client name them before it trains (local DP's reference)."""
        current = self._current if current is None else current
        return {k: v for k, v in current.items() if group_of(k) in self.group_weights}

    def train_reply_problem(self, msg: Message, partition_id: int, server_round: int) -> str:
        """Why a training reply cannot be aggregated ("" if it can): it must carry exactly
        the expected arrays, all finite, and sound sample counts from the partition the
        message went to. A reply is data from the wire; none is trusted."""
        if ARRAYS not in msg.content.array_records or METRICS not in msg.content.metric_records:
            return "reply lacks its arrays or metrics"
        if problem := self.data_problem(msg, partition_id):
            return problem
        metrics = msg.content[METRICS]
        problem = reply_metrics_problem(
            metrics,
            partition_id,
            (NUM_PROCESSED, *set(self.group_weights.values())),
            whole=(NUM_PROCESSED,),
        ) or self.trained_params_problem(metrics)
        if problem:
            return problem
        keys = sorted(set(self.group_weights.values()))
        declared = self.population_weights.get(partition_id)
        if declared is not None:  # central DP: the weights the denominators were built on
            for key in keys:
                if metrics[key] != declared.get(key):
                    return f"metric {key}={metrics[key]!r}, declared {declared.get(key)!r}"
        problem = self.weights_problem(partition_id, metrics)
        if problem:
            return problem
        earlier = self.train_weights.get(partition_id, {})
        for key in keys:
            if key in earlier and metrics[key] != earlier[key]:
                return (
                    f"metric {key}={metrics[key]!r}, but partition {partition_id} said "
                    f"{earlier[key]!r} before (a partition's data is fixed for a run)"
                )
        problem = arrays_problem(from_record(msg.content[ARRAYS]),
                                 self.expected_reply_arrays(server_round))  # fmt: skip
        if not problem:
            self.train_weights.setdefault(partition_id, {}).update(
                {key: float(metrics[key]) for key in keys}
            )
        return problem

    def trained_params_problem(self, metrics: Mapping[str, Any]) -> str:
        """A client trains at most its copy of the global model and private parts of the
        same shapes (FedReG's head_p, Ditto's personal model): never more than twice the
        global model's parameters. A larger count would inflate the run's cost record."""
        claimed = metrics.get(NUM_TRAINED_PARAMS)
        bound = 2 * sum(int(v.size) for v in self._current.values())
        if claimed is None or not self._current or claimed <= bound:
            return ""
        return (f"metric {NUM_TRAINED_PARAMS}={claimed!r} is above twice the global model's "
                f"parameters ({bound})")  # fmt: skip

    def data_problem(self, msg: Message, partition_id: int) -> str:
        """A reply must come from a node holding the partition's samples (``data``'s
        digest equal to the ServerApp's, where it knows it): a deployed node whose own
        copy of the dataset differs (a lossy copy, another version) would otherwise train
        on other data with the same sample counts; and, with an ``init-model``, naming
        the digest of the ServerApp's file. "" when they hold or are not known."""
        held = msg.content[DATA] if DATA in msg.content.config_records else {}
        known = self.split_digests.get(partition_id)
        said = held.get(DIGEST)
        if known is not None and said != known:
            return (f"data digest {_shown(said)}, but partition {partition_id}'s samples "
                    f"digest to {known[:12]}…: the node's dataset-path holds other data than "
                    "the ServerApp's (or its state-dir a decoded copy made otherwise)")  # fmt: skip
        said = held.get(INIT_MODEL_DIGEST)
        if self.init_model_digest is not None and said != self.init_model_digest:
            return (f"init-model digest {_shown(said)}, but the ServerApp's init-model file "
                    f"digests to {self.init_model_digest[:12]}…: the node's copy holds other "
                    "weights, from which its private parts would start")  # fmt: skip
        return ""

    def weights_problem(self, partition_id: int, metrics: Mapping[str, Any]) -> str:
        """A partition's aggregation weights against its train split, which the server
        knows (``split_sizes``): |D_k| exactly, and any other weight (FedReG's
        e_k = sum_c min(n_c, t)) at most |D_k|. "" when they hold or the split is unknown."""
        known = self.split_sizes.get(partition_id)
        if known is None:
            return ""
        for key in sorted(set(self.group_weights.values())):
            value = metrics[key]
            if key == NUM_EXAMPLES and value != known[0]:
                return (f"metric {key}={value!r}, but partition {partition_id}'s train split "
                        f"has {known[0]} samples")  # fmt: skip
            if value > known[0]:
                return (f"metric {key}={value!r} is above partition {partition_id}'s train "
                        f"split ({known[0]} samples)")  # fmt: skip
        return ""

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate replies the ServerApp has already checked (``train_reply_problem``);
        with fewer than ``min-train-replies`` of them the global model is kept. Replies
        are taken in partition order, not arrival order, so that floating-point sums do
        not depend on which client answered first."""
        valid = sorted(replies, key=lambda msg: int(msg.content[METRICS][PARTITION_ID]))
        if len(valid) < self.config.min_train_replies:
            log(
                WARNING,
                "round %d: %d training results, fewer than min-train-replies=%d; the global "
                "model is kept as it was",
                server_round,
                len(valid),
                self.config.min_train_replies,
            )
            return None, None
        updates = [(from_record(msg.content[ARRAYS]), dict(msg.content[METRICS])) for msg in valid]
        merged = {**self._current, **self.aggregate_updates(server_round, updates)}
        metrics = MetricRecord(
            {
                **cost_totals([m for _, m in updates]),
                NUM_PROCESSED: sum(int(m[NUM_PROCESSED]) for _, m in updates),
                NUM_TRAINED_PARAMS: sum(int(m.get(NUM_TRAINED_PARAMS, 0)) for _, m in updates),
                "num-results": len(valid),
            }
        )
        return to_record(merged), metrics

    def aggregate_updates(self, server_round: int, updates: list[Update]) -> dict[str, np.ndarray]:
        """New values of the aggregated groups; override for non-averaging servers. Under
        central DP: the fixed-denominator noisy average of the clipped updates."""
        if self.config.dp_mode != "central":
            return weighted_average_by_group(updates, self.group_weights)
        scales, denominators = self.dp_round_denominators()
        released = central_release(
            self._current, updates, self.group_weights, scales, denominators,
            noise_std(self.config), self.config.dp_clip,
            noise_generator(self.config, "dp-noise", server_round),
        )  # fmt: skip
        sampled_from = max(len(self.partitions.available()), len(self.last_sampled))
        self.dp_releases.append((len(self.last_sampled), sampled_from))
        return released

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
        if self.global_on_clients:  # the rest of the global model, for its evaluation
            rest = {k: v for k, v in everything.items() if k not in sent}
            record[GLOBAL_ARRAYS] = to_record(rest)
        return self._messages(self.partitions.available(), record, MessageType.EVALUATE)

    def eval_reply_problem(self, msg: Message, partition_id: int) -> str:
        """Why an evaluation reply cannot be counted ("" if it can): sound counts, none
        above the number of test samples."""
        if METRICS not in msg.content.metric_records:
            return "reply lacks its metrics"
        if problem := self.data_problem(msg, partition_id):
            return problem
        metrics = msg.content[METRICS]
        counted = [PERSONAL_CORRECT, *([GLOBAL_CORRECT] if self.global_on_clients else [])]
        problem = reply_metrics_problem(
            metrics, partition_id, (NUM_TEST, *counted), whole=(NUM_TEST, *counted)
        ) or self.trained_params_problem(metrics)
        if problem:
            return problem
        total = metrics[NUM_TEST]
        for key in counted:
            if metrics[key] > total or total < 1:
                return f"{key}={metrics[key]} of {NUM_TEST}={total}"
        split = self.split_sizes.get(partition_id)
        if split is not None and total != split[1]:
            return f"{NUM_TEST}={total}, but partition {partition_id}'s test split has {split[1]}"
        known = self.test_sizes.get(partition_id)
        if known is not None and total != known:
            return (
                f"{NUM_TEST}={total}, but partition {partition_id} said {known} before "
                "(a partition's test split is fixed for a run)"
            )
        return ""

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
        self.test_sizes.update((int(r[PARTITION_ID]), int(r[NUM_TEST])) for r in results)
        summary = {
            **personal_metrics(results),
            **sampled_personal_metrics(results, self.trained_partitions),
            **cost_totals(results),
        }
        if self.global_on_clients:
            correct = sum(int(r[GLOBAL_CORRECT]) for r in results)
            summary["global-accuracy"] = correct / summary["num-test"]
        return MetricRecord(summary)

    @property
    def global_evaluation(self) -> str:
        """Who evaluates the global model: "clients", "server" (the ServerApp, on its copy
        of the union test set) or "none" (the algorithm has no global model)."""
        if not self.has_global_model:
            return "none"
        return "clients" if self.global_on_clients else "server"

    def server_splits(self) -> tuple[str, ...]:
        """The unions of the clients' splits the ServerApp needs decoded ("train",
        "test"): it decodes them in the pass that digests the partitions."""
        return ("test",) if self.global_evaluation == "server" else ()

    def keep_server_splits(self, unions: dict[str, TensorData]) -> None:
        """Keeps what :meth:`server_splits` asked for beyond the global test set (which
        the ServerApp holds itself)."""

    def known_test_samples(self) -> int | None:
        """The size of the union test set, once every partition's split size is known."""
        if len(self.test_sizes) < self.num_partitions:
            return None
        return sum(self.test_sizes.values())

    def summary(self) -> None:
        log(INFO, "\t├──> %s: %s", type(self).__name__, dict(self.group_weights))
        log(
            INFO,
            "\t└──> fraction-train %.3f, seed %d",
            self.config.fraction_train,
            self.config.seed,
        )


def reply_metrics_problem(
    metrics: Mapping[str, Any], partition_id: int, counts: Iterable[str],
    whole: Iterable[str] = (),
) -> str:  # fmt: skip
    """The reply must come from the partition the message was sent to, its counts must
    be finite numbers >= 0, and so must the costs it may add (:data:`COST_SECONDS`;
    :data:`COST_COUNTS` whole), which the server sums into the round's record; the keys
    of ``whole`` must be whole numbers too (counts of samples)."""
    if metrics.get(PARTITION_ID) != partition_id:
        return f"{PARTITION_ID}={metrics.get(PARTITION_ID)!r}, sent to partition {partition_id}"
    present = [key for key in (*COST_SECONDS, *COST_COUNTS) if key in metrics]
    whole = {*whole, *COST_COUNTS}
    for key in (*counts, *present):
        value = metrics.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"metric {key}={value!r} is missing or not a number"
        if not math.isfinite(value) or value < 0:
            return f"metric {key}={value!r} is not a finite number >= 0"
        if key in whole and not float(value).is_integer():
            return f"metric {key}={value!r} is not a whole count"
    held = metrics.get(STATE_ROUND)
    if held is not None and (isinstance(held, bool) or not is_whole(held)):
        return f"metric {STATE_ROUND}={held!r} is not a round (a whole number >= 0)"
    return ""


def _shown(said: object) -> str:
    """A digest from the wire, shortened for an error message (any type: not trusted)."""
    return f"{said[:12]}…" if isinstance(said, str) else repr(said)[:40]


def arrays_problem(arrays: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]) -> str:
    """Exactly the expected names, each with the expected shape and dtype, all finite."""
    if set(arrays) != set(expected):
        missing = sorted(set(expected) - set(arrays))[:3]
        unexpected = sorted(set(arrays) - set(expected))[:3]
        return f"arrays differ from those expected: missing {missing}, unexpected {unexpected}"
    for key, value in arrays.items():
        want = expected[key]
        if value.shape != want.shape or value.dtype != want.dtype:
            return (
                f"array {key!r} is {value.dtype}{list(value.shape)}, "
                f"expected {want.dtype}{list(want.shape)}"
            )
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            return f"array {key!r} holds NaN or infinite values"
    return ""


def personal_metrics(results: list[dict[str, float]]) -> dict[str, float | list[float]]:
    """Sum of correct over sum of test samples (thesis 5.3), plus the per-client spread."""
    total = sum(int(r[NUM_TEST]) for r in results)
    per_client = [int(r[PERSONAL_CORRECT]) / max(1, int(r[NUM_TEST])) for r in results]
    return {
        "personal-accuracy": sum(int(r[PERSONAL_CORRECT]) for r in results) / total,
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
        "personal-accuracy-sampled": sum(int(r[PERSONAL_CORRECT]) for r in chosen) / total,
        "sampled-clients-evaluated": len(chosen),
    }


def cost_totals(results: list[Mapping[str, float]]) -> dict[str, float]:
    """Client seconds summed over the replies (the work the round bought)."""
    return {
        key: float(sum(float(r.get(key, 0.0)) for r in results))
        for key in (COMPUTE_SECONDS, HANDLER_SECONDS)
    }
