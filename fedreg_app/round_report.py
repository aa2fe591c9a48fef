"""What a round's record and its log line say beyond the accuracies: where clients ran,
which private state started afresh, the sampled personal figure, and the line itself."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flwr.app import Message

from fedreg_app.core.metrics import RoundRecord
from fedreg_app.core.protocol import (
    HOST,
    HOST_KEYS,
    HOST_VALUE_CHARS,
    METRICS,
    PARTITION_ID,
    STATE_RESET_RECORDS,
)


def reset_records(replies: Iterable[Message]) -> list[dict[str, Any]]:
    """Which partition's private records started afresh, as its replies name them."""
    found = []
    for reply in replies:
        if STATE_RESET_RECORDS in reply.content.config_records:
            names = reply.content[STATE_RESET_RECORDS].get("records", [])
            names = names if isinstance(names, list) else [names]
            partition = int(reply.content[METRICS][PARTITION_ID])
            found.append(
                {
                    "partition": partition,
                    "phase": reply.metadata.message_type,
                    "records": [str(n)[:100] for n in names[:20]],
                }
            )  # a bounded say
    return found


def client_hosts(replies: Iterable[Message]) -> dict[str, dict[str, str]]:
    """Where each reply's client ran, by partition (what it said: only the known
    :data:`HOST_KEYS`, as text, each cut short)."""
    hosts = {}
    for reply in replies:
        if HOST in reply.content.config_records:
            said = reply.content[HOST]
            hosts[str(int(reply.content[METRICS][PARTITION_ID]))] = {
                key: said[key][:HOST_VALUE_CHARS]
                for key in HOST_KEYS
                if isinstance(said.get(key), str)
            }
    return dict(sorted(hosts.items(), key=lambda item: int(item[0])))


def sampled_accuracy(personal: dict[str, Any], trained: set[int]) -> float | None:
    """The personal accuracy over the clients that have trained, when every one of them
    answered the evaluation (as the all-client figure needs every client); else None."""
    if not trained or personal.get("sampled-clients-evaluated") != len(trained):
        return None
    return personal["personal-accuracy-sampled"]


def trained_in(records: Iterable[RoundRecord]) -> set[int]:
    """The clients with an accepted training reply in ``records``: each round's sampled
    clients less those a training error names. Only for checkpoints of earlier versions,
    which did not store the set."""
    trained: set[int] = set()
    for record in records:
        failed = {p for e in record.errors if e["phase"] == "train" for p in e["partitions"]}
        trained.update(set(record.sampled_clients) - failed)
    return trained


def round_line(record: RoundRecord, num_rounds: int) -> str:
    def pct(value: float | None) -> str:
        return "   -   " if value is None else f"{100 * value:6.2f}%"

    line = (
        f"[round {record.round:>3}/{num_rounds}] {record.train_seconds + record.eval_seconds:7.1f}s"
        f" | global {pct(record.global_accuracy)} | personal {pct(record.personal_accuracy)}"
        f" | sampled {pct(record.personal_accuracy_sampled)} ({record.clients_trained} trained)"
    )
    if record.personal_accuracy_worst is not None:
        line += (
            f" | worst client {pct(record.personal_accuracy_worst)}"
            f", bottom 10% {pct(record.personal_accuracy_bottom_decile)}"
        )
    if record.personal_accuracy_honest is not None:
        line += f" | honest clients {pct(record.personal_accuracy_honest)}"
    if record.new_clients:
        line += (
            f" | {record.new_clients} new client{'s' * (record.new_clients != 1)}: personal "
            f"{pct(record.new_client_personal_accuracy)}, global "
            f"{pct(record.new_client_global_accuracy)}"
        )
    if record.dp_epsilon is not None:
        line += f" | ε {record.dp_epsilon:.2f}"
    if record.degraded:
        line += (
            f" | DEGRADED: {record.train_failures} train / {record.eval_failures} eval "
            f"failures; personal over answered {pct(record.personal_accuracy_answered)}"
        ) + (f"; {record.state_resets} state resets" if record.state_resets else "")
    if record.global_model_kept:
        line += f" | global model kept ({record.train_replies} replies < min-train-replies)"
    return line
