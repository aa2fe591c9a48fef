"""The ClientApp: builds the client's setup from its node config and the run config,
then hands the message to the algorithm's client procedure."""

from __future__ import annotations

import time

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from clients.base import (
    COMPUTE_SECONDS,
    HANDLER_SECONDS,
    PARTITION_ID,
    ClientProcedure,
    ClientSetup,
)
from fedreg_app.config import ConfigError, RunConfig
from fedreg_app.data import PartitionKey, load_client_data, load_info
from fedreg_app.records import from_record, to_record
from fedreg_app.registry import get_algorithm
from strategies.base import ARRAYS, CONFIG, METRICS, SERVER_ROUND

NUM_PARTITIONS = "num-partitions"

app = ClientApp()


def node_partition(context: Context) -> tuple[int, int]:
    """(partition-id, num-partitions) from the node config (set by the simulation
    engine, or by ``--node-config`` on a SuperNode)."""
    try:
        return int(context.node_config[PARTITION_ID]), int(context.node_config[NUM_PARTITIONS])
    except KeyError as err:
        raise ConfigError(
            f"node config lacks {err.args[0]!r}: start the SuperNode with "
            '--node-config "partition-id=<i> num-partitions=<N>"'
        ) from err


def client_setup(context: Context) -> ClientSetup:
    config = RunConfig.from_run_config(context.run_config)
    partition_id, num_partitions = node_partition(context)
    key = PartitionKey.from_config(config, num_partitions)
    return ClientSetup(
        config=config,
        info=load_info(key),
        data=load_client_data(key, partition_id),
        state=context.state,
    )


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Which partition this node serves; the ServerApp maps partitions to nodes."""
    partition_id, num_partitions = node_partition(context)
    metrics = MetricRecord({PARTITION_ID: partition_id, NUM_PARTITIONS: num_partitions})
    return Message(RecordDict({METRICS: metrics}), reply_to=msg)


def procedure_for(msg: Message, context: Context) -> tuple[ClientProcedure, dict, int]:
    """The algorithm's client procedure for this node, the server's arrays and the round."""
    setup = client_setup(context)
    procedure = get_algorithm(setup.config.algo).client(setup)
    return procedure, from_record(msg.content[ARRAYS]), int(msg.content[CONFIG][SERVER_ROUND])


def reply(
    msg: Message, procedure: ClientProcedure, metrics: dict, seconds: dict, **records
) -> Message:
    """A reply with the metrics (tagged with the partition and the time spent) and any
    further records."""
    tagged = MetricRecord({**metrics, **seconds, PARTITION_ID: procedure.data.partition_id})
    return Message(RecordDict({**records, METRICS: tagged}), reply_to=msg)


def timings(received: float, computed: float) -> dict[str, float]:
    """Seconds in the procedure alone, and in the whole handler so far."""
    return {COMPUTE_SECONDS: computed, HANDLER_SECONDS: time.perf_counter() - received}


@app.train()
def train(msg: Message, context: Context) -> Message:
    received = time.perf_counter()
    procedure, arrays, server_round = procedure_for(msg, context)
    started = time.perf_counter()
    result = procedure.train(arrays, server_round)
    payload = to_record(result.arrays)
    seconds = timings(received, time.perf_counter() - started)
    return reply(msg, procedure, result.metrics, seconds, **{ARRAYS: payload})


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    received = time.perf_counter()
    procedure, arrays, server_round = procedure_for(msg, context)
    started = time.perf_counter()
    metrics = procedure.evaluate(arrays, server_round)
    seconds = timings(received, time.perf_counter() - started)
    return reply(msg, procedure, metrics, seconds)
