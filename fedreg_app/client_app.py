"""The ClientApp: builds the client's setup from its node config and the run config,
then hands the message to the algorithm's client procedure."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.common import log

from clients.attacks import lie, lying_data
from clients.base import ClientProcedure, ClientSetup
from fedreg_app.core.client_state import MISSING_VERSION, VersionedState
from fedreg_app.core.config import (
    ConfigError,
    RunConfig,
    check_dataset_path,
    is_count,
    refuse_relative_paths,
)
from fedreg_app.core.data import (
    DatasetInfo,
    PartitionKey,
    data_cache_folder,
    node_data,
    tensors_digest,
)
from fedreg_app.core.environment import run_ray_workers_at_normal_priority
from fedreg_app.core.models import SplitModel, checked_value, initial_model
from fedreg_app.core.new_clients import held_out
from fedreg_app.core.persist import file_sha256_cached
from fedreg_app.core.privacy import privatise_locally
from fedreg_app.core.protocol import (
    ARRAYS,
    COMPUTE_SECONDS,
    CONFIG,
    CPU_CAPABILITY,
    DATA,
    DEVICE,
    DIGEST,
    DP_REFERENCE,
    GLOBAL_ARRAYS,
    HANDLER_SECONDS,
    HOST,
    HOSTNAME,
    INIT_MODEL_DIGEST,
    METRICS,
    NICENESS,
    NUM_PARTITIONS,
    PARTITION_ID,
    QUERY,
    RAY_ACTOR,
    RAY_NODE,
    SERVER_ROUND,
    SETUP_SECONDS,
    STATE_HELD,
    STATE_KEY,
    STATE_ON_DISK,
    STATE_RESET_RECORDS,
    STATE_RESETS,
    STATE_ROUND,
    STATE_SECONDS,
    TORCH_VERSION,
    WEIGHTS_QUERY,
    is_valid_state_key,
)
from fedreg_app.core.records import from_record, to_record
from fedreg_app.core.robustness import attackers
from fedreg_app.core.training import select_device, set_denormals
from fedreg_app.registry import Algorithm, algorithm_of, load_config
from strategies.base import ModelParts

DATASET_PATH = "dataset-path"
INIT_MODEL = "init-model"
STATE_DIR = "state-dir"
NUM_THREADS = "num-threads"

app = ClientApp()
run_ray_workers_at_normal_priority()  # before a simulation process starts Ray


@dataclass(frozen=True)
class NodeSettings:
    """What a node says about itself through ``--node-config`` (or the simulation); its
    own copies of the server's files (:data:`NODE_COPIES`) enter the run config instead."""

    partition_id: int
    num_partitions: int
    state_dir: str = ""  # where private state and decoded data survive restarts
    num_threads: int = 0  # torch threads per ClientApp process (0: torch's default)

    @classmethod
    def from_context(cls, context: Context) -> NodeSettings:
        node = context.node_config
        missing = [key for key in (PARTITION_ID, NUM_PARTITIONS) if key not in node]
        if missing:
            raise ConfigError(
                f"node config lacks {missing[0]!r}: start the SuperNode with "
                '--node-config "partition-id=<i> num-partitions=<N>"'
            )
        partition_id = node_integer(node, PARTITION_ID, "an integer from 0 to num-partitions - 1")
        num_partitions = node_integer(node, NUM_PARTITIONS, "an integer >= 1")
        if not 0 <= partition_id < num_partitions:
            raise ConfigError(
                f"partition-id={partition_id} is not allowed: expected 0..{num_partitions - 1}"
            )
        return cls(
            partition_id,
            num_partitions,
            str(node.get(STATE_DIR, "")),
            node_integer(node, NUM_THREADS, "an integer >= 0 (0: torch's default)", 0),
        )


def node_integer(
    node: Mapping[str, Any], key: str, allowed: str, default: int | None = None
) -> int:
    """A whole number from ``--node-config`` (Flower gives a string, an int or a float),
    or a ConfigError naming the key."""
    value = node.get(key, default)
    try:
        number = int(value) if isinstance(value, str) else value
        if isinstance(number, float) and number.is_integer():
            number = int(number)
        if isinstance(number, bool) or not isinstance(number, int):
            raise ValueError(value)
    except ValueError:
        raise ConfigError(
            f"node config {key}={value!r} is not allowed: expected {allowed}"
        ) from None
    return number


def state_dir_of(node: NodeSettings, config: RunConfig) -> Path | None:
    """The node's own ``state-dir``, else the run config's (simulation: one machine)."""
    folder = node.state_dir or config.state_dir
    return Path(folder).expanduser().resolve() if folder else None


@functools.lru_cache(maxsize=4)
def _validated(items: frozenset) -> RunConfig:
    return load_config(dict(items))


#: Run-config keys naming files on the server's machine; a node names its own copy in
#: its node config (a device need not have the server's paths): the dataset, and the
#: pre-trained model its private parts start from (the same file as the server's).
NODE_COPIES = (DATASET_PATH, INIT_MODEL)


def run_config_of(context: Context) -> RunConfig:
    """The run config, validated as the server validated it (once per process and run),
    with the node's own copies (:data:`NODE_COPIES`) in place of the run config's paths:
    those are the server's, which a device need not have at that path (or at all).

    A node's own copy may be a relative path: it is read against the working directory
    of the ClientApp process, which is the folder the SuperNode was started in (where
    the SuperNode starts its ClientApp processes itself, Flower's default), and passed
    on as absolute. The run config's paths must be absolute (:func:`refuse_relative_paths`):
    they were written on another machine, or for the SuperLink's working directory."""
    items = dict(context.run_config)
    for key in NODE_COPIES:
        node_path, server_path = context.node_config.get(key), items.get(key)
        if node_path:
            require_copy(key, str(node_path), f"this node's --node-config {key}")
            items[key] = str(Path(str(node_path)).expanduser().resolve())
        elif server_path:
            refuse_relative_paths({key: server_path}, f"the run config's {key}")
            hint = f" (the server's copy; give this node its own: --node-config {key}=...)"
            require_copy(key, str(server_path), f"the run config's {key}", hint)
    return _validated(frozenset(items.items()))


def require_copy(key: str, path: str, named: str, hint: str = "") -> None:
    """A short ConfigError (it travels in the query's error reply, which the server
    shortens) when ``path`` is not on this node: a dataset folder, or a model file."""
    where = Path(path).expanduser().resolve()
    if key == INIT_MODEL:
        if not where.is_file():
            raise ConfigError(f"{named}={path!r}: no such file ({where}){hint}")
        return
    try:
        check_dataset_path(path)
    except ConfigError:
        raise ConfigError(f"{named}={path!r}: no train.parquet in {where}{hint}") from None


def client_setup(context: Context) -> ClientSetup:
    config = run_config_of(context)
    set_denormals(config.flush_denormals)
    node = NodeSettings.from_context(context)
    if node.num_threads > 0:  # several SuperNodes on one device: don't oversubscribe it
        torch.set_num_threads(node.num_threads)
    key = PartitionKey.from_config(config, node.num_partitions)
    state_dir = state_dir_of(node, config)
    cache = data_cache_folder(state_dir, key) if state_dir else None
    info, data = node_data(key, node.partition_id, cache)
    return ClientSetup(
        config=config, info=info, data=data, state=context.state, cache=cache, partition_key=key
    )


def state_folder(state_dir: Path, state_key: str, partition_id: int) -> Path:
    """Where this partition keeps the run's private state. The key comes off the wire:
    only names of the form the ServerApp generates are accepted, and the resolved folder
    must lie inside ``state_dir``."""
    if not is_valid_state_key(state_key):
        raise ValueError(
            f"state-key={state_key!r} from the server is not allowed: expected a run folder "
            "name (letters, digits, '._-', no path separators)"
        )
    root = state_dir.resolve()
    folder = (root / "runs" / state_key / f"partition-{partition_id}").resolve()
    if not folder.is_relative_to(root):
        raise ValueError(f"state-key={state_key!r} leads outside state-dir {root}")
    return folder


@dataclass
class StateOutcome:
    """What a message did to the node's private state on disk: the records that started
    afresh (corrupt, lost, another owner's), and the round of the newest version held
    afterwards (None without a state dir)."""

    resets: list[str] = dataclasses.field(default_factory=list)
    version: int | None = None
    #: Seconds spent restoring and committing the state on disk.
    seconds: float = 0.0


@contextmanager
def persistent_state(
    msg: Message, context: Context, setup: ClientSetup, server_round: int
) -> Iterator[StateOutcome]:
    """With a state dir, restore the node's private records as of the round the server
    resumes from, commit what the procedure changed as this round's version, and drop the
    records from ``context.state`` again: the disk holds them until the node's next message
    (in simulation Flower keeps every node's ``context.state`` in one process, and ships it
    to the ClientApp with each message). Without one, ``context.state`` is all there is.
    Records found corrupt, a state lost because every saved version is newer than the
    round asked or older than the one the server knows of (``state-held``), and versions
    of another partition or run, go to the outcome's ``resets`` (they start afresh)."""
    outcome = StateOutcome()
    state_dir = state_dir_of(NodeSettings.from_context(context), setup.config)
    if state_dir is None:  # the state lives in context.state, as long as the node runs
        held = state_held_of(msg, server_round)
        if held is not None:  # the partition kept its state on disk on another node
            outcome.version = 0  # none on disk here: the server stops asking for it
            if held > 0 and not any(isinstance(r, ArrayRecord) for r in context.state.values()):
                log(WARNING, "partition %d: the server knows of its state of round %d, but "
                    "this node keeps none (no state-dir); it starts afresh",
                    setup.data.partition_id, held)  # fmt: skip
                outcome.resets.append(MISSING_VERSION)
        yield outcome
        return
    # The ServerApp names the run's state (the same across a server resume, which gets a
    # new Flower run id), so personalization carries over.
    state_key = state_key_of(msg, context)
    held = state_held_of(msg, server_round)  # before anything on disk is touched
    partition = setup.data.partition_id
    versions = VersionedState(state_folder(state_dir, state_key, partition),
                              owner={"partition": partition, "state_key": state_key})  # fmt: skip
    # Training in round t starts from the state before t; evaluation sees round t's. The
    # server's checkpoint is round t-1's until round t ends: a resume runs round t again.
    upto = server_round - 1 if msg.metadata.message_type == MessageType.TRAIN else server_round
    started = time.perf_counter()
    restored = versions.restore(context.state, upto, checkpointed=server_round - 1, held=held)
    outcome.seconds = time.perf_counter() - started
    outcome.resets.extend(restored.reset)
    if restored.records:  # a restarted node, or a resumed run: personalization comes back
        log(INFO, "partition %d: restored %s of round %d from %s", partition,
            ", ".join(restored.records), restored.round, versions.folder)  # fmt: skip
    yield outcome
    started = time.perf_counter()
    committed = versions.commit(context.state, server_round)
    outcome.version = server_round if committed else restored.round
    versions.release(context.state)
    outcome.seconds += time.perf_counter() - started


def state_held_of(msg: Message, server_round: int) -> int | None:
    """The round of the newest version the server knows this partition holds (None when
    it sends none), refused unless a whole number from 0 to the message's round."""
    value = msg.content[CONFIG].get(STATE_HELD)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= server_round:
        raise ValueError(f"{STATE_HELD}={value!r} from the server is not allowed: expected "
                         f"a round from 0 to {server_round}")  # fmt: skip
    return value


def state_key_of(msg: Message, context: Context) -> str:
    """The name the run's private state is kept under: a string from the server (the
    run folder's name), or this Flower run's id when the server names none (or ""). Anything
    else is refused: ``True`` or ``1.5`` would silently start the node's state afresh
    under ``runs/True``."""
    value = msg.content[CONFIG].get(STATE_KEY)
    if value is None or value == "":
        return str(context.run_id)
    if not isinstance(value, str):
        raise ValueError(f"{STATE_KEY}={value!r} from the server is not allowed: expected "
                         "the run folder's name")  # fmt: skip
    return value


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Which partition this node serves; the ServerApp maps partitions to nodes."""
    node = NodeSettings.from_context(context)
    on_disk = state_dir_of(node, run_config_of(context)) is not None
    facts = {PARTITION_ID: node.partition_id, NUM_PARTITIONS: node.num_partitions}
    metrics = MetricRecord({**facts, STATE_ON_DISK: int(on_disk)})
    asked = msg.content[QUERY].get(WEIGHTS_QUERY) if QUERY in msg.content.config_records else None
    if asked not in (None, True, False):  # a string "false" is not a no
        raise ValueError(f"{WEIGHTS_QUERY}={asked!r} from the server is not allowed: "
                         "expected true/false")  # fmt: skip
    if asked:
        setup = client_setup(context)  # central DP asks once for the weights
        metrics.update(algorithm_of(setup.config).client(setup).aggregation_weights())
    return Message(RecordDict({METRICS: metrics}), reply_to=msg)


def server_round_of(msg: Message) -> int:
    """The message's round, refused (ValueError naming it) unless an int >= 1: it names
    the private-state version to restore and to write, so a crafted 0 or -1 would delete
    the node's saved versions, and a float or string would be truncated or parsed."""
    config = msg.content[CONFIG] if CONFIG in msg.content.config_records else {}
    value = config.get(SERVER_ROUND)
    if not is_count(value):
        raise ValueError(
            f"{SERVER_ROUND}={value!r} from the server is not allowed: expected an integer >= 1"
        )
    return value


def procedure_for(
    algorithm: Algorithm, setup: ClientSetup, msg: Message
) -> tuple[ClientProcedure, dict]:
    """The algorithm's client procedure for this node, and the server's arrays."""
    procedure = algorithm.client(setup)
    procedure.server_config = dict(msg.content[CONFIG])
    if ARRAYS not in msg.content.array_records:
        raise ValueError(f"the server's message has no {ARRAYS!r} record (the model)")
    return procedure, from_record(msg.content[ARRAYS])


def reply(
    msg: Message, procedure: ClientProcedure, metrics: dict, seconds: dict, **records
) -> Message:
    """A reply with the metrics (tagged with the partition and the time spent), where it
    ran, the digest of the data it holds (a few ms), and any further records."""
    tagged = MetricRecord({**metrics, **seconds, PARTITION_ID: procedure.data.partition_id})
    where = {**where_running(), DEVICE: device_name(procedure.device)}
    held = {DIGEST: tensors_digest(procedure.data.train, procedure.data.test)}
    if procedure.config.init_model:  # the node's own copy (run_config_of)
        held[INIT_MODEL_DIGEST] = file_sha256_cached(Path(procedure.config.init_model).expanduser())
    content = RecordDict({**records, METRICS: tagged, HOST: ConfigRecord(where),
                          DATA: ConfigRecord(held)})  # fmt: skip
    return Message(content, reply_to=msg)


def device_name(device: torch.device) -> str:
    """``cpu``, or the CUDA device's name: a GPU run's record shows its clients used it."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


@functools.cache
def where_running() -> dict[str, str]:
    """This process's host name, torch build and CPU kind (a device's figures replay
    bit-exactly only on the same), its niceness (a client below its neighbours' priority
    trains slower) and, inside a Ray worker (a simulation's client
    actor), its Ray node id (on a multi-node Ray cluster, which machine ran the client)
    and actor id (how many actors a round used: on a GPU, whether every actor the
    client resources allow took part)."""
    where = {
        HOSTNAME: socket.gethostname(),
        TORCH_VERSION: torch.__version__,
        CPU_CAPABILITY: torch.backends.cpu.get_cpu_capability(),
        NICENESS: str(os.getpriority(os.PRIO_PROCESS, 0)),
    }
    ray = sys.modules.get("ray")  # imported by the simulation's actors, never here
    if ray is not None and ray.is_initialized():
        context = ray.get_runtime_context()
        where[RAY_NODE] = context.get_node_id()
        actor = context.get_actor_id()
        if actor:
            where[RAY_ACTOR] = actor
    return where


def timings(received: float, computed: float, set_up: float, state: float) -> dict[str, float]:
    """Seconds in the procedure alone, in the whole handler so far, and in two of its
    parts around the procedure: setting up (configuration, data) and the state on disk."""
    return {COMPUTE_SECONDS: computed, HANDLER_SECONDS: time.perf_counter() - received,
            SETUP_SECONDS: set_up, STATE_SECONDS: state}  # fmt: skip


Work = Callable[[Algorithm, ClientProcedure, dict, int, Message], tuple[dict, dict | None]]


def handle(msg: Message, context: Context, work: Work) -> Message:
    """Set up, restore private state, run ``work`` (metrics, and arrays to send or None),
    persist what changed, reply with the metrics and the seconds spent."""
    received = time.perf_counter()
    server_round = server_round_of(msg)  # before any state is read or written
    setup = client_setup(context)
    set_up = time.perf_counter() - received
    algorithm = algorithm_of(setup.config)  # resolved once for the whole message
    with persistent_state(msg, context, setup, server_round) as outcome:
        procedure, arrays = procedure_for(algorithm, setup, msg)
        started = time.perf_counter()
        metrics, reply_arrays = work(algorithm, procedure, arrays, server_round, msg)
        computed = time.perf_counter() - started
        refuse_non_finite(context.state, reply_arrays, server_round)  # before any commit
    records = {} if reply_arrays is None else {ARRAYS: to_record(reply_arrays)}
    if outcome.resets:  # which records, not only how many: the run's record says so
        records[STATE_RESET_RECORDS] = ConfigRecord({"records": list(outcome.resets)})
    seconds = timings(received, computed, set_up, outcome.seconds)
    held = {} if outcome.version is None else {STATE_ROUND: outcome.version}
    metrics = {**metrics, STATE_RESETS: len(outcome.resets), **held}
    return reply(msg, procedure, metrics, seconds, **records)


def refuse_non_finite(state: RecordDict, reply_arrays: dict | None, server_round: int) -> None:
    """Raise (a ValueError naming the first such array) when this round left NaN or
    infinite values in the node's private state or in its reply: training diverged (a
    learning rate too high) or the server sent a model of finite but huge values. The
    state is then neither committed nor kept, so the node's next round starts from its
    last sound state instead of failing (or training on NaN) in every round after."""
    parts = [(f"private state {name!r}", from_record(record))
             for name, record in state.items() if isinstance(record, ArrayRecord)]  # fmt: skip
    parts.append(("the reply", reply_arrays or {}))
    for where, arrays in parts:
        for key, value in arrays.items():
            if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
                raise ValueError(
                    f"round {server_round} left NaN or infinite values in {where}, {key}: "
                    "nothing of this round is kept or sent (its training diverged, or the "
                    "server's model held values too large to train on)"
                )


def train_work(
    algorithm: Algorithm, procedure: ClientProcedure, arrays: dict, server_round: int,
    msg: Message,
) -> tuple:  # fmt: skip
    """Train; under local DP clip and noise the update before it leaves the client; a
    simulated liar (``attack``) then lies."""
    lying = is_attacker(procedure.setup)
    reference = None
    if procedure.config.dp_mode == "local":  # named before training: a bad one costs none
        reference = dp_reference(algorithm, procedure, arrays, msg, server_round)
    with lying_data(procedure) if lying else contextlib.nullcontext():
        result = procedure.train(arrays, server_round)
    sent = result.arrays
    if reference is not None:
        sent = privatise_locally(sent, reference, procedure.config,
                                 procedure.data.partition_id, server_round)  # fmt: skip
    if lying:
        sent = lie(sent, arrays, procedure.config, procedure.setup.state,
                   procedure.data.partition_id, server_round)  # fmt: skip
    return result.metrics, sent


def is_attacker(setup: ClientSetup) -> bool:
    """Whether this partition is one of the run's simulated liars."""
    if setup.config.attack == "none" or setup.partition_key is None:
        return False
    return setup.data.partition_id in attackers(setup.config, setup.partition_key.num_partitions)


def is_new_client(setup: ClientSetup) -> bool:
    """Whether this partition is held out of training (``new-client-fraction``)."""
    if setup.config.new_client_fraction == 0 or setup.partition_key is None:
        return False
    return setup.data.partition_id in held_out(setup.config, setup.partition_key.num_partitions)


def dp_reference(
    algorithm: Algorithm, procedure: ClientProcedure, sent: dict, msg: Message, server_round: int
) -> dict:
    """What local DP clips the update around: the sent arrays and the server's
    reference for the rest of the update. Each reference entry must be an entry of the
    model the server did not send, with its shape and dtype and finite values (as the
    global model is checked): a crafted one would move the released update where the
    server wants it, and a wrong shape would broadcast. Every entry the reply will carry
    needs a reference, checked here so that a message without one costs no training."""
    reference = dict(sent)
    received = (from_record(msg.content[DP_REFERENCE])
                if DP_REFERENCE in msg.content.array_records else {})  # fmt: skip
    own = procedure.model.state_dict()
    for key, value in received.items():
        if key not in own or key in sent:
            why = "is also in the sent arrays" if key in sent else "is not an entry of the model"
            raise ValueError(f"{DP_REFERENCE}: key {key!r} {why}: expected model entries not sent")
        checked_value(f"{DP_REFERENCE}: {key}", value, own[key])
        reference[key] = value
    missing = sorted(reply_keys(algorithm, procedure.setup, server_round) - set(reference))
    if missing:
        raise ValueError(
            f"{DP_REFERENCE}: no reference for {missing[:3]}{' …' if len(missing) > 3 else ''} "
            f"({len(missing)} entries the reply carries but the server did not send): local "
            "DP cannot clip the update without them; nothing was trained"
        )
    return reference


def reply_keys(algorithm: Algorithm, setup: ClientSetup, server_round: int) -> set[str]:
    """The entries a training reply of ``server_round`` carries, named by the server's
    own class-level code for this run (as the server checks the reply against), without
    a strategy."""
    model, entries = reply_view(algorithm, setup.config, setup.info)
    return set(algorithm.strategy.reply_entries(setup.config, model, entries, server_round))


@functools.lru_cache(maxsize=4)
def reply_view(
    algorithm: Algorithm, config: RunConfig, info: DatasetInfo
) -> tuple[SplitModel, dict[str, np.ndarray]]:
    """The server's model and its initial entries, built once per process and run (not
    per training message), for local DP's reference: only the entries' names are read
    (which entries a reply carries can depend on the model's layers, FedSeq's)."""
    model = server_model(algorithm, config, info)
    return model, {key: value.numpy() for key, value in model.state_dict().items()}


def evaluate_work(
    algorithm: Algorithm, procedure: ClientProcedure, arrays: dict, server_round: int,
    msg: Message,
) -> tuple:  # fmt: skip
    """Personal and (when the server sends the rest of it) global model, one pass."""
    global_parts = None
    if GLOBAL_ARRAYS in msg.content.array_records:
        rest = from_record(msg.content[GLOBAL_ARRAYS])
        overlap = sorted(set(rest) & set(arrays))
        if overlap:  # the global figure must be of the model that was sent
            raise ValueError(f"{GLOBAL_ARRAYS}: keys {overlap} are also in the sent arrays: "
                             "expected only the entries not sent")  # fmt: skip
        whole = {**arrays, **rest}
        global_parts = global_model_parts(algorithm, procedure.setup, whole)
    if is_new_client(procedure.setup):
        return procedure.evaluate_as_new_client(arrays, server_round, global_parts), None
    return procedure.evaluate(arrays, server_round, global_parts), None


def global_model_parts(algorithm: Algorithm, setup: ClientSetup, arrays: dict) -> ModelParts:
    """The global model, built exactly as the server's strategy builds it, by the same
    class-level code and without a strategy (e.g. GPFL's head on the valve conditioned by
    the mean condition)."""
    model = server_model(algorithm, setup.config, setup.info)
    device = select_device(setup.config.device)
    return algorithm.strategy.global_parts(setup.config, model.to(device), arrays)


def server_model(algorithm: Algorithm, config: RunConfig, info: DatasetInfo) -> SplitModel:
    """The server's model (its initial weights, on the CPU), built by the same code as
    on the server."""
    model = initial_model(info, config)
    algorithm.strategy.add_modules(config, model)
    return model


@app.train()
def train(msg: Message, context: Context) -> Message:
    return handle(msg, context, train_work)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return handle(msg, context, evaluate_work)
