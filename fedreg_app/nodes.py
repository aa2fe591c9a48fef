"""Which node serves which partition: the ServerApp asks the nodes (a query message
each), maps their answers onto partitions, refreshes the map between rounds as devices
drop out and come back, and waits for them when too few are left. Also the push/pull
loop every phase's messages go through, and central DP's query for each partition's
declared aggregation weights.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from logging import INFO, WARNING

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from fedreg_app.core.config import ConfigError
from fedreg_app.core.metrics import client_error
from fedreg_app.core.partition_map import PartitionMap
from fedreg_app.core.protocol import (
    METRICS,
    NUM_PARTITIONS,
    PARTITION_ID,
    QUERY,
    STATE_ON_DISK,
    WEIGHTS_QUERY,
)
from strategies.base import PersonalizedStrategy
from strategies.replies import reply_metrics_problem, weights_problem

DISCOVERY_TIMEOUT_S = 600.0
#: While discovery waits: how often it says which partitions have no node yet, and how
#: long a node that gave no usable answer waits before it is asked again.
DISCOVERY_NOTE_S = 30.0
QUERY_RETRY_S = 30.0
#: Between two pulls of replies: short while replies arrive, backing off to the longest
#: when none do. Flower's ``send_and_receive`` sleeps a fixed 3 s between pulls, which a
#: deployed round paid once per phase (``benchmarks/deployment_vs_simulation.py``).
PULL_INTERVAL_S = (0.1, 1.0)


class RunFailedError(RuntimeError):
    """The run cannot go on (e.g. no client's reply in a phase was usable)."""


@dataclass(frozen=True)
class NodeFacts:
    """What a node says of itself in answer to a query."""

    partition_id: int
    num_partitions: int
    state_on_disk: bool


def query_nodes(
    grid: Grid, nodes: list[int], failures: dict[int, str] | None = None
) -> dict[int, NodeFacts]:
    """Ask nodes which partition they serve. A node that fails to answer, or answers
    nonsense, is left out (it may have just gone away); ``failures`` gets why."""
    failures = {} if failures is None else failures
    if not nodes:
        return {}
    queries = [Message(RecordDict(), message_type=MessageType.QUERY, dst_node_id=n) for n in nodes]
    answers = {}
    for reply in exchange(grid, queries, timeout=60):
        node = reply.metadata.src_node_id
        if reply.has_error():
            failures[node] = client_error(reply.error.reason)
            log(WARNING, "node %d did not answer: %s", node, failures[node])
            continue
        try:
            metrics = reply.content[METRICS]
            facts = NodeFacts(int(metrics[PARTITION_ID]), int(metrics[NUM_PARTITIONS]),
                              bool(metrics.get(STATE_ON_DISK, 0)))  # fmt: skip
        except (KeyError, TypeError, ValueError, OverflowError) as err:  # int(inf): Overflow
            failures[node] = f"an answer without usable facts ({err})"
            log(WARNING, "node %d answered the query without usable facts: %s", node, err)
            continue
        if not 0 <= facts.partition_id < facts.num_partitions:
            failures[node] = f"claims partition {facts.partition_id} of {facts.num_partitions}"
            log(WARNING, "node %d claims partition %d of %d; ignored", node,
                facts.partition_id, facts.num_partitions)  # fmt: skip
            continue
        answers[node] = facts
        failures.pop(node, None)
    return answers


def query_weights(
    grid: Grid, partitions: PartitionMap, strategy: PersonalizedStrategy
) -> dict[int, dict[str, float]]:
    """Central DP: every partition's aggregation weights, declared before the first round
    (the fixed denominators need all of them; a reply later claiming others is refused)."""
    needed = sorted(set(strategy.group_weights.values()))
    config = ConfigRecord({WEIGHTS_QUERY: 1})
    queries = [Message(RecordDict({QUERY: config}), message_type=MessageType.QUERY,
                       dst_node_id=partitions.node_of(pid))
               for pid in partitions.available()]  # fmt: skip
    weights: dict[int, dict[str, float]] = {}
    asked = {partitions.node_of(pid): pid for pid in partitions.available()}
    for reply in exchange(grid, queries, timeout=600):
        pid = asked.get(reply.metadata.src_node_id)  # the partition asked, not the one said
        if reply.has_error() or pid is None or METRICS not in reply.content.metric_records:
            continue
        metrics = reply.content[METRICS]
        if not reply_metrics_problem(metrics, pid, needed) and not weights_problem(
            pid, metrics, needed, strategy.facts
        ):
            weights[pid] = {key: float(metrics[key]) for key in needed}
    missing = sorted(set(range(partitions.num_partitions)) - set(weights))
    if missing:
        raise RunFailedError(
            f"dp-mode='central': partitions {missing[:10]} did not declare their aggregation "
            f"weights ({', '.join(needed)}); every client's are needed"
        )
    return weights


def discover_partitions(
    grid: Grid, timeout: float | None = None
) -> tuple[PartitionMap, dict[int, NodeFacts]]:
    """Ask every connected node which partition it serves; wait until all partitions
    have a node. Returns the map and each node's facts. While it waits it says which
    partitions still have none (every :data:`DISCOVERY_NOTE_S`); a node that gave no
    usable answer is asked again only after :data:`QUERY_RETRY_S` (each query starts a
    ClientApp on it, and its error would fill the log every second). A timeout names
    the nodes that answered nothing usable and why (a device's missing dataset copy)."""
    timeout = DISCOVERY_TIMEOUT_S if timeout is None else timeout
    partitions: PartitionMap | None = None
    facts: dict[int, NodeFacts] = {}
    unanswered: dict[int, float] = {}  # node -> when it last gave no usable answer
    failures: dict[int, str] = {}  # node -> why, for the timeout's message
    started = time.monotonic()
    deadline, next_note = started + timeout, started + DISCOVERY_NOTE_S
    while True:
        new_nodes = [n for n in grid.get_node_ids() if n not in facts]
        for node, answer in query_due_nodes(grid, new_nodes, unanswered, failures).items():
            if partitions is None:
                partitions = PartitionMap(answer.num_partitions)
            if answer.num_partitions != partitions.num_partitions:
                raise ConfigError(
                    f"nodes disagree on num-partitions: {partitions.num_partitions} and "
                    f"{answer.num_partitions}"
                )
            note_replaced(answer.partition_id, node, partitions.assign(answer.partition_id, node))
            facts[node] = answer
        if partitions is not None and len(partitions) >= partitions.num_partitions:
            partitions.unanswered.update(unanswered)  # refresh_partitions goes on from it
            return partitions, facts
        if time.monotonic() > deadline:
            found = partitions.available() if partitions else []
            raise TimeoutError(f"after {timeout:.0f}s only partitions {found} have a node"
                               + unusable_nodes(failures, grid.get_node_ids()))  # fmt: skip
        if time.monotonic() >= next_note:
            have = partitions.available() if partitions else []
            missing = (sorted(set(range(partitions.num_partitions)) - set(have))
                       if partitions else "all (no node has answered yet)")  # fmt: skip
            log(INFO, "waiting for the nodes of partitions %s (%d have one; %.0fs left)",
                missing, len(have), deadline - time.monotonic())  # fmt: skip
            next_note = time.monotonic() + DISCOVERY_NOTE_S
        time.sleep(1.0)


def unusable_nodes(failures: dict[int, str], live: Iterable[int]) -> str:
    """``; nodes without a usable answer: node 7: why; nodes 8, 9: why`` for the nodes
    still connected, alike reasons grouped (every device missing one path)."""
    by_reason: dict[str, list[int]] = {}
    for node in sorted(set(failures) & set(live)):
        by_reason.setdefault(failures[node], []).append(node)
    if not by_reason:
        return ""
    named = [f"node{'s' * (len(nodes) > 1)} {', '.join(map(str, nodes[:5]))}"
             f"{' ...' * (len(nodes) > 5)}: {why}" for why, nodes in by_reason.items()]  # fmt: skip
    return "; nodes without a usable answer: " + "; ".join(named[:5])


def query_due_nodes(
    grid: Grid, nodes: Iterable[int], unanswered: dict[int, float],
    failures: dict[int, str] | None = None,
) -> dict[int, NodeFacts]:  # fmt: skip
    """:func:`query_nodes` for those of ``nodes`` that did not fail a query within the
    last :data:`QUERY_RETRY_S` seconds (``unanswered``: node -> when, updated here)."""
    now = time.monotonic()
    asked = sorted(n for n in nodes if now - unanswered.get(n, -math.inf) >= QUERY_RETRY_S)
    answers = query_nodes(grid, asked, failures)
    unanswered.update((n, now) for n in asked if n not in answers)
    return answers


def note_replaced(partition_id: int, node: int, replaced: int | None) -> None:
    """A partition claimed by a second node: a restarted device before its old id
    expired, or two nodes configured with one partition-id. The newer one serves it; if
    it lacks the partition's private state, its next message counts the reset."""
    if replaced is not None:
        log(WARNING, "partition %d: node %d replaces node %d (a restarted device; if node %d "
            "still runs, two nodes claim partition %d: stop one or give it its own "
            "partition-id)", partition_id, node, replaced, replaced, partition_id)  # fmt: skip


def refresh_partitions(grid: Grid, partitions: PartitionMap) -> None:
    """Before a round: forget partitions whose node is gone, and map partitions of nodes
    that (re)connected, so that sampling skips devices that dropped out and uses a device
    again when it comes back (with a new node id)."""
    live = set(grid.get_node_ids())
    for pid, node in partitions.forget_gone(live):
        log(WARNING, "partition %d: node %d is gone; skipped until it returns", pid, node)
    new_nodes = live - partitions.known_nodes()
    for node, answer in query_due_nodes(grid, new_nodes, partitions.unanswered).items():
        if answer.num_partitions != partitions.num_partitions:
            log(WARNING, "node %d serves 1 of %d partitions, not of %d; ignored", node,
                answer.num_partitions, partitions.num_partitions)  # fmt: skip
            partitions.retire(node)
            continue
        note_replaced(answer.partition_id, node, partitions.assign(answer.partition_id, node))
        log(INFO, "partition %d: served by node %d", answer.partition_id, node)


def wait_for_clients(
    grid: Grid, partitions: PartitionMap, needed: int, timeout: float = DISCOVERY_TIMEOUT_S
) -> None:
    """Refresh the partition map; while fewer than ``needed`` partitions have a node (the
    devices dropped out), wait for them instead of running rounds that cannot train. After
    ``timeout`` the run stops; its checkpoint lets it resume."""
    deadline = time.monotonic() + timeout
    refresh_partitions(grid, partitions)
    while len(partitions) < needed:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"only {len(partitions)} clients connected for {timeout:.0f}s; "
                f"min-train-replies={needed}. Resume from the checkpoint when devices are back"
            )
        log(WARNING, "%d clients connected, waiting for %d", len(partitions), needed)
        time.sleep(5.0)
        refresh_partitions(grid, partitions)


def exchange(grid: Grid, messages: list[Message], timeout: float = 0.0) -> list[Message]:
    """Push the messages and pull their replies as they arrive, until every message is
    answered or ``timeout`` seconds (when > 0) have passed. A message the SuperLink did not
    accept (its id comes back empty) gets no reply; the caller counts it as a failure."""
    pending = {message_id for message_id in grid.push_messages(messages) if message_id}
    deadline = time.monotonic() + timeout if timeout > 0 else float("inf")
    shortest, longest = PULL_INTERVAL_S
    interval = shortest
    replies: list[Message] = []
    while pending:
        arrived = list(grid.pull_messages(pending))
        replies.extend(arrived)
        pending -= {reply.metadata.reply_to_message_id for reply in arrived}
        left = deadline - time.monotonic()
        if not pending or left <= 0:
            break
        interval = shortest if arrived else min(longest, interval * 1.5)
        time.sleep(min(interval, left))
    return replies
