"""Checks of the clients' replies, apart from aggregation (as Flower keeps such helpers in
``strategy_utils``): a reply is data from the wire and none is trusted.

Each check returns why a reply cannot be used, or "" when it can. What the checks know of
the run arrives once, as :class:`RunFacts`, when the strategy is built; what they learn
from the replies (each partition's aggregation weights and test-split size) is kept in
:class:`ReplyLedger`, which the strategy checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Message

from fedreg_app.core.config import is_whole
from fedreg_app.core.protocol import (
    ARRAYS,
    COST_COUNTS,
    COST_SECONDS,
    DATA,
    DIGEST,
    INIT_MODEL_DIGEST,
    METRICS,
    NUM_EXAMPLES,
    NUM_PROCESSED,
    NUM_TEST,
    NUM_TRAINED_PARAMS,
    PARTITION_ID,
    PERSONAL_GLOBAL_WEIGHT,
    STATE_ROUND,
)


@dataclass(frozen=True)
class RunFacts:
    """What the ServerApp knows of a run before its first round, handed to the strategy
    as one value when it is built.

    ``split_sizes`` and ``split_digests`` are each partition's (train, test) sizes and
    content digest, from the seeded partitioning every node repeats to find its data: a
    reply's claims are checked against them (a first claim of 10^12 samples would
    dominate the average; a node holding other samples would train on other data with
    the same counts). ``init_model_digest`` is the sha256 of the ServerApp's
    ``init-model`` file (None without one), whose weights the nodes' private parts start
    from; ``state_key`` names the clients' on-disk state for this run."""

    split_sizes: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    split_digests: Mapping[int, str] = field(default_factory=dict)
    init_model_digest: str | None = None
    state_key: str = ""


@dataclass
class ReplyLedger:
    """What accepted replies said, which later replies must repeat (a partition's data is
    fixed for a run, so a client cannot grow its share of the average or its test split)."""

    #: Each partition's aggregation weights, as its first accepted training reply gave them.
    train_weights: dict[int, dict[str, float]] = field(default_factory=dict)
    #: Each partition's test-split size, as its evaluation replies gave it.
    test_sizes: dict[int, int] = field(default_factory=dict)
    #: Per group, the median update norm of the last round's accepted replies: the
    #: reference of ``update-norm-factor`` for a round with a single reply.
    norm_medians: dict[str, float] = field(default_factory=dict)

    def state(self) -> dict[str, Any]:
        return {
            "test_sizes": {str(p): n for p, n in sorted(self.test_sizes.items())},
            "train_weights": {str(p): w for p, w in sorted(self.train_weights.items())},
            "update_norm_medians": dict(sorted(self.norm_medians.items())),
        }

    def load(self, state: Mapping[str, Any]) -> None:
        self.test_sizes = {int(p): int(n) for p, n in state.get("test_sizes", {}).items()}
        self.train_weights = {
            int(p): {str(k): float(v) for k, v in w.items()}
            for p, w in state.get("train_weights", {}).items()
        }
        self.norm_medians = {
            str(g): float(v) for g, v in state.get("update_norm_medians", {}).items()
        }


def train_reply_problem(
    msg: Message,
    partition_id: int,
    facts: RunFacts,
    ledger: ReplyLedger,
    weight_keys: Iterable[str],
    expected: Mapping[str, np.ndarray],
    model_size: int,
    arrays_of: Callable[[Message], Mapping[str, np.ndarray]],
) -> str:
    """Why a training reply cannot be aggregated ("" if it can): it must carry exactly
    the ``expected`` arrays, all finite, and sound sample counts (the metrics
    ``weight_keys`` that weight its groups) from the partition the message went to. An
    accepted reply's weights go into the ledger. ``arrays_of`` decodes the reply's
    arrays (the strategy's, which keeps them for the round's bound and aggregation)."""
    if ARRAYS not in msg.content.array_records or METRICS not in msg.content.metric_records:
        return "reply lacks its arrays or metrics"
    if problem := data_problem(msg, partition_id, facts):
        return problem
    metrics = msg.content[METRICS]
    keys = sorted(set(weight_keys))
    problem = reply_metrics_problem(
        metrics, partition_id, (NUM_PROCESSED, *keys), whole=(NUM_PROCESSED,)
    ) or trained_params_problem(metrics, model_size)
    if problem:
        return problem
    if problem := weights_problem(partition_id, metrics, keys, facts):
        return problem
    earlier = ledger.train_weights.get(partition_id, {})
    for key in keys:
        if key in earlier and metrics[key] != earlier[key]:
            return (
                f"metric {key}={metrics[key]!r}, but partition {partition_id} said "
                f"{earlier[key]!r} before (a partition's data is fixed for a run)"
            )
    problem = arrays_problem(arrays_of(msg), expected)
    if not problem:
        ledger.train_weights.setdefault(partition_id, {}).update(
            {key: float(metrics[key]) for key in keys}
        )
    return problem


def eval_reply_problem(
    msg: Message,
    partition_id: int,
    facts: RunFacts,
    ledger: ReplyLedger,
    counted: Iterable[str],
    model_size: int,
) -> str:
    """Why an evaluation reply cannot be counted ("" if it can): sound counts of correct
    predictions (the metrics ``counted``), none above the number of test samples, which
    is the partition's test split."""
    if METRICS not in msg.content.metric_records:
        return "reply lacks its metrics"
    if problem := data_problem(msg, partition_id, facts):
        return problem
    metrics = msg.content[METRICS]
    counted = list(counted)
    problem = reply_metrics_problem(
        metrics, partition_id, (NUM_TEST, *counted), whole=(NUM_TEST, *counted)
    ) or trained_params_problem(metrics, model_size)
    if problem:
        return problem
    total = metrics[NUM_TEST]
    for key in counted:
        if metrics[key] > total or total < 1:
            return f"{key}={metrics[key]} of {NUM_TEST}={total}"
    split = facts.split_sizes.get(partition_id)
    if split is not None and total != split[1]:
        return f"{NUM_TEST}={total}, but partition {partition_id}'s test split has {split[1]}"
    known = ledger.test_sizes.get(partition_id)
    if known is not None and total != known:
        return (
            f"{NUM_TEST}={total}, but partition {partition_id} said {known} before "
            "(a partition's test split is fixed for a run)"
        )
    return ""


def trained_params_problem(metrics: Mapping[str, Any], model_size: int) -> str:
    """A client trains at most its copy of the global model (``model_size`` parameters)
    and private parts of the same shapes (FedReG's head_p, Ditto's personal model):
    never more than twice the global model's parameters. A larger count would inflate
    the run's cost record."""
    claimed = metrics.get(NUM_TRAINED_PARAMS)
    bound = 2 * model_size
    if claimed is None or not model_size or claimed <= bound:
        return ""
    return (f"metric {NUM_TRAINED_PARAMS}={claimed!r} is above twice the global model's "
            f"parameters ({bound})")  # fmt: skip


def data_problem(msg: Message, partition_id: int, facts: RunFacts) -> str:
    """A reply must come from a node holding the partition's samples (``data``'s digest
    equal to the ServerApp's, where it knows it): a deployed node whose own copy of the
    dataset differs (a lossy copy, another version) would otherwise train on other data
    with the same sample counts; and, with an ``init-model``, naming the digest of the
    ServerApp's file. "" when they hold or are not known."""
    held = msg.content[DATA] if DATA in msg.content.config_records else {}
    known = facts.split_digests.get(partition_id)
    said = held.get(DIGEST)
    if known is not None and said != known:
        return (f"data digest {_shown(said)}, but partition {partition_id}'s samples "
                f"digest to {known[:12]}…: the node's dataset-path holds other data than "
                "the ServerApp's (or its state-dir a decoded copy made otherwise)")  # fmt: skip
    said = held.get(INIT_MODEL_DIGEST)
    if facts.init_model_digest is not None and said != facts.init_model_digest:
        return (f"init-model digest {_shown(said)}, but the ServerApp's init-model file "
                f"digests to {facts.init_model_digest[:12]}…: the node's copy holds other "
                "weights, from which its private parts would start")  # fmt: skip
    return ""


def weights_problem(
    partition_id: int, metrics: Mapping[str, Any], weight_keys: Iterable[str], facts: RunFacts
) -> str:
    """A partition's aggregation weights against its train split, which the server knows
    (``split_sizes``): |D_k| exactly, and any other weight (FedReG's
    e_k = sum_c min(n_c, t)) at most |D_k|. "" when they hold or the split is unknown."""
    known = facts.split_sizes.get(partition_id)
    if known is None:
        return ""
    for key in sorted(set(weight_keys)):
        value = metrics[key]
        if key == NUM_EXAMPLES and value != known[0]:
            return (f"metric {key}={value!r}, but partition {partition_id}'s train split "
                    f"has {known[0]} samples")  # fmt: skip
        if value > known[0]:
            return (f"metric {key}={value!r} is above partition {partition_id}'s train "
                    f"split ({known[0]} samples)")  # fmt: skip
    return ""


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
    optional = (*COST_SECONDS, *COST_COUNTS, PERSONAL_GLOBAL_WEIGHT)
    present = [key for key in optional if key in metrics]
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
