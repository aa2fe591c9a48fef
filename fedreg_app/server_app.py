"""The ServerApp: validates the run config, maps nodes to partitions, drives the rounds
through the algorithm's strategy and writes results after every round.

The round loop mirrors Flower's ``Strategy.start`` (configure/aggregate train, then
evaluate) and adds what this project needs: seeded sampling over partitions, evaluation
every ``eval-every`` rounds on all clients (the global model too, each client on its test
split, or the ServerApp on the union of the splits), per-round timings, a check of every
reply before it counts, and results that survive an interrupted run and say truthfully
how it went (``completed``, ``degraded``, ``failed``).
"""

from __future__ import annotations

import json
import os
import re
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from fedreg_app.core.checkpoint import Checkpoint, clients_record, committed_round
from fedreg_app.core.config import ConfigError, RunConfig, is_count, refuse_relative_paths
from fedreg_app.core.data import (
    PartitionKey,
    TensorData,
    data_digest,
    digests_and_unions,
    federated_dataset,
    load_info,
    split_sizes,
)
from fedreg_app.core.environment import describe_environment
from fedreg_app.core.figures import client_figures
from fedreg_app.core.metrics import (
    ENDED_AFTER_ROUND,
    INIT_MODEL_SHA256,
    ResultsWriter,
    RoundRecord,
    client_error,
    mark_stopped,
)
from fedreg_app.core.models import BASE, EXTRA, HEAD_G, SplitModel, initial_model
from fedreg_app.core.partition_map import PartitionMap
from fedreg_app.core.persist import (
    RUN_FOLDER_LOCK,
    check_results_dir,
    file_sha256,
    hold_folder,
    release_folder,
    remove_leftover_temporaries,
)
from fedreg_app.core.privacy import require_accounting
from fedreg_app.core.protocol import (
    COMPUTE_SECONDS,
    COST_SECONDS,
    HANDLER_SECONDS,
    METRICS,
    NUM_PROCESSED,
    NUM_TRAINED_PARAMS,
    PARTITION_ID,
    PERSONAL_GLOBAL_WEIGHT,
    SETUP_SECONDS,
    STATE_RESETS,
    STATE_SECONDS,
)
from fedreg_app.core.records import from_record, to_record
from fedreg_app.core.tensorboard_log import require_tensorboard
from fedreg_app.core.training import (
    count_correct,
    eval_batch_size,
    select_device,
    set_denormals,
)
from fedreg_app.nodes import (
    NodeFacts,
    RunFailedError,
    discover_partitions,
    exchange,
    query_weights,
    wait_for_clients,
)
from fedreg_app.registry import algorithm_of, load_config
from fedreg_app.round_report import (
    client_hosts,
    reset_records,
    round_line,
    sampled_accuracy,
    trained_in,
)
from strategies.base import PersonalizedStrategy
from strategies.privacy import DifferentialPrivacy, check_privacy_allowed
from strategies.replies import RunFacts

app = ServerApp()


def server_device(device: str, evaluation: str) -> torch.device:
    """Where the ServerApp keeps its model: on the run's ``device`` only when the ServerApp
    computes with it (it evaluates the global model itself); else on the CPU, where the
    model only holds the arrays it aggregates. A GPU run's ServerApp then opens no CUDA
    context (0.54 GiB of an H200, measured) for a model it never runs. The values are
    the same on either device: the model is initialised on the CPU and copied."""
    if evaluation == "server":
        return select_device(device)
    return torch.device("cpu")


def global_accuracy(
    strategy: PersonalizedStrategy, model: SplitModel, arrays: ArrayRecord, test_set: TensorData
) -> float:
    """The global model on the union of all client test splits."""
    predict = strategy.global_predictor(model, from_record(arrays))
    device = next(model.parameters()).device
    return count_correct(predict, test_set, device) / len(test_set)


def run_folder(results_dir: str, parts: Iterable[Any], run_id: int) -> Path:
    """``<results-dir>/<stamp>_<parts>_run<id>``; the name is also the clients' state key,
    so it keeps to letters, digits and ``._-``. Long parts are cut, never the run id that
    ends the name (the runner finds its run's folder by it)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", "_".join([stamp, *(str(p) for p in parts)]))
    return Path(results_dir or "results").expanduser().resolve() / f"{name[:160]}_run{run_id}"


def config_folder(config: RunConfig, run_id: int) -> Path:
    dataset = Path(config.dataset_path or config.dataset).name
    parts = (config.algo, dataset, f"a{config.alpha:g}", f"s{config.seed}")
    return run_folder(config.results_dir, parts, run_id)


def payload_bytes(messages: Iterable[Message]) -> int:
    """Serialized bytes of the model arrays the messages carry (the ``.npy`` payload, header
    included): the traffic that matters. Metrics and configs add a few hundred bytes per
    message and are not counted."""
    return sum(
        len(array.data)
        for msg in messages
        for record in msg.content.array_records.values()
        for array in record.values()
    )


@dataclass(frozen=True)
class Failure:
    """A message that brought nothing usable back: its node, partition and why."""

    node: int
    partition: int | None
    reason: str


@dataclass
class Phase:
    """One phase's outcome: the replies that passed the checks, the failures, the bytes
    each way (accepted replies only) and the seconds it took."""

    name: str
    sent: int = 0
    accepted: list[Message] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0
    #: Training: replies were accepted but not aggregated (fewer than min-train-replies).
    model_kept: bool = False

    def check_usable(self, server_round: int) -> None:
        """Messages went out and not one usable reply came back: stop the run (a bug or a
        broken setup, not a flaky device), naming the clients' errors."""
        if self.sent and not self.accepted:
            reasons = "; ".join(sorted({f.reason for f in self.failures}))
            raise RunFailedError(
                f"round {server_round}: none of the {self.sent} {self.name} replies was usable: "
                f"{reasons}"
            )


ReplyCheck = Callable[[Message, int], str]

#: The run folder this process holds, released when ``main`` ends however it ends.
_held: list[IO[str]] = []


def hold_run_folder(folder: Path, run_id: int) -> None:
    """Only one ServerApp writes a run folder: a second resume of a folder that another
    one is still writing (the same ``resume=`` given twice, a simulation left behind by
    a killed runner) stops here, before it reads or writes anything of the run, with a
    :class:`~fedreg_app.core.persist.FolderInUseError` naming that ServerApp."""
    _held.append(
        hold_folder(folder, RUN_FOLDER_LOCK, f"a ServerApp (PID {os.getpid()}, run {run_id})")
    )


def run_phase(
    name: str,
    grid: Grid,
    messages: Iterable[Message],
    partitions: PartitionMap,
    check: ReplyCheck,
    timeout: float = 0.0,
) -> Phase:
    """Send, wait for the replies (at most ``timeout`` seconds when > 0), and sort them:
    a reply is accepted only if Flower reports no error for it and ``check(reply,
    partition)`` finds no problem; a message without a reply is a failure too."""
    started = time.perf_counter()
    messages = list(messages)
    phase = Phase(name, sent=len(messages), bytes_sent=payload_bytes(messages))
    if not messages:
        return phase
    partition_of = {m.metadata.dst_node_id: partitions.partition_of(m.metadata.dst_node_id)
                    for m in messages}  # fmt: skip
    answered: set[int] = set()
    replies = exchange(grid, messages, timeout)
    # Pushing gives each message its id; an error the SuperLink makes for a node that
    # vanished comes from the SuperLink itself, and only its reply-to id names the node.
    node_of_message = {m.metadata.message_id: m.metadata.dst_node_id for m in messages
                       if m.metadata.message_id}  # fmt: skip
    for reply in replies:
        node = node_of_message.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
        pid = partition_of.get(node)
        if node in answered:  # one message, one reply: a second is not counted again
            problem = "a second reply to the same message (not counted)"
        elif reply.has_error():
            problem = client_error(reply.error.reason)
        elif pid is None:
            problem = "a reply from a node no message was sent to"
        else:
            problem = check(reply, pid) or seconds_problem(reply, time.perf_counter() - started)
        answered.add(node)
        if problem:
            log(WARNING, "%s: node %d (partition %s) failed: %s", name, node, pid, problem)
            phase.failures.append(Failure(node, pid, problem))
        else:
            phase.accepted.append(reply)
    for node in sorted(set(partition_of) - answered):
        phase.failures.append(
            Failure(node, partition_of[node], f"no reply within reply-timeout={timeout:g}s")
        )
    phase.bytes_received = payload_bytes(phase.accepted)
    phase.seconds = time.perf_counter() - started
    return phase


def seconds_problem(reply: Message, elapsed: float) -> str:
    """A client's seconds (``compute-seconds``, ``handler-seconds``) cannot exceed the
    time since its message was sent, give or take clocks that run at other speeds: a
    larger figure (1e308 summed over four replies is inf, which no JSON holds) would
    break the round's record."""
    if METRICS not in reply.content.metric_records:
        return ""
    metrics = reply.content[METRICS]
    bound = elapsed * 1.05 + 5.0
    for key in COST_SECONDS:
        if key in metrics and metrics[key] > bound:
            return (f"metric {key}={metrics[key]!r} is more than the {elapsed:.1f}s since the "
                    "message was sent")  # fmt: skip
    return ""


def error_summary(*phases: Phase) -> list[dict[str, Any]]:
    """One entry per distinct (phase, error): the first line and who reported it."""
    grouped: dict[tuple[str, str], list[Failure]] = {}
    for phase in phases:
        for failure in phase.failures:
            grouped.setdefault((phase.name, failure.reason), []).append(failure)
    return [
        {
            "phase": phase_name,
            "error": reason,
            "nodes": sorted(f.node for f in failures),
            "partitions": sorted(f.partition for f in failures if f.partition is not None),
        }
        for (phase_name, reason), failures in grouped.items()
    ]


def check_weights(strategy: PersonalizedStrategy, training: Phase) -> None:
    """Weights may be zero one by one but not all: then nothing can be averaged, and every
    reply of the round is counted as failed."""
    for key in set(strategy.group_weights.values()):
        if (
            training.accepted
            and sum(float(m.content[METRICS][key]) for m in training.accepted) <= 0
        ):
            training.failures += [
                Failure(
                    m.metadata.src_node_id,
                    int(m.content[METRICS][PARTITION_ID]),
                    f"aggregation weights {key} sum to zero",
                )  # fmt: skip
                for m in training.accepted
            ]
            training.accepted = []
            return


def refuse_outliers(strategy: PersonalizedStrategy, training: Phase) -> None:
    """Replies that passed every check one by one but whose update is far outside the
    round's others (``update-norm-factor``) are refused and recorded as failed."""
    outliers = strategy.norm_outliers(training.accepted)
    for index, reason in sorted(outliers.items()):
        msg = training.accepted[index]
        partition = int(msg.content[METRICS][PARTITION_ID])
        training.failures.append(Failure(msg.metadata.src_node_id, partition, reason))
    training.accepted = [m for i, m in enumerate(training.accepted) if i not in outliers]


def check_finite_aggregate(model: dict[str, np.ndarray], server_round: int, replies: int) -> None:
    """Each reply was finite, but their weighted sum (or an algorithm's correction, as
    FedDyn's ``mean - h / alpha``) can still overflow float32: such a model is never
    checkpointed nor sent; the run stops, its last checkpoint the round before."""
    bad = [key for key, value in model.items() if not np.isfinite(value).all()]
    if bad:
        raise RunFailedError(
            f"round {server_round}: the new global model aggregated from {replies} checked "
            f"replies holds NaN or infinite values in {', '.join(bad[:3])}"
            f"{' ...' if len(bad) > 3 else ''} (finite replies whose sum overflows float32); "
            "not checkpointed: the run stops after the previous round"
        )


@dataclass
class Evaluation:
    """An evaluation phase and what came of it (all None when the round had none)."""

    phase: Phase
    personal: dict[str, Any] = field(default_factory=dict)
    global_accuracy: float | None = None
    server_seconds: float = 0.0


def train_round(
    grid: Grid, config: RunConfig, strategy: PersonalizedStrategy, server_round: int,
    arrays: ArrayRecord,
) -> tuple[Phase, ArrayRecord, dict[str, Any]]:  # fmt: skip
    """Sample, send, check and aggregate one training phase."""
    started = time.perf_counter()
    messages = strategy.configure_train(server_round, arrays, ConfigRecord(), grid)
    training = run_phase(
        "train", grid, messages, strategy.partitions,
        lambda reply, pid: strategy.train_reply_problem(reply, pid, server_round),
        config.reply_timeout,
    )  # fmt: skip
    refuse_outliers(strategy, training)
    check_weights(strategy, training)
    training.check_usable(server_round)
    strategy.note_trained(int(m.content[METRICS][PARTITION_ID]) for m in training.accepted)
    strategy.note_state_versions(training.accepted, server_round)
    aggregated, metrics = strategy.aggregate_train(server_round, training.accepted)
    training.model_kept = aggregated is None and bool(training.accepted)
    if aggregated is not None:
        check_finite_aggregate(from_record(aggregated), server_round, len(training.accepted))
    training.seconds = time.perf_counter() - started
    return training, aggregated if aggregated is not None else arrays, dict(metrics or {})


def evaluate_round(
    grid: Grid, config: RunConfig, strategy: PersonalizedStrategy, server_round: int,
    arrays: ArrayRecord, model: SplitModel, test_set: TensorData | None,
) -> Evaluation:  # fmt: skip
    """Every client's personal model, and the global model, on its own test split (the
    union of the splits is the global test set); or, where the strategy says so, the
    global model on the ServerApp's own copy of the union."""
    started = time.perf_counter()
    if not config.is_eval_round(server_round):
        return Evaluation(Phase("evaluate"))
    messages = strategy.configure_evaluate(server_round, arrays, ConfigRecord(), grid)
    phase = run_phase("evaluate", grid, messages, strategy.partitions,
                      strategy.eval_reply_problem, config.reply_timeout)  # fmt: skip
    phase.check_usable(server_round)
    strategy.note_state_versions(phase.accepted, server_round)
    personal = dict(strategy.aggregate_evaluate(server_round, phase.accepted) or {})
    evaluated = time.perf_counter()
    if test_set is None:  # the clients did it
        accuracy = personal.get("global-accuracy")
    else:
        accuracy = global_accuracy(strategy, model, arrays, test_set)
    phase.seconds = time.perf_counter() - started
    return Evaluation(phase, personal, accuracy, time.perf_counter() - evaluated)


def run_rounds(
    grid: Grid,
    config: RunConfig,
    strategy: PersonalizedStrategy,
    model: SplitModel,
    test_set: TensorData | None,
    writer: ResultsWriter,
    arrays: ArrayRecord,
    first_round: int,
    clients: dict[str, Any],
) -> ArrayRecord:
    if first_round > 1 and strategy.finished(first_round - 1):  # resumed after its end
        log(INFO, "%s had ended the run after round %d", config.algo, first_round - 1)
        writer.run[ENDED_AFTER_ROUND] = first_round - 1
        return arrays
    for server_round in range(first_round, config.num_server_rounds + 1):
        wait_for_clients(grid, strategy.partitions, config.min_train_replies)
        training, arrays, train_metrics = train_round(grid, config, strategy, server_round,
                                                      arrays)  # fmt: skip
        evaluation = evaluate_round(grid, config, strategy, server_round, arrays, model, test_set)
        total = strategy.known_test_samples() if test_set is None else len(test_set)
        record = round_record(server_round, training, evaluation, train_metrics, strategy,
                              total)  # fmt: skip
        ended = strategy.finished(server_round)
        if ended:  # the record says why it holds fewer rounds than planned
            writer.run[ENDED_AFTER_ROUND] = server_round
        writer.run.update(strategy.report())
        writer.add(record)
        save_checkpoint(writer.folder, server_round, arrays, strategy, config, clients,
                        writer.seal())  # fmt: skip
        log(INFO, "%s", round_line(record, config.num_server_rounds))
        if ended:
            log(INFO, "%s ends the run after round %d", config.algo, server_round)
            break
    return arrays


def save_checkpoint(
    folder: Path,
    server_round: int,
    arrays: ArrayRecord,
    strategy: PersonalizedStrategy,
    config: RunConfig,
    clients: dict[str, Any],
    results: dict[str, Any] | None = None,
) -> None:
    """``clients``: the federation's :func:`clients_record`, kept with every checkpoint;
    ``results``: the seal of ``results.json`` as this round left it."""
    strategy_arrays, strategy_state = strategy.state_dict()
    Checkpoint(
        round=server_round,
        model=from_record(arrays),
        strategy_arrays=strategy_arrays,
        strategy_state=strategy_state,
        state_key=strategy.state_key,
        run_config=config.to_run_config(),
        clients=clients,
        results=results,
    ).save(folder)


def coverage(
    evaluation: Evaluation, num_clients: int, num_test: int | None
) -> dict[str, int | None] | None:
    """How much of the federation the personal figure covers (the held-out new clients,
    reported apart, are not of it)."""
    if not evaluation.phase.sent and not evaluation.personal:
        return None
    return {
        "clients": len(evaluation.personal.get("client-partitions", [])),
        "of_clients": num_clients,
        "test_samples": int(evaluation.personal.get("num-test", 0)),
        "of_test_samples": num_test,
    }


def round_record(
    server_round: int,
    training: Phase,
    evaluation: Evaluation,
    train_metrics: dict[str, Any],
    strategy: PersonalizedStrategy,
    num_test: int | None,
) -> RoundRecord:
    """The round's record, built once from its two phases. The personal accuracy is the
    all-client figure only when every client answered; otherwise it is null and the
    partial figure is ``personal_accuracy_answered``. The same holds for the global
    accuracy where the clients compute it."""
    personal = evaluation.personal
    covered = coverage(evaluation, strategy.num_partitions - len(strategy.held_out), num_test)
    complete = covered is not None and covered["clients"] == covered["of_clients"]
    on_clients = strategy.global_evaluation == "clients"
    client_accuracies = None
    if personal:
        partitions, accuracies = personal["client-partitions"], personal["client-accuracies"]
        client_accuracies = {str(p): a for p, a in zip(partitions, accuracies, strict=True)}
    spread = client_figures(client_accuracies.values() if complete and client_accuracies else [])
    eval_metrics = [dict(m.content[METRICS]) for m in evaluation.phase.accepted]
    train_replies = [dict(m.content[METRICS]) for m in training.accepted]
    train_seconds_by_client = {str(int(m[PARTITION_ID])):
                               round(float(m.get(HANDLER_SECONDS, 0.0)), 3)
                               for m in train_replies}  # fmt: skip

    def client_seconds(key: str) -> float:
        return round(float(train_metrics.get(key, 0.0)) + float(personal.get(key, 0.0)), 3)

    def slowest(replies: list[dict]) -> float:
        return max((float(m.get(HANDLER_SECONDS, 0.0)) for m in replies), default=0.0)

    return RoundRecord(
        round=server_round,
        global_accuracy=evaluation.global_accuracy if complete or not on_clients else None,
        global_accuracy_answered=evaluation.global_accuracy,
        personal_accuracy=personal.get("personal-accuracy") if complete else None,
        personal_accuracy_std=personal.get("personal-accuracy-std") if complete else None,
        train_seconds=round(training.seconds, 3),
        eval_seconds=round(evaluation.phase.seconds, 3),
        num_train_examples=int(train_metrics.get(NUM_PROCESSED, 0)),
        trained_parameters=int(train_metrics.get(NUM_TRAINED_PARAMS, 0)),
        bytes_to_clients=training.bytes_sent + evaluation.phase.bytes_sent,
        bytes_from_clients=training.bytes_received + evaluation.phase.bytes_received,
        train_bytes_to_clients=training.bytes_sent,
        train_bytes_from_clients=training.bytes_received,
        client_compute_seconds=client_seconds(COMPUTE_SECONDS),
        client_handler_seconds=client_seconds(HANDLER_SECONDS),
        client_setup_seconds=client_seconds(SETUP_SECONDS),
        client_state_seconds=client_seconds(STATE_SECONDS),
        eval_compute_seconds=round(float(personal.get(COMPUTE_SECONDS, 0.0)), 3),
        slowest_handlers_seconds=round(slowest(train_replies) + slowest(eval_metrics), 3),
        server_eval_seconds=round(evaluation.server_seconds, 3),
        client_train_seconds=train_seconds_by_client or None,
        sampled_clients=list(strategy.last_sampled),
        client_accuracies=client_accuracies,
        **spread,
        new_clients=int(personal.get("new-clients", 0)),
        new_client_personal_accuracy=personal.get("new-client-personal-accuracy"),
        new_client_global_accuracy=personal.get("new-client-global-accuracy"),
        personal_global_weight=personal.get(PERSONAL_GLOBAL_WEIGHT),
        personal_accuracy_honest=personal.get("personal-accuracy-honest") if complete else None,
        train_replies=len(training.accepted),
        train_failures=len(training.failures),
        eval_replies=len(evaluation.phase.accepted),
        eval_failures=len(evaluation.phase.failures),
        errors=error_summary(training, evaluation.phase),
        personal_accuracy_answered=personal.get("personal-accuracy"),
        personal_coverage=covered,
        personal_accuracy_sampled=sampled_accuracy(personal, strategy.trained_partitions),
        clients_trained=len(strategy.trained_partitions),
        dp_epsilon=(
            strategy.privacy_epsilon() if isinstance(strategy, DifferentialPrivacy) else None
        ),  # fmt: skip
        client_hosts=client_hosts(training.accepted),
        state_resets=sum(int(m.get(STATE_RESETS, 0)) for m in train_replies + eval_metrics),
        state_reset_records=reset_records(training.accepted + evaluation.phase.accepted),
        update_norm_ratio_max=dict(strategy.norm_ratio_max),
        update_trust=dict(strategy.update_trust),
        global_model_kept=training.model_kept and strategy.has_global_model,
    )


def describe_error(error: BaseException) -> str:
    """The error for ``run.error``: its type and message (and where, for a bug)."""
    if isinstance(error, ConfigError | RunFailedError | TimeoutError):
        return f"{type(error).__name__}: {error}"
    where = traceback.extract_tb(error.__traceback__)[-1:] if error.__traceback__ else []
    place = f" (at {where[0].filename}:{where[0].lineno})" if where else ""
    return f"{type(error).__name__}: {error}{place}"


def failed_before_start(context: Context, error: BaseException) -> Path:
    """A run that fails before its results folder exists (bad config, missing or corrupt
    dataset, no clients) still leaves a ``results.json`` saying so."""
    raw = dict(context.run_config)
    parts = (raw.get("algo", "run"), "failed")
    folder = run_folder(str(raw.get("results-dir", "results")), parts, context.run_id)
    writer = ResultsWriter(folder, raw, {"run_id": context.run_id, "algo": raw.get("algo")})
    writer.finish(error=describe_error(error))
    return writer.json_path


@dataclass
class RunSetup:
    """Everything the round loop needs, made once at the start (or resume) of a run."""

    config: RunConfig
    strategy: PersonalizedStrategy
    model: SplitModel
    test_set: TensorData | None  # only where the ServerApp evaluates the global model
    writer: ResultsWriter
    arrays: ArrayRecord
    first_round: int
    clients: dict[str, Any]  # what each checkpoint records of the federation


def check_federation(
    config: RunConfig, strategy: type[PersonalizedStrategy], facts: dict[int, NodeFacts],
    num_partitions: int, keeps_client_state: bool,
) -> None:  # fmt: skip
    """Settings that can only be checked once the clients are known, before any work."""
    per_round = strategy.clients_per_round(config, num_partitions)
    if config.min_train_replies > per_round:
        raise ConfigError(
            f"min-train-replies={config.min_train_replies} is not allowed: expected at most "
            f"{per_round}, the clients sampled per round ({num_partitions} clients x "
            f"fraction-train={config.fraction_train:g})"
        )
    without_disk = sorted(f.partition_id for f in facts.values() if not f.state_on_disk)
    if config.resume and keeps_client_state and without_disk:
        raise ConfigError(
            f"resume={config.resume!r} with algo={config.algo!r} needs every client's private "
            f"state on disk, but partitions {without_disk[:10]} have no state-dir: set the "
            "run config's state-dir (simulation) or each SuperNode's --node-config state-dir"
        )


def start_run(grid: Grid, context: Context) -> RunSetup:
    """Validate, find the clients, load the data and the model, or the checkpoint; then
    build the strategy with what is known of the run (its :class:`RunFacts`)."""
    refuse_relative_paths(context.run_config)  # read here, they would name another folder
    config = load_config(context.run_config)  # fails fast on bad input
    set_denormals(config.flush_denormals)  # the server's own evaluation and training
    if not config.resume:
        check_results_dir(config.results_dir)
    eval_batch_size(torch.device("cpu"))  # fails fast on a bad FEDREG_EVAL_BATCH
    if config.tensorboard:
        require_tensorboard()
    if config.private:
        require_accounting()
    algorithm = algorithm_of(config)
    algorithm.strategy.check_config(config)
    check_privacy_allowed(config, algorithm.strategy)
    evaluation = algorithm.strategy.evaluation_of(config)
    checkpoint, resumed_folder = None, None
    if config.resume:
        checkpoint, resumed_folder = Checkpoint.load(Path(config.resume))
        hold_run_folder(resumed_folder, context.run_id)
        for leftover in remove_leftover_temporaries(resumed_folder):
            log(INFO, "removed %s, a write its killed process never finished", leftover)
        checkpoint.check_compatible(config, algorithm.resume_fixed)
        if algorithm.client.keeps_state(config):
            check_state_key(checkpoint.state_key, resumed_folder)
    partitions, node_facts = discover_partitions(grid)
    if checkpoint is not None:  # first of all: as many clients as the checkpoint's run
        checkpoint.clients = checkpoint.clients or recorded_clients(resumed_folder)
        checkpoint.check_clients(partitions.num_partitions)
    check_federation(config, algorithm.strategy, node_facts, partitions.num_partitions,
                     algorithm.client.keeps_state(config))  # fmt: skip
    key = PartitionKey.from_config(config, partitions.num_partitions)
    info = load_info(key)
    sizes = split_sizes(key)  # one partitioning, references' too
    if checkpoint is not None:  # before any training (and any decoding): the same sizes
        checkpoint.check_clients(partitions.num_partitions, sizes)
    digests, unions = digests_and_unions(key, algorithm.strategy.server_splits(config))
    # every node's copy of init-model must be this file (its replies name theirs)
    init_digest = file_sha256(Path(config.init_model).expanduser()) if config.init_model else None
    if checkpoint is not None:  # and the same samples
        checkpoint.check_clients(partitions.num_partitions, sizes, digests)
    folder = None if checkpoint is not None else config_folder(config, context.run_id)
    state_key = checkpoint.state_key if checkpoint is not None else folder.name
    strategy = algorithm.strategy(config, RunFacts(sizes, digests, init_digest, state_key))
    if checkpoint is not None and not checkpoint.compares_digests:
        digests = {}  # its first rounds' data were not digested (an earlier version's run)
    strategy.set_partitions(partitions)
    strategy.keep_server_splits(unions)
    if config.private:  # central DP: every partition's declared weights, checked
        weights = query_weights(grid, partitions, strategy) if config.dp_mode == "central" else {}
        strategy = DifferentialPrivacy(strategy, weights)
    test_set = unions.get("test")  # only where the ServerApp evaluates the global model
    federated_dataset.cache_clear()  # the ServerApp needs no more of the dataset than this
    model = initial_model(info, config).to(server_device(config.device, evaluation))
    strategy.prepare_model(model)
    run_info = {
        "run_id": context.run_id,
        "algo": config.algo,
        "num_clients": partitions.num_partitions,
        "num_classes": info.num_classes,
        "image_shape": [info.channels, info.height, info.width],
        "global_evaluation": evaluation,
        "environment": describe_environment(),  # the simulation's clients share it
        **({"data_digest": data_digest(digests)} if digests else {}),
        **({INIT_MODEL_SHA256: init_digest} if config.init_model else {}),
    }
    if checkpoint is None:
        writer = ResultsWriter(folder, config.to_run_config(), run_info,
                               tensorboard=config.tensorboard)  # fmt: skip
        hold_run_folder(writer.folder, context.run_id)
        arrays, first_round = to_record(model.group_state(BASE, HEAD_G, EXTRA)), 1
    else:
        writer = ResultsWriter.resume(resumed_folder, config.to_run_config(), run_info,
                                      checkpoint.round, config.tensorboard,
                                      checkpoint.results)  # fmt: skip
        strategy.load_state_dict(checkpoint.strategy_arrays, checkpoint.strategy_state)
        if "trained_partitions" not in checkpoint.strategy_state:  # an earlier version's
            strategy.note_trained(trained_in(writer.rounds))
        arrays, first_round = to_record(checkpoint.model), checkpoint.round + 1
        log(INFO, "resuming %s after round %d", writer.folder, checkpoint.round)
    log(INFO, "%s on %d clients; results in %s", config.algo, partitions.num_partitions,
        writer.folder)  # fmt: skip
    strategy.summary()
    clients = clients_record(partitions.num_partitions, sizes, digests)
    return RunSetup(config, strategy, model, test_set, writer, arrays, first_round, clients)


def recorded_clients(run_folder: Path) -> dict[str, Any] | None:
    """The client count a run folder's results.json records, for a checkpoint of an
    earlier version, which kept none (None when it cannot be read: ``ResultsWriter.resume``
    then says why)."""
    try:
        number = json.loads((run_folder / "results.json").read_text())["run"]["num_clients"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return clients_record(number, {}) if is_count(number) else None


def check_state_key(state_key: str, run_folder: Path) -> None:
    """A run folder's clients keep their private state under its name (the state key):
    a copy of the folder resumed under another name would share, and overwrite, the
    original's client state, and one of the two would then start its clients afresh."""
    if state_key != run_folder.name:
        raise ConfigError(
            f"resume={str(run_folder)!r}: its checkpoint belongs to the run folder "
            f"{state_key!r} (its clients' state is kept under that name); a copy or a "
            "renamed folder cannot be resumed: resume the original folder, or start anew"
        )


@app.main()
def main(grid: Grid, context: Context) -> None:
    try:
        run(grid, context)
    finally:
        while _held:
            release_folder(_held.pop())


def run(grid: Grid, context: Context) -> None:
    """Start or resume the run, train its rounds, write its final status."""
    writer: ResultsWriter | None = None
    try:
        setup = start_run(grid, context)
        writer = setup.writer
        run_rounds(grid, setup.config, setup.strategy, setup.model, setup.test_set, writer,
                   setup.arrays, setup.first_round, setup.clients)  # fmt: skip
    except BaseException as error:
        message = describe_error(error)
        if writer is None:
            path = failed_before_start(context, error)
        elif isinstance(error, KeyboardInterrupt | SystemExit):  # stopped, not failed
            after = committed_round(writer.folder)
            mark_stopped(writer.folder, f"the ServerApp was stopped ({message})", after)
            log(WARNING, "run stopped after round %d: %s (resumable)", after, message)
            raise
        else:
            writer.finish(error=message)
            path = writer.json_path
        log(ERROR, "run failed: %s (written to %s)", message, path)
        raise
    status = writer.finish()
    summary = writer.summary()
    best_g, best_p = (summary[f"best_{kind}_accuracy"] for kind in ("global", "personal"))
    log(INFO, "run %s | best global %s | best personal %s | %s", status,
        "–" if best_g is None else f"{best_g:.4f}", "–" if best_p is None else f"{best_p:.4f}",
        writer.json_path)  # fmt: skip
