"""Faults injected into a whole run (the real ServerApp and ClientApp handlers, in this
process): clients that raise, crafted replies, a server killed mid-round, crafted
state keys. Each test injects the fault and checks what the run says and keeps."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)

from fedreg_app import client_app, nodes
from fedreg_app.core.checkpoint import Checkpoint
from fedreg_app.core.config import ConfigError
from fedreg_app.core.data import PartitionKey, data_digest, split_digests
from fedreg_app.core.metrics import RoundRecord, client_error, rounds_sha256, status_problem
from fedreg_app.core.models import group_of, initial_model
from fedreg_app.core.partition_map import PartitionMap
from fedreg_app.core.persist import RUN_FOLDER_LOCK, FolderInUseError
from fedreg_app.core.protocol import (
    ARRAYS,
    COMPUTE_SECONDS,
    CONFIG,
    DATA,
    EFFECTIVE_EXAMPLES,
    HANDLER_SECONDS,
    HOST,
    HOST_KEYS,
    METRICS,
    NUM_EXAMPLES,
    NUM_PROCESSED,
    NUM_TEST,
    NUM_TRAINED_PARAMS,
    PARTITION_ID,
    PERSONAL_GLOBAL_WEIGHT,
    STATE_RESETS,
    STATE_ROUND,
)
from fedreg_app.core.records import from_record, to_record
from fedreg_app.core.training import EVAL_BATCH_ENV
from fedreg_app.registry import load_config
from strategies.fedreg import FedReGStrategy
from tests.fake_data import copy_dataset, write_image_dataset
from tests.holders import SERVERAPP, held_elsewhere
from tests.inprocess import (
    Fault,
    InProcessGrid,
    ServerKilled,
    as_a_task,
    assert_same_arrays,
    client_states,
    error_reply,
    final_model,
    flower_reason,
    results,
    run_server,
)

TRAIN, EVALUATE = MessageType.TRAIN, MessageType.EVALUATE


@pytest.fixture
def base(grey_dataset: Path, tmp_path: Path) -> dict[str, Any]:
    return {
        "algo": "fedreg", "dataset-path": str(grey_dataset), "local-epochs": 1,
        "fraction-train": 0.5, "min-partition-size": 5, "num-server-rounds": 3, "seed": 5,
        "results-dir": str(tmp_path / "results"),
    }  # fmt: skip


def raising(err: Exception):
    """A client that raised ``err``: the error reply Flower sends in its place."""
    return lambda msg, reply: error_reply(msg, flower_reason(err))


def test_a_client_failing_makes_the_run_degraded_and_the_personal_figure_partial(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """Partition 2 raises during round 2's evaluation: the run finishes ``degraded``, the
    round's all-client personal accuracy is null, the partial one is kept with its
    coverage, and the error is recorded with the node it came from."""
    faults = {(EVALUATE, 2, 2): raising(OSError("disk on fire"))}
    _, stopped = run_server(base, faults=faults)
    assert stopped is None
    document = results(tmp_path / "results")
    assert document["run"]["status"] == "degraded"
    round1, round2, round3 = document["rounds"]
    assert round1["personal_accuracy"] is not None and round1["eval_failures"] == 0
    assert round2["personal_accuracy"] is None and round2["personal_accuracy_std"] is None
    assert round2["personal_accuracy_answered"] is not None
    assert round2["eval_replies"] == 3 and round2["eval_failures"] == 1
    coverage = round2["personal_coverage"]
    assert (coverage["clients"], coverage["of_clients"]) == (3, 4)
    assert coverage["test_samples"] < coverage["of_test_samples"]
    from fedreg_tools.run_records import document_problem

    assert document_problem(document) is None  # a report reads it as written
    round2["personal_accuracy"] = round2["personal_accuracy_answered"]  # passed off as whole
    assert "round 2: personal_accuracy is" in document_problem(document)
    assert round2["errors"] == [{"phase": "evaluate", "error": "OSError: disk on fire",
                                 "nodes": [1002], "partitions": [2]}]  # fmt: skip
    assert "2" not in round2["client_accuracies"]
    answered = [r["personal_accuracy"] for r in (round1, round3)]
    assert document["best_personal_accuracy"] == max(answered)


def test_every_client_failing_fails_the_run_and_names_the_error(
    base: dict[str, Any], tmp_path: Path
) -> None:
    faults = {(TRAIN, 1, p): raising(RuntimeError("CUDA out of memory")) for p in range(4)}
    _, stopped = run_server(base, faults=faults)
    assert stopped is not None
    document = results(tmp_path / "results")
    assert document["run"]["status"] == "failed"
    assert "none of the 2 train replies was usable" in document["run"]["error"]
    assert "RuntimeError: CUDA out of memory" in document["run"]["error"]
    assert document["rounds"] == []


#: The reason Flower 1.42's simulation (Ray 2.55) gave for a ClientApp that raised
#: ``ValueError(...) from KeyError(...)``: verbatim, but for the paths.
RAY_REASON = (
    "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'\x1b[36mray::"
    "ClientAppActor.run()\x1b[39m (pid=1100, ip=192.0.2.2, actor_id=f3e19985dd"
    "d9ddc255223b4801000000, repr=<flwr.simulation.ray_transport.ray_actor."
    "ClientAppActor object at 0x7fd960408710>)\n"
    "    ~~^^^^^^^^^^^\n"
    "KeyError: 'weights'\n"
    "\n"
    "The above exception was the direct cause of the following exception:\n"
    "\n"
    "\x1b[36mray::ClientAppActor.run()\x1b[39m (pid=1100, ip=192.0.2.2, actor_id="
    "f3e19985ddd9ddc255223b4801000000, repr=<flwr.simulation.ray_transport."
    "ray_actor.ClientAppActor object at 0x7fd960408710>)\n"
    '  File "/home/user/.venv/lib/python3.11/site-packages/flwr/simulation/'
    'ray_transport/ray_actor.py", line 59, in run\n'
    "    out_message = app(message=message, context=context)\n"
    "                  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    '  File "/home/user/.venv/lib/python3.11/site-packages/flwr/clientapp/c'
    'lient_app.py", line 161, in __call__\n'
    "    return self._registered_funcs[full_name](message, context)\n"
    "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    '  File "/home/user/app/client.py", line 15, in train\n'
    '    raise ValueError("no weights in the message") from err\n'
    "ValueError: no weights in the message\n"
    "\n"
    "The above exception was the direct cause of the following exception:\n"
    "\n"
    "\x1b[36mray::ClientAppActor.run()\x1b[39m (pid=1100, ip=192.0.2.2, actor_id="
    "f3e19985ddd9ddc255223b4801000000, repr=<flwr.simulation.ray_transport."
    "ray_actor.ClientAppActor object at 0x7fd960408710>)\n"
    "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    '  File "/home/user/.venv/lib/python3.11/site-packages/flwr/simulation/'
    'ray_transport/ray_actor.py", line 65, in run\n'
    "    raise ClientAppException(str(ex)) from ex\n"
    "flwr.clientapp.client_app.ClientAppException: \n"
    "Exception ClientAppException occurred. Message: no weights in the mess"
    "age'>"
)


@pytest.mark.parametrize(
    ("reason", "named"),
    [
        (RAY_REASON, "ValueError: no weights in the message"),
        (
            flower_reason(OSError(28, "No space left on device")),
            "OSError: [Errno 28] No space left on device",
        ),
        (flower_reason(KeyError("head_p")), "KeyError: 'head_p'"),
        (flower_reason(ValueError("")), "ValueError"),
        (
            flower_reason(RuntimeError("CUDA out of memory.\nTried to allocate 2 GiB")),
            "RuntimeError: CUDA out of memory.",
        ),
        (
            "An exception was raised when attempting to load `ClientApp`",
            "An exception was raised when attempting to load `ClientApp`",
        ),
    ],
)
def test_a_client_error_is_recorded_as_the_exception_the_client_raised(
    reason: str, named: str
) -> None:
    """Flower wraps a ClientApp's exception as ``<class 'T'>:<'message'>``; in the
    simulation T is Ray's task error and the message a chained traceback with colour
    codes and Flower's own wrapper. The record names the client's exception, one line."""
    assert client_error(reason) == named


@pytest.mark.parametrize("phase", [TRAIN, EVALUATE])
def test_a_client_that_never_answers_is_given_up_after_the_reply_timeout(
    phase: str, base: dict[str, Any], tmp_path: Path
) -> None:
    """Partition 1 goes silent in round 2 (a device that dropped off the network without
    an error): the server stops waiting after `reply-timeout`, counts it as a failure that
    says so, and the round's figures and model equal those of a run in which the same
    client replied with an error."""

    def silent(msg: Message, reply: Message | None) -> None:
        return None

    config = {**base, "fraction-train": 1.0, "num-server-rounds": 2, "reply-timeout": 1.0}
    started = time.monotonic()
    run_server({**config, "results-dir": str(tmp_path / "silent")},
               faults={(phase, 2, 1): silent})  # fmt: skip
    waited = time.monotonic() - started
    run_server({**config, "results-dir": str(tmp_path / "failed")},
               faults={(phase, 2, 1): raising(ConnectionError("node gone"))})  # fmt: skip
    silent_run, failed_run = results(tmp_path / "silent"), results(tmp_path / "failed")
    record = silent_run["rounds"][1]
    failures = "train_failures" if phase == TRAIN else "eval_failures"
    assert record[failures] == 1 and silent_run["run"]["status"] == "degraded"
    assert record["errors"] == [{"phase": "train" if phase == TRAIN else "evaluate",
                                 "error": "no reply within reply-timeout=1s",
                                 "nodes": [1001], "partitions": [1]}]  # fmt: skip
    assert waited >= 1.0  # it did wait for the silent client
    assert per_round(silent_run) == per_round(failed_run)
    assert evaluation(record) == evaluation(failed_run["rounds"][1])
    assert_same_arrays(final_model(tmp_path / "silent"), final_model(tmp_path / "failed"))


def test_a_run_that_cannot_start_still_writes_failed_results(
    base: dict[str, Any], tmp_path: Path
) -> None:
    _, stopped = run_server({**base, "dataset-path": str(tmp_path / "missing")})
    assert stopped is not None
    document = results(tmp_path / "results")
    assert document["run"]["status"] == "failed"
    assert (
        "dataset-path=" in document["run"]["error"] and "train.parquet" in document["run"]["error"]
    )


def test_min_train_replies_above_the_clients_per_round_fails_before_training(
    base: dict[str, Any], tmp_path: Path
) -> None:
    grid, stopped = run_server({**base, "min-train-replies": 3})  # 4 clients x 0.5 = 2
    assert "min-train-replies=3 is not allowed: expected at most 2" in str(stopped)
    assert not [d for d in grid.delivered if d[0] == TRAIN]
    assert results(tmp_path / "results")["run"]["status"] == "failed"


def test_a_bad_eval_batch_in_the_environment_fails_before_any_message(
    base: dict[str, Any], tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv(EVAL_BATCH_ENV, "2")
    grid, stopped = run_server(base)
    assert f"{EVAL_BATCH_ENV}='2' is not allowed: expected an integer >= 64" in str(stopped)
    assert not grid.delivered
    document = results(tmp_path / "results")
    assert document["run"]["status"] == "failed"
    assert EVAL_BATCH_ENV in document["run"]["error"]


def craft(change):
    """A fault that rewrites the honest reply's arrays / metrics with ``change``."""

    def fault(msg: Message, reply: Message | None) -> Message:
        arrays = from_record(reply.content[ARRAYS])
        metrics = dict(reply.content[METRICS])
        change(arrays, metrics)
        content = RecordDict({ARRAYS: to_record(arrays), METRICS: MetricRecord(metrics),
                              DATA: reply.content[DATA]})  # fmt: skip
        return Message(content, reply_to=msg)

    return fault


def _nan(arrays, metrics):
    arrays["base.0.weight"][0] = np.nan


def _shape(arrays, metrics):
    arrays["base.0.bias"] = np.zeros(7, dtype=np.float32)


def _extra_key(arrays, metrics):
    arrays["head_p.0.weight"] = np.zeros((2, 2), dtype=np.float32)


def _missing_key(arrays, metrics):
    del arrays["base.0.bias"]


def _dtype(arrays, metrics):
    arrays["base.0.bias"] = arrays["base.0.bias"].astype(np.float64)


def _other_partition(arrays, metrics):
    metrics[PARTITION_ID] = (metrics[PARTITION_ID] + 1) % 4


def _negative_weight(arrays, metrics):
    metrics[NUM_EXAMPLES] = -100


def _infinite_weight(arrays, metrics):
    metrics[NUM_EXAMPLES] = float("inf")


def _cost_list(arrays, metrics):
    metrics[COMPUTE_SECONDS] = [1.0, 2.0, 3.0]  # a MetricRecord takes lists of numbers


def _cost_nan(arrays, metrics):
    metrics[HANDLER_SECONDS] = float("nan")


def _fractional_count(arrays, metrics):
    metrics[NUM_TRAINED_PARAMS] = 2.5


def _huge_seconds(arrays, metrics):
    metrics[COMPUTE_SECONDS] = 1e308  # finite, but four such replies sum to inf


def _huge_trained_params(arrays, metrics):
    metrics[NUM_TRAINED_PARAMS] = 10**15


def _fractional_processed(arrays, metrics):
    metrics[NUM_PROCESSED] = 2.5


def _state_round_text(arrays, metrics):
    metrics[STATE_ROUND] = 1.5


def _inflated_first_claim(arrays, metrics):
    metrics[NUM_EXAMPLES] = 10**12  # its first reply: nothing said before to compare with


def _huge_but_finite(arrays, metrics):
    arrays["base.0.weight"] *= np.float32(1e30)  # finite float32, every check passes


def _inflated_first_head_weight(arrays, metrics):
    metrics[EFFECTIVE_EXAMPLES] = 10**12  # e_k = sum_c min(n_c, t) <= |D_k|


CRAFTED = {
    "huge but finite": (_huge_but_finite, "more than update-norm-factor=100 times"),
    "inflated first claim": (_inflated_first_claim, "num-examples=1000000000000, but partition"),
    "inflated first e_k": (
        _inflated_first_head_weight,
        "effective-examples=1000000000000 is above",
    ),
    "cost list": (_cost_list, "compute-seconds=[1.0, 2.0, 3.0] is missing or not a number"),
    "cost nan": (_cost_nan, "handler-seconds=nan is not a finite number"),
    "fractional count": (_fractional_count, "num-trained-params=2.5 is not a whole count"),
    "huge seconds": (_huge_seconds, "compute-seconds=1e+308 is more than the"),
    "huge trained params": (_huge_trained_params, "num-trained-params=1000000000000000 is above"),
    "fractional processed": (_fractional_processed, "num-processed=2.5 is not a whole count"),
    "state round not whole": (_state_round_text, "state-round=1.5 is not a round"),
    "nan": (_nan, "NaN or infinite"),
    "shape": (_shape, "is float32[7], expected float32["),
    "extra key": (_extra_key, "unexpected ['head_p.0.weight']"),
    "missing key": (_missing_key, "missing ['base.0.bias']"),
    "dtype": (_dtype, "is float64["),
    "other partition": (_other_partition, "sent to partition"),
    "negative weight": (_negative_weight, "num-examples=-100"),
    "infinite weight": (_infinite_weight, "num-examples=inf"),
}


def first_sampled(run_config: dict[str, Any]) -> int:
    """The first partition the seeded sampler trains in round 1."""
    strategy = FedReGStrategy(load_config(run_config))
    strategy.set_partitions(PartitionMap(4, {p: 1000 + p for p in range(4)}))
    return strategy.sample_partitions(1)[0]


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_a_crafted_training_reply_is_dropped_never_averaged(
    name: str, base: dict[str, Any], tmp_path: Path
) -> None:
    """The crafted reply's run ends with exactly the model of a run in which that client
    simply failed: it was counted as a failure and not averaged in."""
    change, reason = CRAFTED[name]
    config = {**base, "num-server-rounds": 1}
    victim = first_sampled(config)
    crafted_dir, failed_dir = tmp_path / "crafted", tmp_path / "failed"
    dropped = raising(ConnectionError("dropped"))
    for folder, fault in ((failed_dir, dropped), (crafted_dir, craft(change))):
        _, stopped = run_server({**config, "results-dir": str(folder)},
                                faults={(TRAIN, 1, victim): fault})  # fmt: skip
        assert stopped is None
    record = results(crafted_dir)["rounds"][0]
    assert (record["train_replies"], record["train_failures"]) == (1, 1)
    assert reason in record["errors"][0]["error"], record["errors"]
    assert results(crafted_dir)["run"]["status"] == "degraded"
    crafted, dropped = final_model(crafted_dir), final_model(failed_dir)
    assert crafted.keys() == dropped.keys()
    assert all(np.array_equal(crafted[k], dropped[k]) for k in crafted)
    assert all(np.isfinite(v).all() for v in crafted.values())


def test_without_the_bound_a_huge_but_finite_reply_is_averaged_in(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """The fault the bound refuses is real: with ``update-norm-factor = 0`` the same
    crafted reply passes every per-reply check and the run ends with a global model of
    values near 1e29 (honest: below 1)."""
    config = {**base, "num-server-rounds": 1, "update-norm-factor": 0.0}
    victim = first_sampled(config)
    run_server(config, faults={(TRAIN, 1, victim): craft(_huge_but_finite)})
    record = results(tmp_path / "results")["rounds"][0]
    assert (record["train_replies"], record["train_failures"]) == (2, 0)
    assert np.abs(final_model(tmp_path / "results")["base.0.weight"]).max() > 1e25


def test_a_crafted_evaluation_reply_is_not_counted(base: dict[str, Any], tmp_path: Path) -> None:
    def inflate(msg: Message, reply: Message | None) -> Message:
        metrics = dict(reply.content[METRICS])
        metrics["personal-correct"] = metrics[NUM_TEST] + 50  # more correct than tested
        return Message(RecordDict({METRICS: MetricRecord(metrics), DATA: reply.content[DATA]}),
                       reply_to=msg)  # fmt: skip

    record = evaluated_with(base, tmp_path / "crafted", 1, inflate)
    assert record["eval_failures"] == 1 and record["personal_accuracy"] is None
    assert "personal-correct" in record["errors"][0]["error"], record["errors"]
    assert evaluation(record) == evaluation(evaluated_with(base, tmp_path / "failed", 1, None))


@pytest.mark.parametrize("weight", [-1.0, float("nan"), float("inf")])
def test_an_evaluation_reply_with_an_impossible_head_weight_is_not_counted(
    weight: float, base: dict[str, Any], tmp_path: Path
) -> None:
    """FedReG's reported λ (``personal-global-weight``) enters the round's mean: a negative
    or non-finite one is refused with the reply, as any impossible metric is."""

    def lie(msg: Message, reply: Message | None) -> Message:
        metrics = {**dict(reply.content[METRICS]), PERSONAL_GLOBAL_WEIGHT: weight}
        return Message(RecordDict({METRICS: MetricRecord(metrics), DATA: reply.content[DATA]}),
                       reply_to=msg)  # fmt: skip

    record = evaluated_with(base, tmp_path / "crafted", 1, lie)
    assert record["eval_failures"] == 1, record["errors"]
    assert PERSONAL_GLOBAL_WEIGHT in record["errors"][0]["error"], record["errors"]
    assert record["personal_global_weight"] is None


def test_a_reply_without_its_data_record_is_not_counted(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """A reply that does not say which data its node holds is refused like one that names
    other data, and counted as if the client had not answered."""

    def drop_data(msg: Message, reply: Message | None) -> Message:
        kept = {name: record for name, record in reply.content.items() if name != DATA}
        return Message(RecordDict(kept), reply_to=msg)

    record = evaluated_with(base, tmp_path / "crafted", 1, drop_data)
    assert record["eval_failures"] == 1 and "data digest None" in record["errors"][0]["error"]
    assert evaluation(record) == evaluation(evaluated_with(base, tmp_path / "failed", 1, None))


def evaluated_with(
    base: dict[str, Any], results_dir: Path, in_round: int, fault: Fault | None, rounds: int = 1
) -> dict[str, Any]:
    """Round ``in_round``'s record of a run in which partition 3's evaluation reply of that
    round is ``fault``'s (None: the client raised)."""
    fault = fault or raising(OSError("evaluation failed"))
    config = {**base, "num-server-rounds": rounds, "results-dir": str(results_dir)}
    run_server(config, faults={(EVALUATE, in_round, 3): fault})
    return results(results_dir)["rounds"][in_round - 1]


def evaluation(record: dict[str, Any]) -> tuple:
    """What a round's personal figures were made of: the answered accuracy, its coverage,
    each client's accuracy."""
    return (record["personal_accuracy_answered"], record["personal_coverage"],
            record["client_accuracies"])  # fmt: skip


def test_an_evaluation_reply_with_a_cost_that_would_end_the_run_is_dropped(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """`int(inf)` of a reply's state-resets would raise after the reply was accepted and
    end the run `failed`: the reply is dropped and the run goes on."""

    def infinite_resets(msg: Message, reply: Message | None) -> Message:
        metrics = {**dict(reply.content[METRICS]), STATE_RESETS: float("inf")}
        return Message(RecordDict({METRICS: MetricRecord(metrics), DATA: reply.content[DATA]}),
                       reply_to=msg)  # fmt: skip

    run_server({**base, "num-server-rounds": 2}, faults={(EVALUATE, 1, 3): infinite_resets})
    document = results(tmp_path / "results")
    assert document["run"]["status"] == "degraded" and len(document["rounds"]) == 2
    record = document["rounds"][0]
    assert record["eval_failures"] == 1 and "state-resets=inf" in record["errors"][0]["error"]


def test_a_reply_flooding_its_host_record_leaves_only_the_known_keys(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """2,000 host keys of 5 kB each made results.json 10 MB, rewritten every round: only
    the known keys are kept, each cut to 200 characters."""

    def flood(msg: Message, reply: Message | None) -> Message:
        said = {key: "x" * 5000 for key in (*HOST_KEYS, *(f"k{i}" for i in range(2000)))}
        content = RecordDict({ARRAYS: reply.content[ARRAYS], METRICS: reply.content[METRICS],
                              HOST: ConfigRecord(said), DATA: reply.content[DATA]})  # fmt: skip
        return Message(content, reply_to=msg)

    victim = first_sampled(base)
    run_server({**base, "num-server-rounds": 1}, faults={(TRAIN, 1, victim): flood})
    hosts = results(tmp_path / "results")["rounds"][0]["client_hosts"]
    assert set(hosts[str(victim)]) == set(HOST_KEYS)
    assert all(value == "x" * 200 for value in hosts[str(victim)].values())
    size = next((tmp_path / "results").glob("*/results.json")).stat().st_size
    assert size < 100_000


def test_finite_replies_whose_aggregate_overflows_stop_the_run_before_a_checkpoint(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """FedDyn's `mean - h / alpha` over replies of 3e38 (each a finite float32) overflows
    to inf, which every client would refuse. The run stops in that round with the reason,
    and its last checkpoint is the honest round before."""

    def huge(arrays, metrics):
        for value in arrays.values():
            value[...] = 3.0e38

    faults = {(TRAIN, 2, pid): craft(huge) for pid in range(4)}
    config = {**base, "algo": "feddyn", "num-server-rounds": 3}
    grid, stopped = run_server(config, faults=faults)
    document = results(tmp_path / "results")
    assert document["run"]["status"] == "failed", document["run"]
    assert "round 2: the new global model aggregated from 2 checked replies holds NaN or " \
           "infinite values" in document["run"]["error"]  # fmt: skip
    assert [r["round"] for r in document["rounds"]] == [1]
    sent_after = [d for d in grid.delivered if d[1] > 2 or (d[0] == EVALUATE and d[1] == 2)]
    assert sent_after == []  # the model was sent to no client, for evaluation or training
    [folder] = list((tmp_path / "results").glob("*/"))
    assert Checkpoint.load(folder)[0].round == 1
    model = final_model(tmp_path / "results")
    assert model and all(np.isfinite(v).all() and np.abs(v).max() < 1e3 for v in model.values())


def test_a_first_evaluation_reply_claiming_a_huge_test_split_is_not_counted(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """Round 1, partition 3's first reply: 10^12 tested, 10^12 correct. Checked only
    against its own earlier claims, it would make the run's G and P 0.99999999993 (honest:
    about 0.1). The server computes every partition's split sizes from the seeded
    partitioning the nodes repeat, so a first claim is checked too."""

    def huge(msg: Message, reply: Message | None) -> Message:
        metrics = dict(reply.content[METRICS])
        for key in (NUM_TEST, "personal-correct", "global-correct"):
            metrics[key] = 10**12
        return Message(RecordDict({METRICS: MetricRecord(metrics), DATA: reply.content[DATA]}),
                       reply_to=msg)  # fmt: skip

    run_server({**base, "num-server-rounds": 1}, faults={(EVALUATE, 1, 3): huge})
    record = results(tmp_path / "results")["rounds"][0]
    assert record["eval_failures"] == 1
    assert "num-test=1000000000000, but partition 3's test split has" in \
        record["errors"][0]["error"]  # fmt: skip
    assert record["personal_accuracy"] is None and record["personal_accuracy_answered"] < 0.9


def _grown_weight(arrays, metrics):
    # FedReG's global-head weight e_k, grown but still under |D_k|: the server bounds it by
    # the train split it knows, so only the partition's own earlier claim can tell
    metrics[EFFECTIVE_EXAMPLES] = metrics[EFFECTIVE_EXAMPLES] + 10


def test_a_client_that_grows_its_weight_after_an_honest_round_is_dropped_even_across_a_resume(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """Every client trains every round. Partition 0 answers honestly in round 1, then
    claims a larger head weight in round 2 (to weigh more in the average), after the server
    was killed and resumed between the rounds: the claim is checked against what the
    partition said before (kept in the checkpoint), dropped, and the round's model is
    bit-identical to a run in which that client simply failed in round 2."""
    config = {**base, "fraction-train": 1.0, "num-server-rounds": 2}
    failed = {**config, "results-dir": str(tmp_path / "failed"), "state-dir": str(tmp_path / "sf")}
    run_server(failed, faults={(TRAIN, 2, 0): raising(ConnectionError("dropped"))})
    part = {**config, "results-dir": str(tmp_path / "part"), "state-dir": str(tmp_path / "sp")}
    _, stopped = run_server(part, run_id=2, kill_after=(TRAIN, 2, 1))
    assert isinstance(stopped, ServerKilled)
    assert results(tmp_path / "part")["run"]["status"] == "running"  # as a SIGKILL left it
    [run_folder] = list((tmp_path / "part").glob("*/"))
    _, stopped = run_server({**part, "resume": str(run_folder)}, run_id=3,
                            faults={(TRAIN, 2, 0): craft(_grown_weight)})  # fmt: skip
    assert stopped is None
    record = results(tmp_path / "part")["rounds"][1]
    assert (record["train_replies"], record["train_failures"]) == (3, 1)
    assert "partition 0 said" in record["errors"][0]["error"], record["errors"]
    assert_same_arrays(final_model(tmp_path / "part"), final_model(tmp_path / "failed"))


def _test_size_changed(metrics):
    metrics[NUM_TEST] = metrics[NUM_TEST] + 7
    metrics["personal-correct"] = metrics[NUM_TEST]  # all "correct", inside the new size


def _fractional_count(metrics):
    metrics["personal-correct"] = metrics["personal-correct"] + 0.5


@pytest.mark.parametrize(
    ("change", "reason", "in_round"),
    [(_test_size_changed, "'s test split has", 2),
     (_fractional_count, "is not a whole count", 1)],
)  # fmt: skip
def test_an_evaluation_reply_that_changes_its_test_size_or_counts_fractions_is_not_counted(
    change, reason: str, in_round: int, base: dict[str, Any], tmp_path: Path
) -> None:
    def fault(msg: Message, reply: Message | None) -> Message:
        metrics = dict(reply.content[METRICS])
        change(metrics)
        return Message(RecordDict({METRICS: MetricRecord(metrics), DATA: reply.content[DATA]}),
                       reply_to=msg)  # fmt: skip

    record = evaluated_with(base, tmp_path / "crafted", in_round, fault, rounds=2)
    rounds = results(tmp_path / "crafted")["rounds"]
    assert record["eval_failures"] == 1 and record["personal_accuracy"] is None
    assert reason in record["errors"][0]["error"], record["errors"]
    assert all(r["eval_failures"] == 0 for r in rounds if r != record)
    failed = evaluated_with(base, tmp_path / "failed", in_round, None, rounds=2)
    assert evaluation(record) == evaluation(failed)  # as if the client had not answered


# ------------------------------------------------------------------- resume
def per_round(document: dict[str, Any]) -> list[tuple]:
    return [(r["round"], r["sampled_clients"], r["global_accuracy"], r["personal_accuracy"])
            for r in document["rounds"]]  # fmt: skip


@pytest.mark.parametrize("algo", ["fedreg", "ditto", "feddyn"])
def test_server_killed_after_a_client_saved_its_next_state_resumes_exactly(
    algo: str, base: dict[str, Any], tmp_path: Path
) -> None:
    """Kill the server in round 2's training after one client replied (its round-2 state
    is on disk, the server's checkpoint is round 1's), resume: every round's numbers
    equal the uninterrupted run's. Before versioned state the resumed client started
    round 2 again from the killed attempt's state. (Every algorithm is killed in its last
    round's evaluation and resumed in ``test_algorithm_runs.py``.)"""
    config = {**base, "algo": algo, "num-server-rounds": 3}
    whole = {**config, "results-dir": str(tmp_path / "whole"), "state-dir": str(tmp_path / "sw")}
    run_server(whole)
    part = {**config, "results-dir": str(tmp_path / "part"), "state-dir": str(tmp_path / "sp")}
    grid, stopped = run_server(part, run_id=2, kill_after=(TRAIN, 2, 1))
    assert isinstance(stopped, ServerKilled)
    assert results(tmp_path / "part")["run"]["status"] == "running"  # as a SIGKILL left it
    [run_folder] = list((tmp_path / "part").glob("*/"))
    state = json.loads((run_folder / "checkpoint" / "state.json").read_text())
    assert state["round"] == 1  # the checkpoint is round 1's ...
    ahead = list((tmp_path / "sp").glob("runs/*/partition-*/round-000002"))
    assert len(ahead) == 1  # ... but one client already committed its round-2 state
    unfinished_write = run_folder / ".results.json.x7k2m9.tmp"  # as a kill mid-write leaves
    unfinished_write.write_text('{"run": ')
    _, stopped = run_server({**part, "resume": str(run_folder)}, run_id=3)
    assert stopped is None and not unfinished_write.exists()
    expected, resumed = results(tmp_path / "whole"), results(tmp_path / "part")
    assert resumed["run"]["status"] == "completed"
    assert per_round(resumed) == per_round(expected)
    # accuracies on tiny data are coarse: the models themselves must be bit-identical
    assert_same_arrays(final_model(tmp_path / "part"), final_model(tmp_path / "whole"))
    assert_same_arrays(client_states(tmp_path / "sp"), client_states(tmp_path / "sw"))


def test_a_run_folder_another_serverapp_still_writes_is_not_resumed(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """A run killed in round 2, and something still holding its folder (a real process:
    the simulation a killed runner left behind, or the same resume given twice). The
    resume stops before it reads or writes the run: the folder's files are byte-identical,
    the error (in a failed run's own results.json) names the holder. Once the holder is
    SIGKILLed the kernel drops its lock, and the resume goes through."""
    config = {**base, "state-dir": str(tmp_path / "state")}
    _, stopped = run_server(config, kill_after=(TRAIN, 2, 1))
    assert isinstance(stopped, ServerKilled)
    assert results(tmp_path / "results")["run"]["status"] == "running"  # as a SIGKILL left it
    [folder] = [p.parent for p in (tmp_path / "results").glob("*/results.json")]
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    with held_elsewhere(folder):
        resumed = {**config, "resume": str(folder), "results-dir": str(tmp_path / "second")}
        _, stopped = run_server(resumed, run_id=2)
        assert isinstance(stopped, FolderInUseError)
        assert f"{folder} is in use by {SERVERAPP} since" in str(stopped)
        after = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
        assert {k: v for k, v in after.items() if k != RUN_FOLDER_LOCK} == {
            k: v for k, v in before.items() if k != RUN_FOLDER_LOCK
        }
        failed = results(tmp_path / "second")["run"]
        assert failed["status"] == "failed" and "is in use by a ServerApp" in failed["error"]
    _, stopped = run_server({**config, "resume": str(folder)}, run_id=3)
    assert stopped is None
    assert results(tmp_path / "results")["run"]["status"] == "completed"
    assert (folder / RUN_FOLDER_LOCK).read_text() == ""  # released at the end


def results_of(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "results.json").read_text())


def killed_in_round_2(config: dict[str, Any], tmp_path: Path) -> Path:
    """A FedReG run (clients keep state) killed in round 2: its run folder."""
    _, stopped = run_server(config, kill_after=(TRAIN, 2, 1))
    assert isinstance(stopped, ServerKilled)
    assert results(tmp_path / "results")["run"]["status"] == "running"  # as a SIGKILL left it
    [folder] = [p.parent for p in (tmp_path / "results").glob("*/results.json")]
    return folder


def test_a_copy_of_a_run_folder_is_not_resumed_under_its_new_name(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """A copied run folder resumed under its new name wrote its clients' state under the
    original's key; the original, resumed next, found its clients' state a round ahead,
    started them afresh and still said `completed`. The copy's resume is refused (naming
    the folder its checkpoint belongs to) before it touches the state; the original then
    resumes to the uninterrupted run's figures."""
    config = {**base, "state-dir": str(tmp_path / "state")}
    folder = killed_in_round_2(config, tmp_path)
    copy = folder.with_name(folder.name + "-copy")
    shutil.copytree(folder, copy)
    state_before = sorted(str(p) for p in (tmp_path / "state").rglob("*"))
    _, stopped = run_server({**config, "resume": str(copy)}, run_id=2)
    assert isinstance(stopped, ConfigError) and f"belongs to the run folder {folder.name!r}" \
        in str(stopped)  # fmt: skip
    assert sorted(str(p) for p in (tmp_path / "state").rglob("*")) == state_before
    _, stopped = run_server({**config, "resume": str(folder)}, run_id=3)
    assert stopped is None
    whole = {**config, "results-dir": str(tmp_path / "whole"), "state-dir": str(tmp_path / "s2")}
    run_server(whole)
    assert per_round(results_of(folder)) == per_round(results(tmp_path / "whole"))


def test_a_resume_on_other_clients_or_other_data_is_refused_before_any_work(
    base: dict[str, Any], tmp_path: Path, grey_dataset: Path
) -> None:
    """A checkpoint that kept only the run config would let a resume on 5 partitions
    instead of 4 (another num-supernodes) or on a dataset replaced at its path train the
    checkpoint's model on other clients' data and end `completed`, caught (if at all)
    only when its record was read. The checkpoint records its clients (number, split sizes, content
    digests) and these resumes, and one on data of the same sizes with one image changed,
    are refused before a message is sent, the folder untouched; the original clients then
    resume to the uninterrupted figures."""
    config = {**base, "state-dir": str(tmp_path / "state")}
    folder = killed_in_round_2(config, tmp_path)
    clients = json.loads((folder / "checkpoint" / "state.json").read_text())["clients"]
    assert clients["num_clients"] == 4 and len(clients["split_sizes"]) == 4
    assert len(set(clients["split_digests"])) == 4
    recorded = results_of(folder)["run"]["data_digest"]
    assert recorded == data_digest(dict(enumerate(clients["split_digests"])))
    before = (folder / "results.json").read_bytes()
    resumed = {**config, "resume": str(folder), "results-dir": str(tmp_path / "second")}
    grid, stopped = run_server(resumed, num_partitions=5, run_id=2)
    assert isinstance(stopped, ConfigError)
    assert "5 clients (partitions) is not allowed: the checkpoint was made with 4" in str(stopped)
    assert not [phase for phase, _, _ in grid.delivered if phase == TRAIN]
    # the same files with fewer images: a re-download or re-conversion at the same path
    other_data = write_image_dataset(tmp_path / "other", n_train=240, seed=0)
    _, stopped = run_server({**resumed, "dataset-path": str(other_data)}, run_id=3)
    assert isinstance(stopped, ConfigError)
    assert "the data are not the ones the run was trained on" in str(stopped)
    # the same sizes and labels, one image re-encoded with one pixel changed
    repainted = copy_dataset(grey_dataset, tmp_path / "repainted", repaint=5)
    _, stopped = run_server({**resumed, "dataset-path": str(repainted)}, run_id=6)
    assert isinstance(stopped, ConfigError) and "now holds other samples" in str(stopped)
    assert (folder / "results.json").read_bytes() == before
    legacy, _ = Checkpoint.load(folder)  # as an earlier version saved it: no clients record
    legacy.clients = None
    legacy.save(folder)
    _, stopped = run_server(resumed, num_partitions=5, run_id=5)
    assert isinstance(stopped, ConfigError) and "made with 4" in str(stopped)  # results.json's
    moved = shutil.copytree(grey_dataset, tmp_path / "moved")  # a move keeps the data
    _, stopped = run_server({**config, "resume": str(folder), "dataset-path": str(moved)},
                            run_id=4)  # fmt: skip
    assert stopped is None
    whole = {**config, "results-dir": str(tmp_path / "whole"), "state-dir": str(tmp_path / "s2")}
    run_server(whole)
    assert per_round(results_of(folder)) == per_round(results(tmp_path / "whole"))


def test_a_node_whose_copy_of_the_data_holds_other_samples_is_refused_by_its_digest(
    base: dict[str, Any], tmp_path: Path, grey_dataset: Path
) -> None:
    """Deployed nodes read their own copies (node config dataset-path). Sample counts alone
    would let a node whose copy holds other samples of the same sizes (here one image
    with one pixel changed) train and evaluate on them unnoticed, so every reply names the
    digest of the data the node holds: that partition's replies are refused, named, and
    the run is `degraded`; the other partitions' are counted."""
    repainted = copy_dataset(grey_dataset, tmp_path / "repainted", repaint=5)
    ours, theirs = (split_digests(PartitionKey.from_config(load_config(c), 4))
                    for c in (base, {**base, "dataset-path": str(repainted)}))  # fmt: skip
    [changed] = [p for p, d in ours.items() if d != theirs[p]]
    config = {**base, "num-server-rounds": 2}
    _, stopped = run_server(config, node_config={"dataset-path": str(repainted)})
    assert stopped is None
    document = results(tmp_path / "results")
    assert document["run"]["status"] == "degraded"
    errors = [e for r in document["rounds"] for e in r["errors"]]
    assert errors and all(e["partitions"] == [changed] for e in errors), errors
    assert all("the node's dataset-path holds other data" in e["error"] for e in errors)
    assert {e["phase"] for e in errors} >= {"evaluate"}
    assert all(str(changed) not in r["client_accuracies"] for r in document["rounds"])


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda rounds: rounds.pop(0), "it holds 0 rounds, fewer than the checkpoint's"),
        (lambda rounds: rounds[0].update(global_accuracy=1.7), "round 1: global_accuracy is 1.7"),
        (lambda rounds: rounds[0].update(newer_key=1), "keys this version does not know"),
    ],
)
def test_a_resume_does_not_carry_damaged_rounds_into_the_finished_record(
    base: dict[str, Any], tmp_path: Path, damage, problem: str
) -> None:
    """The rounds before the checkpoint are kept from results.json: a hole there would end
    as a `completed` run with rounds [2, 3] only, an accuracy of 1.7 would become its
    best G. The resume is refused before it writes, the folder untouched."""
    config = {**base, "state-dir": str(tmp_path / "state")}
    folder = killed_in_round_2(config, tmp_path)
    document = results_of(folder)
    damage(document["rounds"])
    (folder / "results.json").write_text(json.dumps(document))
    before = (folder / "results.json").read_bytes()
    resumed = {**config, "resume": str(folder), "results-dir": str(tmp_path / "second")}
    _, stopped = run_server(resumed, run_id=2)
    assert stopped is not None and problem in str(stopped)
    assert (folder / "results.json").read_bytes() == before
    failed = results(tmp_path / "second")["run"]
    assert failed["status"] == "failed" and problem in failed["error"]


@pytest.mark.parametrize("signal_exit", [SystemExit(0), KeyboardInterrupt()])
def test_a_serverapp_stopped_by_a_signal_says_stopped_and_resumes(
    base: dict[str, Any], tmp_path: Path, signal_exit: BaseException
) -> None:
    """In a deployment Flower turns SIGTERM into `sys.exit(0)` inside the ServerApp. The
    run must not read `failed` (`SystemExit: 0`), which the runner restarts from round 1:
    it reads `stopped` after its last checkpoint, and its resume ends as the whole run: the
    same rounds, global model and clients' state as an uninterrupted run, round 1's
    record as the stopped run wrote it."""
    whole = {**base, "results-dir": str(tmp_path / "whole"), "state-dir": str(tmp_path / "sw")}
    assert run_server(whole)[1] is None
    config = {**base, "state-dir": str(tmp_path / "state")}

    def stop(msg: Message, reply: Message | None) -> Message:
        raise signal_exit

    _, stopped = run_server(config, faults={(TRAIN, 2, pid): stop for pid in range(4)})
    assert stopped is signal_exit
    [folder] = [p.parent for p in (tmp_path / "results").glob("*/results.json")]
    run = results_of(folder)["run"]
    assert run["status"] == "stopped" and run["stopped"]["after_round"] == 1, run
    round_1 = results_of(folder)["rounds"]
    assert [r["round"] for r in round_1] == [1]
    _, stopped = run_server({**config, "resume": str(folder)}, run_id=3)
    resumed, expected = results_of(folder), results(tmp_path / "whole")
    assert stopped is None and resumed["run"]["status"] == "completed"
    assert resumed["rounds"][:1] == round_1
    assert per_round(resumed) == per_round(expected)
    assert_same_arrays(final_model(tmp_path / "results"), final_model(tmp_path / "whole"))
    assert_same_arrays(client_states(tmp_path / "state"), client_states(tmp_path / "sw"))


def kill_after_checkpoint(
    monkeypatch: pytest.MonkeyPatch, of_round: int, run_config: dict[str, Any]
) -> None:
    """The server dies right after round ``of_round``'s checkpoint is committed, before
    anything else runs (the results' final status, the next round): a SIGKILL there."""
    from fedreg_app import server_app

    commit = server_app.save_checkpoint

    def then_die(folder: Path, server_round: int, *args: Any) -> None:
        commit(folder, server_round, *args)
        if server_round == of_round:
            raise ServerKilled(f"killed after round {server_round}'s checkpoint", run_config)

    monkeypatch.setattr(server_app, "save_checkpoint", then_die)


@pytest.mark.parametrize("ends_early", [False, True])
def test_server_killed_after_its_last_checkpoint_resumes_to_the_same_end(
    ends_early: bool, base: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after the checkpoint of the run's last round (the configured last, or the
    round an algorithm ends on by itself: FedBABU with deviation tracking, whose sigma_w
    falls in round 3 here, fine-tunes one round and ends after round 4 of 6): the resume
    trains no round more and completes with the uninterrupted run's rounds and model."""
    config = {**base, "num-server-rounds": 3}
    last = 3
    if ends_early:
        config = {**base, "algo": "fedbabu-deviation", "num-server-rounds": 6,
                  "deviation-window": 1, "deviation-epsilon": 1.0,
                  "deviation-finetune-rounds": 1,
                  "dirichlet-balance": False}  # fmt: skip  # sigma_w falls in 3 on this one
        last = 4
    whole = {**config, "results-dir": str(tmp_path / "whole"), "state-dir": str(tmp_path / "sw")}
    assert run_server(whole)[1] is None
    assert len(results(tmp_path / "whole")["rounds"]) == last  # it did end by itself
    part = {**config, "results-dir": str(tmp_path / "part"), "state-dir": str(tmp_path / "sp")}
    with monkeypatch.context() as patch:
        kill_after_checkpoint(patch, last, part)
        _, stopped = run_server(part, run_id=2)
    assert isinstance(stopped, ServerKilled)
    assert results(tmp_path / "part")["run"]["status"] == "running"  # as a SIGKILL left it
    [run_folder] = list((tmp_path / "part").glob("*/"))
    grid, stopped = run_server({**part, "resume": str(run_folder)}, run_id=3)
    assert stopped is None
    assert grid.delivered and {p for p, _, _ in grid.delivered} <= {MessageType.QUERY}
    expected, resumed = results(tmp_path / "whole"), results(tmp_path / "part")
    assert resumed["run"]["status"] == "completed"
    assert [r["round"] for r in resumed["rounds"]] == list(range(1, last + 1))
    assert per_round(resumed) == per_round(expected)
    assert_same_arrays(final_model(tmp_path / "part"), final_model(tmp_path / "whole"))
    from fedreg_tools.run_records import document_problem

    for record in (expected, resumed):  # the early end is recorded: a finished run to report
        assert record["run"].get("ended_after_round") == (last if ends_early else None)
        assert document_problem(record) is None


def test_resume_of_an_algorithm_with_client_state_needs_a_state_dir(
    base: dict[str, Any], tmp_path: Path
) -> None:
    run_server({**base, "num-server-rounds": 1})
    [run_folder] = list((tmp_path / "results").glob("*/"))
    _, stopped = run_server({**base, "resume": str(run_folder)}, run_id=2)
    assert "needs every client's private state on disk" in str(stopped)
    assert "state-dir" in str(stopped)


# ------------------------------------------------------- the wire into the disk
@pytest.mark.parametrize("key", ["../../outside", "/tmp/abs", "a/../../b", "..", "x" * 300, ""])
def test_a_crafted_state_key_cannot_reach_outside_the_state_dir(
    key: str, base: dict[str, Any], tmp_path: Path
) -> None:
    as_a_task()
    state_dir = tmp_path / "state" / "inner"
    run_config = {**base, "state-dir": str(state_dir)}
    context = Context(run_id=1, node_id=7, state=RecordDict(), run_config=run_config,
                      node_config={"partition-id": 0, "num-partitions": 4})  # fmt: skip
    config = ConfigRecord({"server-round": 1, "state-key": key})
    msg = Message(RecordDict({ARRAYS: ArrayRecord(), CONFIG: config}), message_type=TRAIN,
                  dst_node_id=7)  # fmt: skip
    if key == "":  # no key: the client falls back to its run id, inside the state dir
        with pytest.raises(KeyError):  # (and then fails on the empty arrays, harmlessly)
            client_app.train(msg, context)
        assert all(p.is_relative_to(state_dir) for p in (tmp_path / "state").rglob("*"))
        return
    with pytest.raises(ValueError, match="state-key=.* is not allowed"):
        client_app.train(msg, context)
    assert not (state_dir / "runs").exists()  # no private state written or read anywhere
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["inner"]
    assert not list(Path("/tmp").glob("abs*")) or not Path("/tmp/abs").exists()


@pytest.mark.parametrize(
    ("craft_arrays", "reason"),
    [
        (lambda a: a.update({"base.0.weight": np.full_like(a["base.0.weight"], np.nan)}),
         "base.0.weight: holds NaN"),
        (lambda a: a.update({"base.0.bias": np.zeros(1, dtype=np.float32)}),
         r"base.0.bias: got float32\[1\], expected float32\["),
        (lambda a: a.update({"head_g.0.bias": a["head_g.0.bias"].astype(np.float64)}),
         "head_g.0.bias: got float64"),
    ],
)  # fmt: skip
def test_a_crafted_global_model_is_refused_by_the_client_and_nothing_is_saved(
    craft_arrays, reason: str, base: dict[str, Any], tmp_path: Path
) -> None:
    """A device's ClientApp trusts nothing from the wire either: after an honest round 1
    (its private head committed to the state dir), a round-2 message whose global model
    holds NaN, a shape that would broadcast or another dtype is refused before any
    training, and the device's private state stays round 1's (a NaN base would otherwise
    have been trained on and saved as its private head, for good)."""
    as_a_task()
    state_dir = tmp_path / "state"
    context = Context(run_id=1, node_id=7, state=RecordDict(),
                      run_config={**base, "state-dir": str(state_dir)},
                      node_config={"partition-id": 0, "num-partitions": 4})  # fmt: skip
    setup = client_app.client_setup(context)
    model = initial_model(setup.info, setup.config)
    honest = {k: v.numpy().copy() for k, v in model.state_dict().items()
              if group_of(k) in ("base", "head_g")}  # fmt: skip

    def message(arrays: dict[str, np.ndarray], server_round: int) -> Message:
        config = ConfigRecord({"server-round": server_round, "state-key": "run-1"})
        return Message(RecordDict({ARRAYS: to_record(arrays), CONFIG: config}),
                       message_type=TRAIN, dst_node_id=7)  # fmt: skip

    client_app.train(message(honest, 1), context)
    saved = sorted(p.relative_to(state_dir) for p in state_dir.glob("runs/*/partition-*/*"))
    assert saved and all("round-000001" in str(p) for p in saved)
    crafted = {k: v.copy() for k, v in honest.items()}
    craft_arrays(crafted)
    with pytest.raises(ValueError, match=reason):
        client_app.train(message(crafted, 2), context)
    assert sorted(p.relative_to(state_dir) for p in state_dir.glob("runs/*/partition-*/*")) == saved


# ------------------------------------------------------------ evaluation paths
@pytest.mark.parametrize("algo", ["fedreg", "fedper", "gpfl", "fedbabu", "ditto"])
def test_clients_evaluating_the_global_model_give_the_servers_numbers(
    algo: str, base: dict[str, Any], tmp_path: Path
) -> None:
    """The global model evaluated by each client on its test split, the counts summed by
    the server, equals the ServerApp's own pass over the union of the splits, round by
    round and exactly; the ServerApp then holds no test data."""
    config = {**base, "algo": algo, "finetune-epochs": 1, "personal-epochs": 1}
    for where in ("server", "clients"):
        run_server({**config, "global-eval": where, "results-dir": str(tmp_path / where)})
    server, clients = results(tmp_path / "server"), results(tmp_path / "clients")
    assert server["run"]["global_evaluation"] == "server"
    assert clients["run"]["global_evaluation"] == "clients"
    assert per_round(clients) == per_round(server)
    sizes = {r["personal_coverage"]["of_test_samples"] for r in clients["rounds"]}
    assert sizes == {r["personal_coverage"]["of_test_samples"] for r in server["rounds"]}


def test_a_resume_whose_digests_were_not_compared_states_no_data_digest(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """A checkpoint whose digests are of another scheme cannot be compared with this
    version's, so its first rounds' samples are not known to be the resumed ones: the
    ServerApp must not go on recording a data_digest for the whole run (this attempt's, or
    the first attempt's other-scheme one). Only a resume that compared the digests states
    one; a resume that did keeps it."""
    config = {**base, "state-dir": str(tmp_path / "state")}
    folder = killed_in_round_2(config, tmp_path)
    recorded = results_of(folder)["run"]["data_digest"]
    checkpoint, _ = Checkpoint.load(folder)
    compared = dict(checkpoint.clients)
    checkpoint.clients = {**compared, "digest_scheme": 0}  # another version's digests
    checkpoint.save(folder)
    assert run_server({**config, "resume": str(folder)}, kill_after=(TRAIN, 3, 1),
                      run_id=2)[1] is not None  # fmt: skip
    assert "data_digest" not in results_of(folder)["run"]
    checkpoint, _ = Checkpoint.load(folder)
    assert not checkpoint.compares_digests  # nor will a later resume compare them
    checkpoint.clients = compared  # as this version records them: compared on resume
    checkpoint.save(folder)
    assert run_server({**config, "resume": str(folder)}, run_id=3)[1] is None
    assert results_of(folder)["run"]["data_digest"] == recorded


@pytest.mark.parametrize("swap", ["another run's", "edited"])
def test_a_resume_keeps_only_the_rounds_its_checkpoint_sealed(
    base: dict[str, Any], tmp_path: Path, swap: str
) -> None:
    """The rounds before the checkpoint are kept from results.json. Checked for range
    only, another run's results.json copied into a killed run's folder would be resumed,
    and the run would end `completed` with the other run's round 1 (its clients, its
    accuracy) and its id. Each checkpoint seals the file's run id and rounds; a resume from a
    file that is not the sealed one is refused before anything is written, and the
    original file resumes to the uninterrupted run's figures."""
    config = {**base, "state-dir": str(tmp_path / "state")}
    folder = killed_in_round_2(config, tmp_path)
    original = (folder / "results.json").read_bytes()
    other = {**base, "seed": 6, "results-dir": str(tmp_path / "other"),
             "state-dir": str(tmp_path / "other-state")}  # fmt: skip
    assert run_server(other, run_id=77)[1] is None
    if swap == "another run's":
        replaced = next((tmp_path / "other").glob("*/results.json")).read_bytes()
        expected = "it is the record of run 77, the checkpoint continues run 1"
    else:  # a kept round edited, still a valid record
        document = json.loads(original)
        document["rounds"][0]["global_accuracy"] += 0.01
        replaced = json.dumps(document).encode()
        expected = "its rounds 1-1 are not the ones the checkpoint sealed"
    (folder / "results.json").write_bytes(replaced)
    _, stopped = run_server({**config, "resume": str(folder)}, run_id=2)
    assert isinstance(stopped, ValueError) and expected in str(stopped)
    assert (folder / "results.json").read_bytes() == replaced  # nothing written over it
    (folder / "results.json").write_bytes(original)
    assert run_server({**config, "resume": str(folder)}, run_id=3)[1] is None
    whole = {**config, "results-dir": str(tmp_path / "whole"), "state-dir": str(tmp_path / "s2")}
    assert run_server(whole)[1] is None
    assert per_round(results_of(folder)) == per_round(results(tmp_path / "whole"))


@pytest.mark.parametrize("fault", ["wiped", "swapped"])
def test_a_client_whose_private_state_was_lost_or_swapped_is_counted_and_degrades_the_run(
    base: dict[str, Any], tmp_path: Path, fault: str
) -> None:
    """A partition's state folder deleted (a device's state-dir wiped, or a new node
    taking over the partition) while the run was stopped: the client would start afresh,
    count nothing, and the run end `completed` with other personal figures. Two
    partitions' folders swapped: each would train the other's head, also `completed`.
    The server sends each partition the state version it last reported (`state-held`)
    and each manifest names its owner, so the client counts the reset and the round,
    and the run, are degraded."""
    config = {**base, "state-dir": str(tmp_path / "state"), "fraction-train": 1.0}
    folder = killed_in_round_2(config, tmp_path)
    checkpoint, _ = Checkpoint.load(folder)
    assert checkpoint.strategy_state["state_rounds"] == {"0": 1, "1": 1, "2": 1, "3": 1}
    runs = tmp_path / "state" / "runs" / folder.name
    if fault == "wiped":
        shutil.rmtree(runs / "partition-1")
    else:
        (runs / "partition-0").rename(runs / "swap")
        (runs / "partition-1").rename(runs / "partition-0")
        (runs / "swap").rename(runs / "partition-1")
    assert run_server({**config, "resume": str(folder)}, run_id=2)[1] is None
    document = results_of(folder)
    resets = [r["state_resets"] for r in document["rounds"]]
    assert resets == [0, 1 if fault == "wiped" else 2, 0]
    assert document["run"]["status"] == "degraded"
    assert [r["round"] for r in document["rounds"] if r["train_failures"] or r["eval_failures"]] \
        == []  # every reply was accepted: the reset alone degrades  # fmt: skip


def test_a_resumed_run_whose_clients_kept_their_state_counts_no_reset(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """The other side of `state-held`: a resume after a kill, with every client's state
    intact, counts no reset and stays `completed`, equal to the uninterrupted run."""
    config = {**base, "state-dir": str(tmp_path / "state"), "fraction-train": 1.0}
    folder = killed_in_round_2(config, tmp_path)
    assert run_server({**config, "resume": str(folder)}, run_id=2)[1] is None
    document = results_of(folder)
    assert [r["state_resets"] for r in document["rounds"]] == [0, 0, 0]
    assert document["run"]["status"] == "completed"
    whole = {**config, "results-dir": str(tmp_path / "whole"), "state-dir": str(tmp_path / "s2")}
    assert run_server(whole)[1] is None
    assert per_round(document) == per_round(results(tmp_path / "whole"))


def test_a_reply_delivered_twice_is_counted_once(base: dict[str, Any], tmp_path: Path) -> None:
    """Were the ServerApp to take every reply it pulled, a training reply delivered twice
    would be averaged twice, and an evaluation reply delivered twice would stand in for a
    client that never answered, so the personal figure would be published as the
    all-client one. (Flower's SuperLink keeps one reply per message; this is defence in
    depth.) A second reply to the same message is a failure of its own, never counted."""
    config = {**base, "num-server-rounds": 1, "reply-timeout": 1.0}
    twice = {(TRAIN, 1, 2), (EVALUATE, 1, 0)}
    silent = {(EVALUATE, 1, 3): lambda msg, reply: None}
    assert run_server(config, faults=silent, duplicate=twice)[1] is None
    [record] = results(tmp_path / "results")["rounds"]
    assert record["sampled_clients"] == [2, 3]
    assert (record["train_replies"], record["train_failures"]) == (2, 1)
    assert (record["eval_replies"], record["eval_failures"]) == (3, 2)
    assert record["personal_accuracy"] is None  # partition 3 did not answer
    assert record["personal_coverage"]["clients"] == 3
    assert sorted(e["error"] for e in record["errors"]) == [
        "a second reply to the same message (not counted)",
        "a second reply to the same message (not counted)",
        "no reply within reply-timeout=1s",
    ]
    once = {**config, "results-dir": str(tmp_path / "once")}
    assert run_server(once, faults=silent)[1] is None
    assert_same_arrays(final_model(tmp_path / "results"), final_model(tmp_path / "once"))


class LateNodeGrid(InProcessGrid):
    """Partition 3's node connects only at the 4th look; node 999 claims partition 4 of 4
    (a misconfigured device: its query fails); node 1004 claims partition 1 as well."""

    def __init__(self, run_config: dict[str, Any]) -> None:
        super().__init__(run_config, 4)
        self.late = self.contexts.pop(1003)
        for node, pid in ((999, 4), (1004, 1)):
            self.contexts[node] = Context(
                run_id=1, node_id=node, state=RecordDict(), run_config=dict(run_config),
                node_config={"partition-id": pid, "num-partitions": 4},
            )  # fmt: skip
        self.looks, self.queried = 0, []

    def get_node_ids(self) -> list[int]:
        self.looks += 1
        if self.looks == 4:
            self.contexts[1003] = self.late
        return list(self.contexts)

    def push_messages(self, messages):
        messages = list(messages)
        self.queried += [m.metadata.dst_node_id for m in messages]
        return super().push_messages(messages)


def test_discovery_says_what_it_waits_for_and_asks_a_failing_node_again_only_now_and_then(
    base: dict[str, Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Discovery asked a node whose query failed once a second (each ask starts a
    ClientApp on it, each failure a log line), and the refresh before every round (every
    5 s while waiting for clients) asked it again; it said nothing of the partitions it
    waited for, and let a second node claiming a partition replace the first without a
    word."""
    monkeypatch.setattr(nodes, "DISCOVERY_NOTE_S", 0.0)
    monkeypatch.setattr(nodes, "QUERY_RETRY_S", 60.0)
    as_a_task()
    grid = LateNodeGrid(base)
    with caplog.at_level("INFO"):
        partitions, _ = nodes.discover_partitions(grid, timeout=30)
    assert partitions.available() == [0, 1, 2, 3] and partitions.node_of(3) == 1003
    assert grid.looks == 4 and grid.queried.count(999) == 1  # not at every look
    assert "waiting for the nodes of partitions [3] (3 have one" in caplog.text
    assert "two nodes claim partition 1" in caplog.text
    for _ in range(3):  # before each round, and while waiting for clients: not asked again
        nodes.refresh_partitions(grid, partitions)
    assert grid.queried.count(999) == 1
    monkeypatch.setattr(nodes, "QUERY_RETRY_S", 0.0)  # its time has come
    nodes.refresh_partitions(grid, partitions)
    assert grid.queried.count(999) == 2


def test_a_seal_holds_when_a_later_version_rewrites_the_kept_rounds_with_new_fields() -> None:
    """A resume rewrites the rounds it keeps with this version's fields (their defaults
    where an earlier version's file lacks them); killed again before the next checkpoint,
    the next resume must still find the rounds the checkpoint sealed."""
    old = [{"round": 1, "global_accuracy": 0.5, "personal_accuracy": 0.6,
            "personal_accuracy_std": 0.1, "train_seconds": 1.0, "eval_seconds": 1.0,
            "num_train_examples": 10}]  # fmt: skip
    rewritten = json.loads(json.dumps([asdict(RoundRecord(**r)) for r in old]))
    assert set(rewritten[0]) > set(old[0])
    assert rounds_sha256(rewritten) == rounds_sha256(old)
    assert rounds_sha256([{**old[0], "global_accuracy": 0.51}]) != rounds_sha256(old)


def test_state_resets_degrade_the_runs_of_this_version_only() -> None:
    """Before this version a round whose only flaw was a state reset was `completed`:
    such files still read as they were written; a run of this version (``status_rule``
    2) with a reset must say `degraded`; a rule nobody wrote is refused."""
    round_ = {"round": 1, "global_accuracy": 0.5, "personal_accuracy": 0.6,
              "train_seconds": 1.0, "eval_seconds": 1.0, "state_resets": 1}  # fmt: skip
    earlier = {"run": {"status": "completed"}, "rounds": [round_],
               "config": {"num-server-rounds": 1}}  # fmt: skip
    assert status_problem(earlier) is None
    ours = {**earlier, "run": {"status": "completed", "status_rule": 2}}
    assert "status 'completed' but rounds [1] are degraded" in status_problem(ours)
    assert status_problem({**earlier, "run": {"status": "degraded", "status_rule": 2}}) is None
    crafted = {**earlier, "run": {"status": "completed", "status_rule": "2"}}
    assert "run.status_rule is '2'" in status_problem(crafted)


def test_a_round_short_of_min_train_replies_keeps_the_global_model_and_says_so(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """With min-train-replies=2 and one of the two sampled clients failing, the round's
    one update is not aggregated: the global model stays as it was, and the record now
    says so (before, only `num_train_examples` 0 beside `train_replies` 1 hinted at it)."""
    config = {**base, "algo": "fedavg", "num-server-rounds": 2, "min-train-replies": 2}
    strategy = FedReGStrategy(load_config(config))  # sampling is the same for every algo
    strategy.set_partitions(PartitionMap(4, {p: 1000 + p for p in range(4)}))
    victim = [strategy.sample_partitions(r) for r in (1, 2)][1][0]  # sampled in round 2
    faults = {(TRAIN, 2, victim): raising(ConnectionError("dropped"))}
    assert run_server(config, faults=faults)[1] is None
    first, second = results(tmp_path / "results")["rounds"]
    assert not first["global_model_kept"] and first["train_replies"] == 2
    assert second["global_model_kept"] and second["train_replies"] == 1
    assert second["num_train_examples"] == 0
    once = {**config, "num-server-rounds": 1, "results-dir": str(tmp_path / "once")}
    assert run_server(once)[1] is None
    assert_same_arrays(final_model(tmp_path / "results"), final_model(tmp_path / "once"))


def test_a_device_reads_its_own_copy_when_it_lacks_the_servers_dataset_path(
    base: dict[str, Any], tmp_path: Path, grey_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run config's `dataset-path` is the server's copy; each device names its own
    in its node config (docs/deployment.md, "Node config"). Every ClientApp still validated the
    run config's path, so on a device without the server's folder every query failed
    and discovery waited out its timeout: no real deployment with other paths could
    start. Here the server's copy is hidden from the nodes while they run."""
    monkeypatch.setattr(nodes, "DISCOVERY_TIMEOUT_S", 20.0)
    server_copy = copy_dataset(grey_dataset, tmp_path / "server-data")
    device_copy = copy_dataset(grey_dataset, tmp_path / "device-data")
    config = {**base, "dataset-path": str(server_copy), "num-server-rounds": 2}
    _, stopped = run_server(config, node_config={"dataset-path": str(device_copy)},
                            hidden_from_nodes=server_copy)  # fmt: skip
    assert stopped is None
    deployed = results(tmp_path / "results")
    assert deployed["run"]["status"] == "completed"
    one_copy = {**config, "results-dir": str(tmp_path / "one-copy")}
    run_server(one_copy)
    assert per_round(deployed) == per_round(results(tmp_path / "one-copy"))


@pytest.mark.parametrize(
    ("node_path", "problem"),
    [
        ("missing", "this node's --node-config dataset-path="),
        (None, "the run config's dataset-path="),  # no copy of its own, the server's absent
    ],
)
def test_a_device_without_its_data_is_named_at_discovery_before_any_round(
    base: dict[str, Any], tmp_path: Path, grey_dataset: Path, monkeypatch: pytest.MonkeyPatch,
    node_path: str | None, problem: str,
) -> None:  # fmt: skip
    """A node whose data cannot be found is not mapped at discovery (to fail only in its
    first round, after the others had trained): its query fails, it serves no partition,
    discovery waits for one that can, and its timeout names the node and why."""
    monkeypatch.setattr(nodes, "DISCOVERY_TIMEOUT_S", 3.0)
    server_copy = copy_dataset(grey_dataset, tmp_path / "server-data")
    device_copy = copy_dataset(grey_dataset, tmp_path / "device-data")
    node_3 = {"dataset-path": str(tmp_path / node_path) if node_path else ""}
    grid, stopped = run_server({**base, "dataset-path": str(server_copy)},
                               node_config={"dataset-path": str(device_copy)},
                               node_configs={3: node_3}, hidden_from_nodes=server_copy)  # fmt: skip
    assert isinstance(stopped, TimeoutError)
    message = str(stopped)
    assert "only partitions [0, 1, 2] have a node" in message
    assert "node 1003: " in message and problem in message and "train.parquet" in message
    assert {phase for phase, _, _ in grid.delivered} == {MessageType.QUERY}
    document = results(tmp_path / "results")
    assert document["run"]["status"] == "failed" and problem in document["run"]["error"]


def test_a_checkpoint_of_an_earlier_version_resumes_as_it_ran(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """A checkpoint written before `dirichlet-balance` existed records no such key; its
    run drew its partition without balancing. Read as today's default, a resume would
    have continued on another partition (refused only by the split sizes, with a message
    about other data). It is read as it ran: a resume with today's default is refused
    naming the key; one with the run's value equals the uninterrupted run."""
    from fedreg_app.core.checkpoint import _body_hash

    config = {**base, "algo": "fedavg", "dirichlet-balance": False, "num-server-rounds": 1,
              "state-dir": str(tmp_path / "state")}  # fmt: skip
    run_server(config)
    [folder] = list((tmp_path / "results").iterdir())
    state_path = folder / "checkpoint" / "state.json"
    state = json.loads(state_path.read_text())
    del state["run_config"]["dirichlet-balance"]  # as the earlier version wrote it
    body = {k: v for k, v in state.items() if k != "sha256"}
    state_path.write_text(json.dumps({**body, "sha256": _body_hash(body)}))
    document = json.loads((folder / "results.json").read_text())
    del document["config"]["dirichlet-balance"]
    (folder / "results.json").write_text(json.dumps(document))
    today = {k: v for k, v in config.items() if k != "dirichlet-balance"}
    _, refused = run_server({**today, "num-server-rounds": 2, "resume": str(folder)}, run_id=2)
    assert isinstance(refused, ConfigError)
    assert "dirichlet-balance=True is not allowed" in str(refused)
    assert "made with dirichlet-balance=False" in str(refused)
    _, stopped = run_server({**config, "num-server-rounds": 2, "resume": str(folder)}, run_id=3)
    assert stopped is None
    whole = {**config, "num-server-rounds": 2, "results-dir": str(tmp_path / "whole"),
             "state-dir": str(tmp_path / "whole-state")}  # fmt: skip
    run_server(whole)
    assert per_round(json.loads((folder / "results.json").read_text())) == per_round(
        results(tmp_path / "whole")
    )


@pytest.mark.parametrize("edit", ["figures", "config", "extended"])
def test_a_finished_record_edited_beside_its_checkpoint_is_not_published(
    base: dict[str, Any], tmp_path: Path, edit: str
) -> None:
    """A finished run's results.json edited by hand (a round's accuracies and the best
    figures made consistent, or its config) is neither published by `fedreg-report` nor
    taken as finished by the runner, not only refused on resume: a record beside a
    checkpoint must be the one it sealed."""
    from fedreg_app.core.figures import summarised_figures
    from fedreg_tools.replay import read_recording
    from fedreg_tools.run_records import scan

    seed_folder = tmp_path / "root" / "smoke" / "fedavg" / "seed5"
    config = {**base, "algo": "fedavg", "num-server-rounds": 2, "state-dir": str(tmp_path / "s"),
              "results-dir": str(seed_folder)}  # fmt: skip
    run_server(config)
    assert [r.seed for r in scan(tmp_path / "root").results] == [5]  # as it was written
    [path] = list(seed_folder.glob("*/results.json"))
    document = json.loads(path.read_text())
    if edit == "figures":
        for key in ("global_accuracy", "personal_accuracy"):
            document["rounds"][-1][key] = 0.95
        for key in ("best_global_accuracy", "best_personal_accuracy"):
            document[key] = 0.95
        document.update(summarised_figures(document["rounds"]))
    elif edit == "config":
        document["config"]["local-epochs"] = 5
    else:  # a deployed run extended to 4 rounds, before its first new checkpoint: not edited
        document["config"]["num-server-rounds"] = 4
        document["run"]["status"] = "running"
        path.write_text(json.dumps(document))
        assert [r.seed for r in scan(tmp_path / "root", unfinished=True).results] == [5]
        assert read_recording(path).config["num-server-rounds"] == 4  # replays, too
        return
    path.write_text(json.dumps(document))
    collection = scan(tmp_path / "root")
    assert collection.results == []
    note = collection.skipped_note(tmp_path / "root")
    said = "not the ones the checkpoint sealed" if edit == "figures" else "local-epochs"
    assert said in note and "invalid" in note
    # fedreg-replay reads the record with its seal too: without it, it would replay an
    # edited config, or report differences as if the run had produced them
    with pytest.raises(ConfigError, match=said):
        read_recording(path)


def test_a_round_committed_while_a_report_reads_the_run_leaves_it_valid(
    base: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round writes results.json, then its checkpoint. A report (and the runner's
    status, and a replay) read results.json, then the checkpoint's seal: a round
    committed between the two reads would show a seal ahead of the record, and a running
    run would read as `invalid`. The seal is read first. The interleaving is
    injected: the first read of results.json returns the round-1 record and then lets
    the run write rounds 2 and 3, record then checkpoint, as the ServerApp does."""
    from fedreg_tools.replay import read_recording
    from fedreg_tools.run_records import read_document

    config = {**base, "state-dir": str(tmp_path / "state")}
    folder = killed_in_round_2(config, tmp_path)
    record, state = folder / "results.json", folder / "checkpoint" / "state.json"
    round_1 = (record.read_bytes(), state.read_bytes())
    assert run_server({**config, "resume": str(folder)}, run_id=2)[1] is None
    round_3 = {**results_of(folder), "run": {**results_of(folder)["run"], "status": "running"}}
    round_3_state = state.read_bytes()
    read_text = Path.read_text

    def a_round_commits_after_the_record_is_read(path: Path, *args: Any, **kwargs: Any) -> str:
        text = read_text(path, *args, **kwargs)
        if path == record and json.loads(text)["rounds"][-1]["round"] == 1:
            record.write_text(json.dumps(round_3))
            state.write_bytes(round_3_state)
        return text

    for reader in (read_document, read_recording):
        record.write_bytes(round_1[0])
        state.write_bytes(round_1[1])
        monkeypatch.setattr(Path, "read_text", a_round_commits_after_the_record_is_read)
        try:
            document = reader(record)
        finally:
            monkeypatch.setattr(Path, "read_text", read_text)
        rounds = document["rounds"] if isinstance(document, dict) else document.rounds
        assert [r["round"] for r in rounds] == [1]  # read before the round committed
        assert results_of(folder)["rounds"][-1]["round"] == 3  # and the run went on
        if isinstance(document, dict):
            assert document["run"]["status"] == "running", document["run"].get("error")


def test_only_an_algorithm_that_ends_early_may_record_fewer_rounds() -> None:
    """A `completed` FedAvg record cut to 1 of its 4 rounds, with
    `run.ended_after_round = 1` added, does not pass as finished; nor does one whose
    num-server-rounds is missing, "4" or 4.0 (the round count is checked)."""
    from fedreg_app.registry import ALGORITHMS, ended_after
    from strategies.base import PersonalizedStrategy

    overriding = {name for name, algorithm in ALGORITHMS.items()
                  if algorithm.strategy.finished is not PersonalizedStrategy.finished}  # fmt: skip
    assert overriding == {name for name, a in ALGORITHMS.items() if a.recorded_end is not None}
    round_ = {"round": 1, "global_accuracy": 0.5, "personal_accuracy": 0.6,
              "train_seconds": 1.0, "eval_seconds": 1.0}  # fmt: skip
    cut = {"run": {"status": "completed", "ended_after_round": 1}, "rounds": [round_],
           "config": {"algo": "fedavg", "num-server-rounds": 4}}  # fmt: skip
    assert "records 1 of the 4 rounds" in status_problem(cut, ended_after)
    ended = {**cut, "config": {"algo": "fedbabu-deviation", "num-server-rounds": 4}}
    assert status_problem(ended, ended_after) is None
    assert "records 1 of the 4 rounds" in status_problem(ended)  # no algorithm may end early
    for count in ("4", 4.0, None):
        config = {"algo": "fedavg", **({} if count is None else {"num-server-rounds": count})}
        problem = status_problem({**cut, "config": config}, ended_after)
        assert "config.num-server-rounds is" in problem


def test_a_seal_written_before_a_field_was_added_still_holds() -> None:
    """A seal hashes the rounds' normal form, every field of its version;
    `global_model_kept` came after the first seals, so a record sealed before it would
    read as edited when its seal is checked. A seal names its fields; one that names none
    is tried on the fields of the last version without names, with and without the later
    one, whatever fields came since (`client_train_seconds`, `update_trust`, ...)."""
    from fedreg_app.core.metrics import (
        UNNAMED_SEAL_FIELDS,
        UNNAMED_SEAL_LATER_FIELDS,
        round_fields,
        sealed_rounds_match,
    )

    rounds = [{"round": 1, "global_accuracy": 0.5, "personal_accuracy": 0.6,
               "personal_accuracy_std": 0.1, "train_seconds": 1.0, "eval_seconds": 1.0,
               "num_train_examples": 10}]  # fmt: skip
    assert set(round_fields()) > UNNAMED_SEAL_FIELDS  # no field was removed since
    for hashed in (UNNAMED_SEAL_FIELDS, UNNAMED_SEAL_FIELDS - UNNAMED_SEAL_LATER_FIELDS):
        unnamed = {"run_id": 1, "rounds_sha256": rounds_sha256(rounds, hashed)}
        assert sealed_rounds_match(rounds, unnamed)
        assert sealed_rounds_match([{**rounds[0], "client_train_seconds": {"0": 2.0}}], unnamed)
    earlier = set(round_fields()) - UNNAMED_SEAL_LATER_FIELDS
    named = {
        "run_id": 1,
        "rounds_sha256": rounds_sha256(rounds, earlier),
        "fields": sorted(earlier),
    }
    later = [{**rounds[0], "global_model_kept": True}]  # a field the seal did not hash
    assert sealed_rounds_match(later, named)
    assert not sealed_rounds_match([{**rounds[0], "global_accuracy": 0.7}], named)


def _init_model_files(tmp_path: Path, **seeds: int) -> dict[str, Path]:
    """Model files of the grey dataset's model, one per name, from the seeds given."""
    from fedreg_app.core.data import DatasetInfo
    from fedreg_app.core.models import BASE, HEAD_G, build_model
    from fedreg_app.core.persist import save_arrays

    info = DatasetInfo(num_classes=10, channels=1, height=28, width=28)
    files = {}
    for name, seed in seeds.items():
        files[name] = tmp_path / f"{name}.npz"
        save_arrays(files[name], build_model(info, 2, seed).group_state(BASE, HEAD_G))
    return files


def test_a_node_whose_init_model_copy_holds_other_weights_is_refused_by_its_digest(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """A node names its own copy of the init-model: a device with another checkpoint under
    that name would start its private head from other weights, and the run would end
    `completed`. Every reply names its file's sha256: that partition's replies are
    refused and named, the run is `degraded`, the others count; the record names the
    server file's sha256."""
    from fedreg_app.core.metrics import INIT_MODEL_SHA256
    from fedreg_app.core.persist import file_sha256

    files = _init_model_files(tmp_path, server=42, device=43)
    config = {**base, "num-server-rounds": 2, "init-model": str(files["server"]),
              "fraction-train": 1.0}  # fmt: skip
    _, stopped = run_server(config, node_configs={2: {"init-model": str(files["device"])}})
    assert stopped is None
    document = results(tmp_path / "results")
    assert document["run"][INIT_MODEL_SHA256] == file_sha256(files["server"])
    assert document["run"]["status"] == "degraded"
    errors = [e for r in document["rounds"] for e in r["errors"]]
    assert errors and all(e["partitions"] == [2] for e in errors), errors
    assert all("init-model digest" in e["error"] and "other weights" in e["error"]
               for e in errors)  # fmt: skip
    assert {e["phase"] for e in errors} == {"train", "evaluate"}
    assert all("2" not in r["client_accuracies"] for r in document["rounds"])
    same = {**config, "results-dir": str(tmp_path / "same")}  # a copy of the same bytes
    shutil.copy(files["server"], tmp_path / "copy.npz")
    assert run_server(same, node_configs={2: {"init-model": str(tmp_path / "copy.npz")}})[1] is None
    assert results(tmp_path / "same")["run"]["status"] == "completed"


def test_a_resume_from_another_init_model_file_is_refused(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """A killed run's init-model file replaced before the resume: clients not yet trained
    would start their private parts from other weights than those trained so far. The
    resume is refused, naming the file; with the run's file back it ends as an
    uninterrupted run does."""
    files = _init_model_files(tmp_path, first=42, other=43)
    config = {**base, "state-dir": str(tmp_path / "state"), "init-model": str(files["first"])}
    folder = killed_in_round_2(config, tmp_path)
    original = files["first"].read_bytes()
    files["first"].write_bytes(files["other"].read_bytes())
    _, stopped = run_server({**config, "resume": str(folder)}, run_id=2)
    assert isinstance(stopped, ValueError), stopped
    assert "init-model is not the file the run began from" in str(stopped)
    files["first"].write_bytes(original)
    assert run_server({**config, "resume": str(folder)}, run_id=3)[1] is None
    whole = {**config, "results-dir": str(tmp_path / "whole"), "state-dir": str(tmp_path / "s2")}
    assert run_server(whole)[1] is None
    assert per_round(results_of(folder)) == per_round(results(tmp_path / "whole"))


def test_a_device_reads_its_own_copy_of_the_init_model(
    base: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As with the dataset: the run config's `init-model` is a file on the server's
    machine, and every ClientApp validated it, so a device without that path could not
    answer discovery. A node names its own copy (`--node-config init-model=...`); one
    with neither is named at discovery."""
    from fedreg_app.core.data import DatasetInfo
    from fedreg_app.core.models import BASE, HEAD_G, build_model
    from fedreg_app.core.persist import save_arrays

    monkeypatch.setattr(nodes, "DISCOVERY_TIMEOUT_S", 3.0)
    trained = build_model(DatasetInfo(num_classes=10, channels=1, height=28, width=28), 2, 42)
    server_file, device_file = tmp_path / "server.npz", tmp_path / "device.npz"
    for path in (server_file, device_file):
        save_arrays(path, trained.group_state(BASE, HEAD_G))
    config = {**base, "num-server-rounds": 2, "init-model": str(server_file),
              "state-dir": str(tmp_path / "s1")}  # fmt: skip
    _, stopped = run_server(config, node_config={"init-model": str(device_file)},
                            hidden_from_nodes=server_file)  # fmt: skip
    assert stopped is None
    one_copy = {**config, "results-dir": str(tmp_path / "one"), "state-dir": str(tmp_path / "s2")}
    run_server(one_copy)
    assert per_round(results(tmp_path / "results")) == per_round(results(tmp_path / "one"))
    alone = {**config, "results-dir": str(tmp_path / "alone"), "state-dir": str(tmp_path / "s3")}
    _, stopped = run_server(alone, node_configs={3: {"init-model": ""}},
                            node_config={"init-model": str(device_file)},
                            hidden_from_nodes=server_file)  # fmt: skip
    assert isinstance(stopped, TimeoutError)
    assert "node 1003: " in str(stopped) and "the run config's init-model=" in str(stopped)
