"""A federation in this process, for fault tests: the real ServerApp ``main`` drives the
real ClientApp handlers through a Grid that delivers messages by calling them, and lets a
test replace chosen replies by crafted ones, raise in a client, or "kill the server"
(stop it dead) after a chosen reply, leaving the disk as a SIGKILL would.

It is not Flower's transport, but what crosses it does: every message, every reply
and every node's context between messages goes through Flower's protobuf serialization,
as in a deployment, so a value Flower cannot carry fails here too. What
it tests is the app's own logic (checks, status, state, resume), also with replies no
honest client would send.
"""

from __future__ import annotations

import gc
import json
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.common.serde import (
    context_from_proto,
    context_to_proto,
    message_from_proto,
    message_to_proto,
)
from flwr.supercore.task_identity import TaskIdentity

from fedreg_app import client_app, server_app
from fedreg_app.core import data
from fedreg_app.core.persist import load_arrays
from fedreg_app.core.protocol import ARRAYS, CONFIG, METRICS, PARTITION_ID, SERVER_ROUND
from fedreg_app.core.records import to_record

#: A fault: given the message and the honest reply (None if the client raised), the
#: reply to deliver (None: no reply at all).
Fault = Callable[[Message, Message | None], Message | None]
HANDLERS = {
    MessageType.QUERY: client_app.query,
    MessageType.TRAIN: client_app.train,
    MessageType.EVALUATE: client_app.evaluate,
}


class DiskAtKill:
    """A copy of a run's folders (``results-dir``, ``state-dir``) as they were at one
    moment, to put back later: what a SIGKILL at that moment leaves on disk."""

    def __init__(self, run_config: Mapping[str, Any]) -> None:
        self.copies = Path(tempfile.mkdtemp(prefix="disk-at-kill-"))
        self.folders = [Path(run_config[key]) for key in ("results-dir", "state-dir")
                        if run_config.get(key)]  # fmt: skip
        for index, folder in enumerate(self.folders):
            if folder.exists():
                shutil.copytree(folder, self.copies / str(index), symlinks=True)

    def restore(self) -> None:
        for index, folder in enumerate(self.folders):
            shutil.rmtree(folder, ignore_errors=True)
            if (self.copies / str(index)).exists():
                shutil.copytree(self.copies / str(index), folder, symlinks=True)
        shutil.rmtree(self.copies, ignore_errors=True)


class ServerKilled(BaseException):  # noqa: N818 - it stands for a signal, not an error
    """Raised inside the ServerApp to stop it dead, like SIGKILL. In this process the
    ServerApp's own handlers still run as it unwinds (its ``except BaseException`` writes
    ``failed`` and closes its files, its ``finally`` drops the folder lock), which a
    killed process never does. So the run's folders are copied where it is raised, and
    :func:`run_server` puts the copy back: the disk is what the kill left (results.json
    still ``running``, nothing flushed after). It also forgets the process's caches, as
    the process that resumes a killed run starts without them."""

    def __init__(self, why: str, run_config: Mapping[str, Any]) -> None:
        super().__init__(why)
        self.disk = DiskAtKill(run_config)


def forget_process_caches() -> None:
    """What a new process would not have: decoded datasets, partitions, validated
    configs (and, through them, the rebalanced datasets built from those partitions),
    local DP's view of the server's strategy."""
    for cached in (data.federated_dataset, data.load_info, data.client_splits,
                   client_app._validated, client_app.reply_view):  # fmt: skip
        cached.cache_clear()
    gc.collect()  # the rebalanced datasets are kept per partition, weakly


def over_the_wire(msg: Message) -> Message:
    """The message as the other side gets it: serialized and parsed by Flower."""
    return message_from_proto(message_to_proto(msg))


def error_reply(msg: Message, reason: str) -> Message:
    return Message(Error(code=0, reason=reason), reply_to=msg)


def flower_reason(err: BaseException) -> str:
    """The reason Flower's error reply gives for a ClientApp that raised ``err`` in a
    deployment (``flwr/supernode/runtime/run_clientapp.py``, Flower 1.42)."""
    return str(type(err)) + ":<'" + str(err) + "'>"


class InProcessGrid:
    """Nodes ``1000 + partition`` running ``fedreg_app.client_app`` in this process."""

    def __init__(
        self,
        run_config: dict[str, Any],
        num_partitions: int,
        faults: dict[tuple[str, int, int], Fault] | None = None,
        kill_after: tuple[str, int, int] | None = None,
        node_config: dict[str, Any] | None = None,
        duplicate: Iterable[tuple[str, int, int]] = (),
        node_configs: dict[int, dict[str, Any]] | None = None,
        hidden_from_nodes: Path | None = None,
    ) -> None:
        """``faults[(phase, round, partition)]`` rewrites that reply; ``kill_after =
        (phase, round, n)`` kills the server once ``n`` replies of that phase came back;
        ``node_config``: further node config of every node (a deployed device's own
        ``dataset-path``), ``node_configs``: of one partition's node; ``duplicate``:
        (phase, round, partition) whose reply is delivered twice; ``hidden_from_nodes``:
        a path the nodes do not have (renamed aside while a node handles a message: the
        server's dataset copy on another machine)."""
        self.hidden_from_nodes = hidden_from_nodes
        self.run_config = run_config
        self.faults = faults or {}
        self.duplicate = set(duplicate)
        self.twice: set[str] = set()  # message ids whose reply comes a second time
        self.kill_after = kill_after
        self.contexts = {
            1000 + p: Context(
                run_id=1, node_id=1000 + p, state=RecordDict(), run_config=dict(run_config),
                node_config={"partition-id": p, "num-partitions": num_partitions,
                             **(node_config or {}), **(node_configs or {}).get(p, {})},
            )
            for p in range(num_partitions)
        }  # fmt: skip
        self.delivered: list[tuple[str, int, int]] = []  # (phase, round, partition)
        self.waiting: dict[str, Message] = {}  # replies not pulled yet, by message id

    @contextmanager
    def on_the_node(self) -> Iterator[None]:
        """A node's view of the file system: without ``hidden_from_nodes``."""
        hidden = self.hidden_from_nodes
        if hidden is None:
            yield
            return
        aside = hidden.with_name(hidden.name + ".elsewhere")
        hidden.rename(aside)
        try:
            yield
        finally:
            aside.rename(hidden)

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """Deliver each message at once (as Flower's push would, it gets its id first);
        the replies wait for ``pull_messages``."""
        ids = []
        for counted, msg in enumerate(messages, start=1):
            msg.metadata.__dict__["_message_id"] = msg.object_id
            ids.append(msg.metadata.message_id)
            node = msg.metadata.dst_node_id
            context = self.contexts[node]
            phase = msg.metadata.message_type
            partition = int(context.node_config["partition-id"])
            server_round = int(msg.content[CONFIG][SERVER_ROUND]) if CONFIG in msg.content else 0
            received = over_the_wire(msg)
            try:
                with self.on_the_node():
                    reply: Message | None = HANDLERS[phase](received, context)
            except Exception as err:  # a client that raises: Flower replies with an error
                reply = error_reply(received, flower_reason(err))
            # the node's context is kept between messages as Flower keeps it: serialized
            self.contexts[node] = context_from_proto(context_to_proto(context))
            fault = self.faults.get((phase, server_round, partition))
            if fault is not None:
                reply = fault(received, reply)
            if reply is not None:
                self.waiting[msg.metadata.message_id] = over_the_wire(reply)
                self.delivered.append((phase, server_round, partition))
                if (phase, server_round, partition) in self.duplicate:
                    self.twice.add(msg.metadata.message_id)
            if self.kill_after == (phase, server_round, counted):
                raise ServerKilled(
                    f"killed after {counted} {phase} replies of round {server_round}",
                    self.run_config,
                )
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        pulled = [(i, self.waiting.pop(i)) for i in list(message_ids) if i in self.waiting]
        again = [over_the_wire(reply) for i, reply in pulled if i in self.twice]
        self.twice -= {i for i, _ in pulled}
        return [reply for _, reply in pulled] + again


def as_a_task(run_id: int = 1) -> None:
    """Set Flower's task identity as a ServerApp's or ClientApp's process has it: a
    Message can be built only then."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, 1, 1


def train_reply(partition: int, arrays: Mapping[str, np.ndarray], **metrics: Any) -> Message:
    """A training reply from ``partition``'s node, as the ServerApp hands a checked one to
    the strategy: its arrays, and its partition and ``metrics`` as its metrics."""
    as_a_task()
    content = RecordDict({
        ARRAYS: to_record(dict(arrays)),
        METRICS: MetricRecord({PARTITION_ID: partition, **metrics}),
    })  # fmt: skip
    return Message(content, dst_node_id=1000 + partition, message_type=MessageType.TRAIN)


def run_server(
    run_config: dict[str, Any], num_partitions: int = 4, run_id: int = 1, **grid_options: Any
) -> tuple[InProcessGrid, BaseException | None]:
    """Run the ServerApp to its end (or its death); returns the grid and what stopped it."""
    as_a_task(run_id)
    grid = InProcessGrid(run_config, num_partitions, **grid_options)
    context = Context(run_id=run_id, node_id=1, node_config={}, state=RecordDict(),
                      run_config=dict(run_config))  # fmt: skip
    try:
        server_app.main(grid, context)  # type: ignore[arg-type]
    except ServerKilled as killed:
        killed.disk.restore()
        forget_process_caches()
        return grid, killed
    except BaseException as err:  # noqa: BLE001 - the caller decides what it expected
        return grid, err
    return grid, None


def results(results_dir: Path) -> dict[str, Any]:
    [path] = list(results_dir.glob("*/results.json"))
    return json.loads(path.read_text())


def final_model(results_dir: Path) -> dict[str, np.ndarray]:
    """The global model of the run's last checkpoint (whatever its file layout)."""
    [folder] = [p for p in results_dir.glob("*/checkpoint")]
    return {
        k: v for path in sorted(folder.rglob("model.npz")) for k, v in load_arrays(path).items()
    }


def client_states(state_dir: Path) -> dict[str, np.ndarray]:
    """Every partition's newest private state, keyed by partition and array name."""
    arrays = {}
    for partition in sorted(state_dir.glob("runs/*/partition-*")):
        newest = max(partition.glob("round-*"))
        for path in sorted(newest.glob("*.npz")):
            for key, value in load_arrays(path).items():
                arrays[f"{partition.name}/{newest.name}/{path.stem}/{key}"] = value
    return arrays


def assert_same_arrays(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert got.keys() == want.keys() and got
    different = [k for k in got if not np.array_equal(got[k], want[k])]
    assert not different, different[:5]
