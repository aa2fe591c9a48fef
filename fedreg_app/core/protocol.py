"""The vocabulary of the wire: record names, message-config keys and metric keys that
the ServerApp, the strategies and the client procedures exchange, in one place.

Also what a key sent by the server may look like: a client joins the ``state-key`` into
a path, so only names of the form the ServerApp generates are accepted.
"""

from __future__ import annotations

import re

# Records of a message's RecordDict.
ARRAYS = "arrays"
#: Evaluation messages: the parts of the global model a client does not receive for its
#: own use (e.g. FedPer's averaged head), so that it can evaluate the global model too.
GLOBAL_ARRAYS = "global-arrays"
#: Training messages under local DP: the global values of the aggregated groups the
#: client is not sent for its own use, so it can compute (and noise) its whole update.
DP_REFERENCE = "dp-reference"
METRICS = "metrics"
CONFIG = "config"
#: Replies: where the client ran (config record: ``hostname``, ``torch`` and
#: ``cpu-capability``, on which bit-exact replays depend, ``device``, what it computed on
#: (``cpu`` or the CUDA device's name), and in a simulation ``ray-node`` and
#: ``ray-actor``, the Ray node and client actor ids), so a cluster run can show its
#: clients were spread, and a run can show how many actors took part.
HOST = "host"
HOSTNAME = "hostname"
TORCH_VERSION = "torch"
CPU_CAPABILITY = "cpu-capability"
DEVICE = "device"
RAY_NODE = "ray-node"
RAY_ACTOR = "ray-actor"
#: The scheduling priority the client ran at (a simulation's actors: Ray's worker
#: niceness; see ``run_ray_workers_at_normal_priority``).
NICENESS = "niceness"
#: The only host keys a server keeps (a reply is data from the wire: no other key, and
#: each value cut to :data:`HOST_VALUE_CHARS` characters).
HOST_KEYS = (HOSTNAME, TORCH_VERSION, CPU_CAPABILITY, DEVICE, RAY_NODE, RAY_ACTOR, NICENESS)
HOST_VALUE_CHARS = 200
#: Replies: the data the client holds (config record), ``digest``: the content digest of
#: its decoded train and test splits, which the server compares with its own partitioning
#: (a node whose ``dataset-path`` holds other samples of the same sizes is told apart).
DATA = "data"
DIGEST = "digest"
#: ``data``'s sha256 of the ``init-model`` file the node's model (its private parts, which
#: never come from the server) starts from; absent without one. The server compares it
#: with its own file's: a node's copy of other weights would personalise from them.
INIT_MODEL_DIGEST = "init-model"

# Message config, server -> client.
SERVER_ROUND = "server-round"
STATE_KEY = "state-key"  # names the clients' on-disk state of this run
#: The round of the newest private-state version the partition reported holding (its
#: last accepted reply's ``state-round``): a client that finds an older one, or none, on
#: disk knows its state was lost (a wiped or replaced state-dir) and says so.
STATE_HELD = "state-held"
#: A query's config record, and its key asking a node for its aggregation weights
#: (central DP's fixed denominators need every client's).
QUERY = "query"
WEIGHTS_QUERY = "aggregation-weights"

# Node facts, client -> server (query replies) and node config keys.
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
STATE_ON_DISK = "state-on-disk"  # 1 when the node keeps private state under a state-dir

# Train-reply metrics, read by the strategies.
NUM_EXAMPLES = "num-examples"  # |D_k|: size of the client's original train split
NUM_PROCESSED = "num-processed"  # samples passed through training this round, all epochs
EFFECTIVE_EXAMPLES = "effective-examples"  # FedReG's e_k
# Evaluate-reply metrics.
NUM_TEST = "num-test"
PERSONAL_CORRECT = "personal-correct"
GLOBAL_CORRECT = "global-correct"  # the global model on the client's test split
#: FedReG's λ in its personal prediction head_p + λ·head_g (``fedreg-personal`` weighted or
#: learned): the weight the client evaluated with.
PERSONAL_GLOBAL_WEIGHT = "personal-global-weight"
# Cost metrics of every reply (FedSeq-style comparisons, edge budgets).
NUM_TRAINED_PARAMS = "num-trained-params"  # distinct parameters updated this round
COMPUTE_SECONDS = "compute-seconds"  # the procedure's own work (training or evaluation)
HANDLER_SECONDS = "handler-seconds"  # the whole message handler, setup included
#: The handler's parts around the procedure: the run's configuration and the node's data
#: (decoded the first time a process serves the partition), and reading and writing the
#: node's private state under its state-dir (restore, then commit: fsynced and hashed).
SETUP_SECONDS = "setup-seconds"
STATE_SECONDS = "state-seconds"
STATE_RESETS = "state-resets"  # private state started afresh: a corrupt file, or lost versions
#: A reply's ConfigRecord naming the records that started afresh (key ``records``).
STATE_RESET_RECORDS = "state-reset-records"
#: The round of the newest private-state version the client holds after this message
#: (0: none); sent only by clients that keep their state under a state-dir.
STATE_ROUND = "state-round"
#: Reply metrics a server adds into the round's record when present: finite numbers >= 0,
#: and the counts whole (none is trusted: a text or NaN value would end or poison a run).
COST_SECONDS = (COMPUTE_SECONDS, HANDLER_SECONDS, SETUP_SECONDS, STATE_SECONDS)
COST_COUNTS = (NUM_TRAINED_PARAMS, STATE_RESETS)

#: A state key as the ServerApp makes it (a run folder's name): letters, digits, ``._-``,
#: starting with a letter or digit, no path separators, at most 200 characters.
STATE_KEY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def is_valid_state_key(key: str) -> bool:
    """True for keys of the form the ServerApp generates (never ``..`` or a path)."""
    return bool(STATE_KEY_PATTERN.fullmatch(key)) and ".." not in key
