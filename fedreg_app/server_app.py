"""The ServerApp: validates the run config, maps nodes to partitions, drives the rounds
through the algorithm's strategy and writes results after every round.

The round loop mirrors Flower's ``Strategy.start`` (configure/aggregate train, then
evaluate) and adds what this project needs: seeded sampling over partitions, evaluation
every ``eval-every`` rounds on all clients, server-side global accuracy on the union test
set, per-round timings and results that survive an interrupted run.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path

from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    RecordDict,
)
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from clients.base import (
    COMPUTE_SECONDS,
    HANDLER_SECONDS,
    NUM_PROCESSED,
    NUM_TRAINED_PARAMS,
    PARTITION_ID,
)
from fedreg_app.checkpoint import Checkpoint
from fedreg_app.client_app import NUM_PARTITIONS
from fedreg_app.config import ConfigError, RunConfig
from fedreg_app.data import PartitionKey, TensorData, load_info, load_union_test_set
from fedreg_app.metrics import ResultsWriter, RoundRecord
from fedreg_app.models import BASE, EXTRA, HEAD_G, SplitModel, initial_model
from fedreg_app.records import from_record, to_record
from fedreg_app.registry import get_algorithm
from fedreg_app.training import count_correct, select_device
from strategies.base import METRICS, PersonalizedStrategy

DISCOVERY_TIMEOUT_S = 600.0

app = ServerApp()


def query_nodes(grid: Grid, nodes: list[int]) -> dict[int, tuple[int, int]]:
    """Ask nodes which partition they serve: {node id: (partition id, num-partitions)}.
    A node that fails to answer is left out (it may have just gone away)."""
    if not nodes:
        return {}
    queries = [Message(RecordDict(), message_type=MessageType.QUERY, dst_node_id=n) for n in nodes]
    answers = {}
    for reply in grid.send_and_receive(queries, timeout=60):
        if reply.has_error():
            log(
                WARNING,
                "node %d did not answer: %s",
                reply.metadata.src_node_id,
                reply.error.reason,
            )
            continue
        metrics = reply.content[METRICS]
        answers[reply.metadata.src_node_id] = (
            int(metrics[PARTITION_ID]),
            int(metrics[NUM_PARTITIONS]),
        )
    return answers


def discover_partitions(
    grid: Grid, timeout: float = DISCOVERY_TIMEOUT_S
) -> tuple[dict[int, int], int]:
    """Ask every connected node which partition it serves; wait until all partitions
    have a node. Returns ({partition id: node id}, number of partitions)."""
    partition_nodes: dict[int, int] = {}
    asked: set[int] = set()
    num_partitions = 0
    deadline = time.monotonic() + timeout
    while True:
        new_nodes = [n for n in grid.get_node_ids() if n not in asked]
        for node, (pid, count) in query_nodes(grid, new_nodes).items():
            if num_partitions and count != num_partitions:
                raise ConfigError(f"nodes disagree on num-partitions: {num_partitions} and {count}")
            num_partitions = count
            partition_nodes[pid] = node
            asked.add(node)
        if num_partitions and len(partition_nodes) >= num_partitions:
            return partition_nodes, num_partitions
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"only partitions {sorted(partition_nodes)} of {num_partitions} have a node"
            )
        time.sleep(1.0)


def refresh_partitions(grid: Grid, strategy: PersonalizedStrategy) -> None:
    """Before a round: forget partitions whose node is gone, and map partitions of nodes
    that (re)connected, so that sampling skips devices that dropped out and uses a device
    again when it comes back (with a new node id)."""
    live = set(grid.get_node_ids())
    for pid, node in list(strategy.partition_nodes.items()):
        if node not in live:
            log(WARNING, "partition %d: node %d is gone; skipped until it returns", pid, node)
            strategy.forget_partition(pid)
    known = set(strategy.partition_nodes.values()) | strategy.retired_nodes
    for node, (pid, count) in query_nodes(grid, sorted(live - known)).items():
        if count != strategy.num_partitions:
            log(WARNING, "node %d serves 1 of %d partitions, not of %d; ignored", node, count,
                strategy.num_partitions)  # fmt: skip
            strategy.retired_nodes.add(node)
            continue
        previous = strategy.partition_nodes.get(pid)
        if previous is not None:  # a device restarted before its old id expired
            log(WARNING, "partition %d: node %d replaces node %d", pid, node, previous)
            strategy.retired_nodes.add(previous)
        log(INFO, "partition %d: served by node %d", pid, node)
        strategy.partition_nodes[pid] = node


def global_accuracy(
    strategy: PersonalizedStrategy, model: SplitModel, arrays: ArrayRecord, test_set: TensorData
) -> float:
    """The global model on the union of all client test splits."""
    predict = strategy.global_predictor(model, from_record(arrays))
    device = next(model.parameters()).device
    return count_correct(predict, test_set, device) / len(test_set)


def run_folder(config: RunConfig, run_id: int) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dataset = Path(config.dataset_path or config.dataset).name.replace("/", "_")
    name = f"{stamp}_{config.algo}_{dataset}_a{config.alpha:g}_s{config.seed}_run{run_id}"
    return Path(config.results_dir).expanduser().resolve() / name


def wait_for_clients(
    grid: Grid, strategy: PersonalizedStrategy, needed: int, timeout: float = DISCOVERY_TIMEOUT_S
) -> None:
    """Refresh the partition map; while fewer than ``needed`` partitions have a node (the
    devices dropped out), wait for them instead of running rounds that cannot train. After
    ``timeout`` the run stops; its checkpoint lets it resume."""
    deadline = time.monotonic() + timeout
    refresh_partitions(grid, strategy)
    while len(strategy.partition_nodes) < needed:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"only {len(strategy.partition_nodes)} clients connected for {timeout:.0f}s; "
                f"min-train-replies={needed}. Resume from the checkpoint when devices are back"
            )
        log(WARNING, "%d clients connected, waiting for %d", len(strategy.partition_nodes), needed)
        time.sleep(5.0)
        refresh_partitions(grid, strategy)


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


@dataclass
class Exchange:
    """One phase's messages: the replies, bytes each way and how long it took."""

    replies: list[Message]
    bytes_sent: int
    bytes_received: int
    seconds: float


def exchange(grid: Grid, messages: Iterable[Message], timeout: float = 0.0) -> Exchange:
    """Send and wait for the replies (at most ``timeout`` seconds when > 0; a node that
    died is answered with an error by Flower); count the arrays' bytes both ways."""
    started = time.perf_counter()
    messages = list(messages)
    if not messages:
        return Exchange([], 0, 0, 0.0)
    replies = list(grid.send_and_receive(messages, timeout=timeout or None))
    received = payload_bytes(r for r in replies if not r.has_error())
    return Exchange(replies, payload_bytes(messages), received, time.perf_counter() - started)


def run_rounds(
    grid: Grid,
    config: RunConfig,
    strategy: PersonalizedStrategy,
    model: SplitModel,
    test_set: TensorData,
    writer: ResultsWriter,
    arrays: ArrayRecord,
    first_round: int = 1,
) -> ArrayRecord:
    for server_round in range(first_round, config.num_server_rounds + 1):
        started = time.perf_counter()
        wait_for_clients(grid, strategy, config.min_train_replies)
        training = exchange(
            grid,
            strategy.configure_train(server_round, arrays, ConfigRecord(), grid),
            config.reply_timeout,
        )
        aggregated, train_metrics = strategy.aggregate_train(server_round, training.replies)
        if aggregated is not None:
            arrays = aggregated
        train_seconds = time.perf_counter() - started

        started = time.perf_counter()
        evaluation = Exchange([], 0, 0, 0.0)
        personal: dict = {}
        global_acc, server_eval_seconds = None, 0.0
        if config.is_eval_round(server_round):
            evaluation = exchange(
                grid,
                strategy.configure_evaluate(server_round, arrays, ConfigRecord(), grid),
                config.reply_timeout,
            )
            personal = dict(strategy.aggregate_evaluate(server_round, evaluation.replies) or {})
            evaluated = time.perf_counter()
            global_acc = global_accuracy(strategy, model, arrays, test_set)
            server_eval_seconds = time.perf_counter() - evaluated
        eval_seconds = time.perf_counter() - started

        record = round_record(
            server_round,
            global_acc,
            personal,
            dict(train_metrics or {}),
            strategy.last_sampled,
        )
        record.train_seconds, record.eval_seconds = round(train_seconds, 3), round(eval_seconds, 3)
        record.server_eval_seconds = round(server_eval_seconds, 3)
        record.bytes_to_clients = training.bytes_sent + evaluation.bytes_sent
        record.bytes_from_clients = training.bytes_received + evaluation.bytes_received
        record.train_bytes_to_clients = training.bytes_sent
        record.train_bytes_from_clients = training.bytes_received
        writer.run.update(strategy.report())
        writer.add(record)
        save_checkpoint(writer.folder, server_round, arrays, strategy, config)
        log(INFO, "%s", round_line(record, config.num_server_rounds))
        if strategy.finished(server_round):
            log(INFO, "%s ends the run after round %d", config.algo, server_round)
            break
    return arrays


def save_checkpoint(
    folder: Path,
    server_round: int,
    arrays: ArrayRecord,
    strategy: PersonalizedStrategy,
    config: RunConfig,
) -> None:
    strategy_arrays, strategy_state = strategy.state_dict()
    Checkpoint(
        round=server_round,
        model=from_record(arrays),
        strategy_arrays=strategy_arrays,
        strategy_state=strategy_state,
        state_key=strategy.state_key,
        run_config=config.to_run_config(),
    ).save(folder)


def round_record(
    server_round: int,
    global_acc: float | None,
    personal: dict,
    train_metrics: dict,
    sampled: list[int],
) -> RoundRecord:
    """One round's accuracies and client-reported costs; ``personal`` is the aggregated
    evaluation ({} if none ran), ``train_metrics`` the aggregated training replies."""
    client_accuracies = None
    if personal:
        partitions, accuracies = personal["client-partitions"], personal["client-accuracies"]
        client_accuracies = {str(p): a for p, a in zip(partitions, accuracies, strict=True)}

    def client_seconds(key: str) -> float:
        return round(float(train_metrics.get(key, 0.0)) + float(personal.get(key, 0.0)), 3)

    return RoundRecord(
        round=server_round,
        global_accuracy=global_acc,
        personal_accuracy=personal.get("personal-accuracy"),
        personal_accuracy_std=personal.get("personal-accuracy-std"),
        train_seconds=0.0,
        eval_seconds=0.0,
        num_train_examples=int(train_metrics.get(NUM_PROCESSED, 0)),
        trained_parameters=int(train_metrics.get(NUM_TRAINED_PARAMS, 0)),
        client_compute_seconds=client_seconds(COMPUTE_SECONDS),
        client_handler_seconds=client_seconds(HANDLER_SECONDS),
        sampled_clients=list(sampled),
        client_accuracies=client_accuracies,
    )


def round_line(record: RoundRecord, num_rounds: int) -> str:
    def pct(value: float | None) -> str:
        return "   -   " if value is None else f"{100 * value:6.2f}%"

    return (
        f"[round {record.round:>3}/{num_rounds}] {record.train_seconds + record.eval_seconds:7.1f}s"
        f" | global {pct(record.global_accuracy)} | personal {pct(record.personal_accuracy)}"
    )


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = RunConfig.from_run_config(context.run_config)  # fails fast on bad input
    strategy = get_algorithm(config.algo).strategy(config)  # checks the algorithm's keys
    checkpoint, resumed_folder = None, None
    if config.resume:
        checkpoint, resumed_folder = Checkpoint.load(Path(config.resume))
        checkpoint.check_compatible(config)
    partition_nodes, num_partitions = discover_partitions(grid)
    strategy.set_partitions(partition_nodes, num_partitions)
    key = PartitionKey.from_config(config, num_partitions)
    info = load_info(key)
    test_set = load_union_test_set(key)
    model = initial_model(info, config).to(select_device(config.device))
    strategy.prepare_model(model)

    run_info = {
        "run_id": context.run_id,
        "algo": config.algo,
        "num_clients": num_partitions,
        "num_classes": info.num_classes,
        "image_shape": [info.channels, info.height, info.width],
        "global_test_size": len(test_set),
    }
    if checkpoint is None:
        writer = ResultsWriter(run_folder(config, context.run_id), config.to_run_config(), run_info)
        strategy.state_key = writer.folder.name
        arrays, first_round = to_record(model.group_state(BASE, HEAD_G, EXTRA)), 1
    else:
        writer = ResultsWriter.resume(resumed_folder, config.to_run_config(), run_info,
                                      checkpoint.round)  # fmt: skip
        strategy.load_state_dict(checkpoint.strategy_arrays, checkpoint.strategy_state)
        strategy.state_key = checkpoint.state_key
        arrays, first_round = to_record(checkpoint.model), checkpoint.round + 1
        log(INFO, "resuming %s after round %d", writer.folder, checkpoint.round)
    log(INFO, "%s on %d clients; results in %s", config.algo, num_partitions, writer.folder)
    strategy.summary()
    try:
        run_rounds(grid, config, strategy, model, test_set, writer, arrays, first_round)
    except BaseException:
        writer.finish("failed")
        raise
    writer.finish()
    summary = writer.summary()
    log(
        INFO,
        "best global %.4f | best personal %.4f | %s",
        summary["best_global_accuracy"] or 0.0,
        summary["best_personal_accuracy"] or 0.0,
        writer.json_path,
    )
