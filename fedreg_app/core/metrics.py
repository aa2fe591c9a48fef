"""Per-round results, written after every round so an interrupted run keeps them.

``results.json`` holds the run config, one record per round and the best accuracies;
``rounds.csv`` holds the scalar columns of the same records. Both are replaced
atomically (a unique temporary file, fsynced, then renamed).

A run's status tells the truth: ``completed`` only when every client answered every
phase; ``degraded`` when it finished with replies missing or rejected (the rounds say
which, and the personal accuracy of such a round is null: the partial figure is kept
apart as ``personal_accuracy_answered`` with its coverage); ``failed`` when it stopped
on an error (``run.error``).

Beside the all-client personal accuracy (the headline, as the sources evaluate every
client), ``personal_accuracy_sampled`` is the same figure over the clients that have
trained at least once so far (``clients_trained`` of them; see ``strategies/base.py``).

With ``tensorboard = true`` the same rounds also go to TensorBoard event files in the run
folder (``fedreg_app/core/tensorboard_log.py``).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
import time
from collections.abc import Callable, Collection
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from fedreg_app.core.config import is_count, is_whole
from fedreg_app.core.figures import (
    CLIENT_FIGURES,
    NEW_CLIENT_FIGURES,
    SUMMARISED,
    summarised_figures,
)
from fedreg_app.core.new_clients import held_out_count
from fedreg_app.core.persist import json_text, write_text_atomic
from fedreg_app.core.tensorboard_log import TensorBoardLog

CSV_COLUMNS = (
    "round",
    "global_accuracy",
    "personal_accuracy",
    "personal_accuracy_std",
    "train_seconds",
    "eval_seconds",
    "num_train_examples",
    "trained_parameters",
    "bytes_to_clients",
    "bytes_from_clients",
    "client_compute_seconds",
    "client_handler_seconds",
    "eval_compute_seconds",
    "server_eval_seconds",
    "train_replies",
    "train_failures",
    "eval_replies",
    "eval_failures",
    "personal_accuracy_answered",
    "personal_accuracy_sampled",
    "clients_trained",
    "dp_epsilon",
    "personal_accuracy_client_mean",
    "personal_accuracy_worst",
    "personal_accuracy_bottom_decile",
)
COMPLETED, DEGRADED, FAILED, RUNNING = "completed", "degraded", "failed", "running"
#: A run the experiment runner stopped itself (Ctrl-C, SIGTERM, ``--max-minutes``) once its
#: ServerApp was gone: resumable. ``running`` is then left only to a run in progress, or
#: one whose processes were killed with no chance to write (SIGKILL, the machine gone).
STOPPED = "stopped"


@dataclass
class RoundRecord:
    """One round. Accuracies are fractions in [0, 1]; None where not evaluated.

    Costs: ``train_seconds`` / ``eval_seconds`` are the server's wall time of each phase;
    ``client_compute_seconds`` sums the clients' own work (training, evaluation) and
    ``client_handler_seconds`` their whole message handling; ``bytes_*`` count the model
    arrays in the messages of both phases, ``train_bytes_*`` those of the training phase
    alone (what a FedSeq-style comparison needs: evaluation sends every client the model);
    ``trained_parameters`` sums, over the clients that trained, the distinct parameters
    each updated."""

    round: int
    global_accuracy: float | None
    personal_accuracy: float | None
    personal_accuracy_std: float | None
    train_seconds: float
    eval_seconds: float
    num_train_examples: int
    trained_parameters: int = 0
    bytes_to_clients: int = 0
    bytes_from_clients: int = 0
    train_bytes_to_clients: int = 0
    train_bytes_from_clients: int = 0
    client_compute_seconds: float = 0.0
    client_handler_seconds: float = 0.0
    #: Two parts of ``client_handler_seconds`` around the clients' own work: setting up
    #: (configuration, the node's data, decoded the first time a process serves it) and
    #: the private state on disk (restored, then committed: written, fsynced, hashed).
    client_setup_seconds: float = 0.0
    client_state_seconds: float = 0.0
    #: The evaluation phase's part of ``client_compute_seconds`` (the rest is training):
    #: the floor under ``eval_seconds`` that faster messaging cannot lower.
    eval_compute_seconds: float = 0.0
    #: The slowest client handler of the training phase plus that of the evaluation
    #: phase: a phase's wall time beyond it is transport (and, deployed, process start).
    slowest_handlers_seconds: float = 0.0
    server_eval_seconds: float = 0.0
    #: Per accepted training reply, partition -> the seconds its handler took (the node's
    #: whole time on the message): deployed, which devices are the round's stragglers;
    #: simulated, how the round's work fell on the client actors.
    client_train_seconds: dict[str, float] | None = None
    sampled_clients: list[int] = field(default_factory=list)
    client_accuracies: dict[str, float] | None = None
    #: Per-client figures of the same round (all clients, like ``personal_accuracy``): the
    #: unweighted mean of the clients' accuracies (``personal_accuracy`` weights each by
    #: its test samples), the lowest client's, and the mean of the lowest tenth
    #: (:func:`client_figures`). None where the round has no all-client figure.
    personal_accuracy_client_mean: float | None = None
    personal_accuracy_worst: float | None = None
    personal_accuracy_bottom_decile: float | None = None
    #: New clients (``new-client-fraction``), apart from the figures above: how many
    #: answered, their personal accuracy after their local round, and the global model's
    #: on their test splits (where the clients evaluate it); correct over test samples.
    new_clients: int = 0
    new_client_personal_accuracy: float | None = None
    new_client_global_accuracy: float | None = None
    #: FedReG with ``fedreg-personal`` weighted or learned: the mean over the clients that
    #: take part of the λ their personal prediction head_p + λ·head_g used (None otherwise).
    personal_global_weight: float | None = None
    #: A simulated attack (``attack``): the personal accuracy over the clients that do
    #: not lie (correct over their test samples; a liar's own model is of its lie, a
    #: label flipper's scores near 0 on its true labels); None without liars and where
    #: the round has no all-client figure.
    personal_accuracy_honest: float | None = None
    #: Replies accepted and failed (raised, timed out or rejected by the server's checks).
    train_replies: int = 0
    train_failures: int = 0
    eval_replies: int = 0
    eval_failures: int = 0
    #: One entry per distinct client error: phase, its first line, nodes and partitions.
    errors: list[dict[str, Any]] = field(default_factory=list)
    #: Personal accuracy over the clients that answered (equal to ``personal_accuracy``
    #: when all did), and how much of the federation that covers.
    personal_accuracy_answered: float | None = None
    #: The global model over the clients that answered (where clients evaluate it).
    global_accuracy_answered: float | None = None
    personal_coverage: dict[str, int] | None = None
    #: Client private state that started afresh this round: a file found corrupt (moved
    #: aside), a version lost (a wiped or replaced state-dir) or another partition's.
    state_resets: int = 0
    #: Which: per reply that reset some, its partition, phase and the records' names.
    state_reset_records: list[dict[str, Any]] = field(default_factory=list)
    #: Per parameter group, the largest ratio of an accepted reply's update norm to the
    #: median of the round's others: how close honest clients came to
    #: ``update-norm-factor`` (empty with the bound off or one reply).
    update_norm_ratio_max: dict[str, float] = field(default_factory=dict)
    #: Under ``aggregation`` ``cosine-trust`` or ``fltrust``: per parameter group, each
    #: accepted reply's trust (partition -> the ReLU of its update's cosine with the
    #: reference; 0: no weight); under ``flame`` and ``lfr``, 1 (admitted, kept) or 0.
    #: Empty under the other rules.
    update_trust: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Personal accuracy (correct over test samples) over the clients whose training reply
    #: was accepted in this or an earlier round; None when no client has trained yet, the
    #: round was not evaluated, or one of those clients' evaluation replies is missing.
    personal_accuracy_sampled: float | None = None
    #: How many clients that is: those with an accepted training reply so far.
    clients_trained: int = 0
    #: Differential privacy: ε spent up to this round at ``dp-delta`` (central: the
    #: released model's; local: the client that released most); None with DP off.
    dp_epsilon: float | None = None
    #: Where each client that trained this round ran: partition -> {"hostname", and in a
    #: simulation "ray-node"} (a Ray cluster run shows its spread over the nodes).
    client_hosts: dict[str, dict[str, str]] = field(default_factory=dict)
    #: Training replies were accepted, but fewer than ``min-train-replies``: the global
    #: model stayed as it was this round (those clients' private parts did train).
    global_model_kept: bool = False

    @property
    def degraded(self) -> bool:
        """Some reply was missing or rejected, some client was not evaluated, or some
        client's private state started afresh."""
        return round_degraded(vars(self))


#: Which rounds make a run ``degraded`` (``run.status_rule``): 1, a reply missing or
#: rejected or a client not evaluated (files of earlier versions, which name no rule);
#: 2, also a client whose private state started afresh (``state_resets``).
STATUS_RULE = 2

#: The run-level figures of a results file, each the best of a per-round field.
BEST_OF = {
    "best_global_accuracy": "global_accuracy",
    "best_personal_accuracy": "personal_accuracy",
    "best_personal_accuracy_answered": "personal_accuracy_answered",
    "best_personal_accuracy_sampled": "personal_accuracy_sampled",
    "best_personal_accuracy_honest": "personal_accuracy_honest",
}


#: Per-round accuracies: each a fraction in [0, 1], or null (not evaluated).
ACCURACY_FIELDS = (
    "global_accuracy",
    "personal_accuracy",
    "personal_accuracy_answered",
    "personal_accuracy_sampled",
    "personal_accuracy_honest",
    "global_accuracy_answered",
    *CLIENT_FIGURES,
    *NEW_CLIENT_FIGURES,
)
#: Per-round costs: each a finite number >= 0.
COST_FIELDS = ("train_seconds", "eval_seconds")


def is_real(value: Any) -> bool:
    """A finite JSON number (not a bool, not text)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


#: Per-round counts, where a record has them: each an integer >= 0.
COUNT_FIELDS = (
    "num_train_examples", "trained_parameters", "bytes_to_clients", "bytes_from_clients",
    "train_bytes_to_clients", "train_bytes_from_clients", "train_replies", "train_failures",
    "eval_replies", "eval_failures", "state_resets", "clients_trained", "new_clients",
)  # fmt: skip
#: Per-round seconds and spreads, where a record has them: each a finite number >= 0
#: (those that may be null when nothing was measured: ``NULLABLE_FIELDS``).
MEASURE_FIELDS = (
    "client_compute_seconds", "client_handler_seconds", "client_setup_seconds",
    "client_state_seconds", "eval_compute_seconds", "slowest_handlers_seconds",
    "server_eval_seconds",
)  # fmt: skip
NULLABLE_FIELDS = ("personal_accuracy_std", "dp_epsilon", "personal_global_weight")
#: A run's totals, each the sum of a per-round field.
TOTAL_OF = {
    "total_bytes_to_clients": "bytes_to_clients",
    "total_bytes_from_clients": "bytes_from_clients",
    "total_train_bytes_to_clients": "train_bytes_to_clients",
    "total_train_bytes_from_clients": "train_bytes_from_clients",
    "total_trained_parameters": "trained_parameters",
}


def round_problem(
    record: Any, number: int, clients: int | None = None, participants: int | None = None
) -> str | None:
    """Why a results file's record of round ``number`` cannot be read as one (None when it
    can): a report and a replay publish or compare what it says, so a value out of range
    or a round out of place (a hand edit, a damaged copy) is refused, not used. With
    ``clients`` (the run's), partition ids are checked against it, and the coverage
    against ``participants`` (the clients not held out as new ones; default: all)."""
    if not isinstance(record, dict) or record.get("round") != number:
        return f"rounds[{number - 1}] is not the record of round {number}"
    for key in ACCURACY_FIELDS:
        value = record.get(key)
        if value is not None and not (is_real(value) and 0 <= value <= 1):
            return f"round {number}: {key} is {value!r}; expected a fraction in [0, 1] or null"
    for key in COST_FIELDS:
        if not (is_real(record.get(key)) and record[key] >= 0):
            return f"round {number}: {key} is {record.get(key)!r}; expected a number >= 0"
    for key in (*MEASURE_FIELDS, *NULLABLE_FIELDS):
        value = record.get(key)
        if (key in record and not (value is None and key in NULLABLE_FIELDS)
                and not (is_real(value) and value >= 0)):  # fmt: skip
            return f"round {number}: {key} is {value!r}; expected a number >= 0"
    for key in COUNT_FIELDS:
        if key in record and not is_whole(record[key]):
            return f"round {number}: {key} is {record[key]!r}; expected an integer >= 0"
    return clients_problem(record, number, clients, participants)


#: A partition id as a JSON key: ``0``, ``1``, ... (``01`` would be client 1 twice).
PARTITION_KEY = re.compile(r"0|[1-9][0-9]*")


def clients_problem(
    record: dict[str, Any], number: int, clients: int | None, participants: int | None = None
) -> str | None:
    """The round's client lists: sampled partitions distinct, each client's accuracy a
    fraction, every partition id below the run's number of clients, and the coverage of
    the ``participants`` (default: all of them)."""
    bound = f" below num_clients={clients}" if clients is not None else ""
    if participants is None:
        participants = clients

    def partition(value: Any) -> bool:
        return is_whole(value) and (clients is None or value < clients)

    sampled = record.get("sampled_clients", [])
    if not (isinstance(sampled, list) and all(partition(p) for p in sampled)
            and len(set(sampled)) == len(sampled)):  # fmt: skip
        return f"round {number}: sampled_clients is {sampled!r}; expected distinct ids{bound}"
    for key, upper, expected in (("client_accuracies", 1.0, "a fraction in [0, 1]"),
                                 ("client_train_seconds", math.inf, "a number >= 0")):  # fmt: skip
        per_client = record.get(key)
        if per_client is None:
            continue
        if not isinstance(per_client, dict):
            return f"round {number}: {key} is {per_client!r}; expected an object"
        for client, value in per_client.items():
            if not (PARTITION_KEY.fullmatch(client) and partition(int(client))):
                return f"round {number}: {key} names client {client!r}{bound}"
            if not (is_real(value) and 0 <= value <= upper):
                return f"round {number}: {key}[{client!r}] is {value!r}; expected {expected}"
    coverage = record.get("personal_coverage")
    if coverage is not None:
        covered, of = (coverage.get(k) if isinstance(coverage, dict) else None
                       for k in ("clients", "of_clients"))  # fmt: skip
        if not (is_whole(covered) and is_whole(of) and covered <= of
                and (participants is None or of == participants)):  # fmt: skip
            equal = "" if participants is None else f" = {participants}"
            return (f"round {number}: personal_coverage is {coverage!r}; expected "
                    f"clients <= of_clients{equal}")  # fmt: skip
    return None


def record_problem(document: Any, ended_after: EndedAfter | None = None) -> str | None:
    """Why a results.json is not a consistent record of its rounds (None when it is),
    whatever its status: its rounds in place and in range, no more of them than the run
    plans, and the run-level figures (best accuracies, totals) those the rounds give.
    A report and a replay take a run's figures from it: a hand edit, a damaged copy or a
    record of another run under this one's name must be caught here, not published."""
    if not isinstance(document, dict):
        return "expected a JSON object with config, run and rounds"
    config, run, rounds = (document.get(k) for k in ("config", "run", "rounds"))
    if not isinstance(run, dict):
        return "run is not an object"
    if not isinstance(config, dict) or not isinstance(config.get("algo"), str):
        return "config.algo is missing"
    if run.get("algo", config["algo"]) != config["algo"]:
        return f"run.algo is {run['algo']!r} but config.algo is {config['algo']!r}"
    clients = run.get("num_clients")
    if not (is_whole(clients) and clients >= 1):
        return f"run.num_clients is {clients!r}; expected an integer >= 1"
    if not isinstance(rounds, list):
        return "rounds is not a list"
    fraction = config.get("new-client-fraction") or 0.0
    if not (is_real(fraction) and 0 <= fraction < 1):
        return f"config.new-client-fraction is {fraction!r}; expected a fraction in [0, 1)"
    participants = clients - held_out_count(fraction, clients)  # the new clients apart
    for number, record in enumerate(rounds, start=1):
        problem = round_problem(record, number, clients, participants) or coverage_problem(
            record, run
        )
        if problem:
            return problem
    planned = planned_rounds(document, ended_after)
    if planned is not None and len(rounds) > planned:
        return f"it records {len(rounds)} rounds, more than the {planned} the run plans"
    return figures_problem(document, rounds)


def coverage_problem(record: dict[str, Any], run: dict[str, Any]) -> str | None:
    """A round's all-client figures must be of all clients (``round_record`` writes them
    only then): the personal accuracy and its spread, and the global accuracy where the
    clients evaluate it, are null unless every client answered; one client accuracy per
    client that answered. Else a partial figure would be published as the whole."""
    if "personal_coverage" not in record:
        return None  # a record from before coverage was written: nothing to hold it to
    coverage, number = record["personal_coverage"], record["round"]
    complete = coverage is not None and coverage["clients"] == coverage["of_clients"]
    whole = ["personal_accuracy", "personal_accuracy_std", "personal_accuracy_honest",
             *CLIENT_FIGURES]  # fmt: skip
    if run.get("global_evaluation") == "clients":
        whole.append("global_accuracy")
    for key in whole:
        if record.get(key) is not None and not complete:
            return (f"round {number}: {key} is {record[key]!r} but personal_coverage is "
                    f"{coverage!r}: an all-client figure needs every client")  # fmt: skip
    accuracies = record.get("client_accuracies")
    if accuracies is not None and len(accuracies) != (coverage or {}).get("clients", 0):
        return (f"round {number}: {len(accuracies)} client_accuracies but personal_coverage is "
                f"{coverage!r}")  # fmt: skip
    return None


#: ``run`` key: the round after which the algorithm itself ended the run, short of
#: ``num-server-rounds`` (deviation tracking, once its fine-tune rounds are done).
ENDED_AFTER_ROUND = "ended_after_round"


#: The round a record says its run ended after, where its algorithm may end a run before
#: ``num-server-rounds`` (None where it cannot: an edited file cannot shorten the run).
#: The registry's, which knows the algorithms (this module sits below them).
EndedAfter = Callable[[dict[str, Any]], int | None]


def planned_rounds(document: dict[str, Any], ended_after: EndedAfter | None = None) -> int | None:
    """The rounds a finished run has: ``num-server-rounds``, or, for an algorithm that
    may end early, the round it ended the run after (``ended_after``). None when the
    config names no round count (:func:`status_problem` refuses that)."""
    planned = document["config"].get("num-server-rounds")
    if not is_count(planned):
        return None
    ended = None if ended_after is None else ended_after(document)
    return ended if is_whole(ended) and ended <= planned else planned


def figures_problem(document: dict[str, Any], rounds: list[dict[str, Any]]) -> str | None:
    """The best figures and totals a file states must be the rounds' (a missing one too:
    every version that writes rounds writes them)."""
    for best, field_name in BEST_OF.items():
        expected = _best([r.get(field_name) for r in rounds])
        if document.get(best, expected) != expected or (
            best not in document and expected is not None
        ):
            return (f"{best} is {document.get(best, 'missing')!r} but the rounds' best "
                    f"{field_name} is {expected!r}")  # fmt: skip
    for key, expected in summarised_figures(rounds).items():
        if key in document and not _close(document[key], expected):  # older files lack them
            return f"{key} is {document[key]!r} but the rounds give {expected!r}"
    for total, field_name in TOTAL_OF.items():
        expected = sum(r.get(field_name, 0) for r in rounds)
        if document.get(total, expected) != expected or (total not in document and expected):
            return (f"{total} is {document.get(total, 'missing')!r} but the rounds' "
                    f"{field_name} sum to {expected}")  # fmt: skip
    return None


def status_problem(document: dict[str, Any], ended_after: EndedAfter | None = None) -> str | None:
    """A finished run's status must be what its rounds say (``ResultsWriter.finish``
    decides it from them): every planned round recorded, and ``degraded`` exactly when
    some round had a reply missing or rejected, a client not evaluated or a state reset.
    A ``completed`` over failed rounds would publish a figure without its mark."""
    status, rounds = document["run"].get("status"), document["rounds"]
    if status not in (COMPLETED, DEGRADED):
        return None
    planned = planned_rounds(document, ended_after)
    if planned is None:
        found = document["config"].get("num-server-rounds", "missing")
        return f"config.num-server-rounds is {found!r}; expected an integer >= 1"
    if len(rounds) != planned:
        return f"status {status!r} but it records {len(rounds)} of the {planned} rounds"
    rule = document["run"].get("status_rule", 1)  # files of earlier versions: rule 1
    if type(rule) is not int or not 1 <= rule <= STATUS_RULE:
        return f"run.status_rule is {rule!r}; expected 1 to {STATUS_RULE}"
    degraded = [r["round"] for r in rounds if round_degraded(r, rule)]
    if (status == DEGRADED) != bool(degraded):
        which = f"rounds {degraded[:3]} are degraded" if degraded else "no round is degraded"
        return f"status {status!r} but {which}"
    return None


def round_degraded(record: dict[str, Any], rule: int = STATUS_RULE) -> bool:
    """Whether a round (a :class:`RoundRecord`'s fields, or a round as written) had a
    reply missing or rejected, a client not evaluated, or (``rule`` 2, this version's) a
    client whose private state started afresh (its figures are not those of a client
    that kept it)."""
    coverage = record.get("personal_coverage")
    incomplete = coverage is not None and coverage["clients"] < coverage["of_clients"]
    resets = rule >= 2 and bool(record.get("state_resets"))
    return bool(record.get("train_failures") or record.get("eval_failures") or incomplete
                or resets)  # fmt: skip


def _close(stated: Any, expected: float | None) -> bool:
    """A stated mean against the one the rounds give (equal up to summation order)."""
    if stated is None or expected is None:
        return stated is expected
    return is_real(stated) and math.isclose(stated, expected, rel_tol=1e-12, abs_tol=1e-15)


def _best(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


class ResultsWriter:
    """Owns one run folder; ``add`` appends a round and rewrites both files."""

    def __init__(
        self,
        folder: Path,
        config: dict[str, Any],
        run: dict[str, Any],
        rounds: list[RoundRecord] | None = None,
        tensorboard: bool = False,
    ) -> None:
        """A new run (no ``rounds``), or one continued with the rounds it keeps; ``run``
        keeps its ``started`` time if it has one. ``tensorboard``: also write each round's
        scalars as TensorBoard event files in the folder (rewritten from ``rounds`` now)."""
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.run = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), **run, "status": RUNNING,
                    "status_rule": STATUS_RULE}  # fmt: skip
        self.run.pop("error", None)
        self.rounds: list[RoundRecord] = list(rounds or [])
        self.events = TensorBoardLog(folder, self.rounds) if tensorboard else None
        self._write()

    @classmethod
    def resume(
        cls, folder: Path, config: dict[str, Any], run: dict[str, Any], after_round: int,
        tensorboard: bool = False, seal: dict[str, Any] | None = None,
    ) -> ResultsWriter:  # fmt: skip
        """Continue a run folder: its rounds up to the checkpoint's are kept (a round
        written after the last checkpoint is dropped, to be run again). The kept rounds
        come from disk: each must be there, in place and in range, and be the rounds the
        checkpoint sealed (``seal``, where it has one), or the resume is refused
        (:class:`ValueError` naming the file and round) before anything is written."""
        path = folder / "results.json"
        document = json.loads(path.read_text())
        problem = kept_rounds_problem(document, after_round, seal)
        if problem:
            raise ValueError(
                f"resume: {path}: {problem}; the checkpoint is of round {after_round}, so "
                "rounds 1 to it are kept from this file: start the run anew"
            )
        began_from, now = document["run"].get(INIT_MODEL_SHA256), run.get(INIT_MODEL_SHA256)
        if began_from is not None and now != began_from:
            raise ValueError(
                f"resume: init-model is not the file the run began from (sha256 "
                f"{str(now)[:12]}, the run's {str(began_from)[:12]}): clients not yet "
                "trained would start their private parts from other weights"
            )
        resumes = [*document["run"].get("resumed", []), {
            "run_id": run["run_id"], "after_round": after_round,
            "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            **({"environment": run["environment"]} if "environment" in run else {}),
        }]  # fmt: skip
        # What the interrupted attempt concluded (an error, a status, an end time) is not
        # this attempt's: it is decided again when the resumed run ends. Nor is the data
        # digest, a claim on the whole run's samples: only an attempt that compared the
        # checkpoint's digests with its own data states it (``run``).
        earlier = {k: v for k, v in document["run"].items()
                   if k not in ("error", "finished", "status", "stopped", "data_digest",
                                ENDED_AFTER_ROUND)}  # fmt: skip
        continued = {
            **earlier, **run, "resumed": resumes, "status": RUNNING,
            "run_id": document["run"]["run_id"],  # the first run's id names the folder
        }  # fmt: skip
        # The rounds kept were made where the first attempt ran; each resume names its own.
        # (With no round kept, every round is this attempt's.)
        if after_round > 0:
            continued.pop("environment", None)
            if "environment" in earlier:
                continued["environment"] = earlier["environment"]
        kept = [RoundRecord(**r) for r in document["rounds"][:after_round]]
        return cls(folder, config, continued, kept, tensorboard)

    @property
    def json_path(self) -> Path:
        return self.folder / "results.json"

    def add(self, record: RoundRecord) -> None:
        self.rounds.append(record)
        self._write()
        if self.events is not None:  # after results.json: the events never lead it
            self.events.add(record)

    def finish(self, error: str | None = None) -> str:
        """Close the run: ``failed`` with the error, else ``degraded`` if any round was,
        else ``completed``. Returns the status."""
        if error is not None:
            status = FAILED
            self.run["error"] = error
        else:
            status = DEGRADED if any(r.degraded for r in self.rounds) else COMPLETED
        self.run["status"] = status
        self.run["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        self._write()
        if self.events is not None:
            self.events.close()
        return status

    def summary(self) -> dict[str, Any]:
        best = {key: _best([getattr(r, field) for r in self.rounds])
                for key, field in BEST_OF.items()}  # fmt: skip
        best_global, best_personal = best["best_global_accuracy"], best["best_personal_accuracy"]
        score = math.log10(best_global / best_personal) if best_global and best_personal else None
        return {
            "total_bytes_to_clients": sum(r.bytes_to_clients for r in self.rounds),
            "total_bytes_from_clients": sum(r.bytes_from_clients for r in self.rounds),
            "total_train_bytes_to_clients": sum(r.train_bytes_to_clients for r in self.rounds),
            "total_train_bytes_from_clients": sum(r.train_bytes_from_clients for r in self.rounds),
            "total_trained_parameters": sum(r.trained_parameters for r in self.rounds),
            **best,
            **summarised_figures([{f: getattr(r, f) for f in SUMMARISED} for r in self.rounds]),
            # FedReG paper, Figure 7: log10(g / p) of the best global and best personal
            # accuracy; 0 means the global model is as good as the personal ones.
            "log10_global_over_personal": score,
        }

    def seal(self) -> dict[str, Any]:
        """What a checkpoint made now records of this file: the run id and a sha256 of
        its rounds as they are on disk (the text just written, parsed: a resume hashes the
        same values)."""
        rounds, names = json.loads(self._written)["rounds"], round_fields()
        return {"run_id": self.run["run_id"], "rounds_sha256": rounds_sha256(rounds, names),
                "fields": names}  # fmt: skip

    def _write(self) -> None:
        document = {
            "config": self.config,
            "run": self.run,
            "rounds": [asdict(r) for r in self.rounds],
            **self.summary(),
        }
        self._written = results_text(document)  # what the file now holds, for seal()
        write_text_atomic(self.json_path, self._written, shared=True)
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(CSV_COLUMNS)
        for r in self.rounds:
            writer.writerow(["" if getattr(r, c) is None else getattr(r, c) for c in CSV_COLUMNS])
        write_text_atomic(self.folder / "rounds.csv", buffer.getvalue(), shared=True)


def results_text(document: dict[str, Any]) -> str:
    """A results.json's text: indented, each round on one line."""
    return json_text(document, rows="rounds")


def relayout_results(path: Path) -> bool:
    """Rewrite a results.json written by an earlier version (fully indented) in this
    version's layout (:func:`results_text`), atomically; its parsed value, and so its
    seal and every figure, is unchanged. False, and nothing written, when it already is
    in that layout. Raises what reading or parsing it raises."""
    text = path.read_text()
    document = json.loads(text)
    relaid = results_text(document)
    if relaid == text:
        return False
    if json.loads(relaid) != document:  # a NaN token of an old file, say: keep the file
        raise ValueError(f"{path}: its value would change in the new layout; left as is")
    write_text_atomic(path, relaid, shared=True)
    return True


#: Run info: the sha256 of the ``init-model`` file a run began from (absent without one);
#: a resume must begin from the same weights.
INIT_MODEL_SHA256 = "init_model_sha256"

#: The round-record fields of the last version whose seals named none: such a seal hashed
#: these (or, made before ``global_model_kept`` came, these but that one). Fields added
#: since are named by every seal that hashed them.
UNNAMED_SEAL_FIELDS = frozenset({
    "bytes_from_clients", "bytes_to_clients", "client_accuracies", "client_compute_seconds",
    "client_handler_seconds", "client_hosts", "clients_trained", "dp_epsilon", "errors",
    "eval_compute_seconds", "eval_failures", "eval_replies", "eval_seconds",
    "global_accuracy", "global_accuracy_answered", "global_model_kept",
    "num_train_examples", "personal_accuracy", "personal_accuracy_answered",
    "personal_accuracy_sampled", "personal_accuracy_std", "personal_coverage", "round",
    "sampled_clients", "server_eval_seconds", "slowest_handlers_seconds", "state_resets",
    "train_bytes_from_clients", "train_bytes_to_clients", "train_failures", "train_replies",
    "train_seconds", "trained_parameters",
})  # fmt: skip
#: Fields RoundRecord gained after checkpoints began to seal results.json but before
#: seals named the fields they hashed.
UNNAMED_SEAL_LATER_FIELDS = frozenset({"global_model_kept"})


def round_fields() -> list[str]:
    """This version's round-record fields, as a seal names them."""
    return sorted(f.name for f in fields(RoundRecord))


def rounds_sha256(rounds: list[dict[str, Any]], only: Collection[str] | None = None) -> str:
    """A digest of round records as ``results.json`` holds them (parsed JSON), in their
    normal form: every field of this version (``only``: of those), its default where a
    round written by an earlier version lacks it. A resume rewrites its kept rounds in
    that form, so a later resume from the same checkpoint still finds the rounds it
    sealed; a seal names the fields it hashed, so a field added later changes nothing."""
    normal = [asdict(RoundRecord(**r)) for r in rounds]
    if only is not None:
        normal = [{k: v for k, v in record.items() if k in only} for record in normal]
    text = json.dumps(normal, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def sealed_rounds_match(rounds: list[dict[str, Any]], seal: dict[str, Any]) -> bool:
    """Whether ``rounds`` are the ones the seal hashed, over the fields it names (a seal
    without names: :data:`UNNAMED_SEAL_FIELDS`, or those without the ones in
    :data:`UNNAMED_SEAL_LATER_FIELDS`)."""
    named = seal.get("fields")
    unnamed = UNNAMED_SEAL_FIELDS
    candidates = [set(named)] if named else [unnamed, unnamed - UNNAMED_SEAL_LATER_FIELDS]
    return any(rounds_sha256(rounds, c) == seal["rounds_sha256"] for c in candidates)


def kept_rounds_problem(
    document: Any, after_round: int, seal: dict[str, Any] | None = None
) -> str | None:
    """Why a results.json cannot give a resume its first ``after_round`` rounds (None
    when it can): a hole, a value out of range or a key this version does not know
    would be carried into the finished run's record and its best figures; and, given
    the checkpoint's ``seal``, rounds other than those it continues (another run's
    results.json copied in, or rounds edited) would be published as this run's."""
    if not isinstance(document, dict) or not isinstance(document.get("run"), dict):
        return "expected a JSON object with run and rounds"
    if not is_whole(document["run"].get("run_id")):
        return f"run.run_id is {document['run'].get('run_id')!r}; expected the run's id"
    rounds = document.get("rounds")
    if not isinstance(rounds, list) or len(rounds) < after_round:
        held = len(rounds) if isinstance(rounds, list) else rounds
        return f"it holds {held!r} rounds, fewer than the checkpoint's"
    known = {f.name for f in fields(RoundRecord)}
    required = [f.name for f in fields(RoundRecord)
                if f.default is MISSING and f.default_factory is MISSING]  # fmt: skip
    for number, record in enumerate(rounds[:after_round], start=1):
        problem = round_problem(record, number)
        if problem:
            return problem
        unknown = sorted(set(record) - known)
        if unknown:
            return f"round {number} has keys this version does not know: {unknown[:3]}"
        missing = [key for key in required if key not in record]
        if missing:
            return f"round {number} lacks {missing[:3]}"
    if seal is not None:
        run_id = document["run"].get("run_id")
        if run_id != seal["run_id"]:
            return (
                f"it is the record of run {run_id!r}, the checkpoint continues run "
                f"{seal['run_id']} (another run's results.json?)"
            )
        if not sealed_rounds_match(rounds[:after_round], seal):
            return (
                f"its rounds 1-{after_round} are not the ones the checkpoint sealed (edited, "
                "or another run's results.json)"
            )
    return None


def mark_stopped(folder: Path, reason: str, checkpoint_round: int) -> bool:
    """Rewrite a run folder's results.json to say the runner stopped it: status
    ``stopped``, why, and the round a resume continues after. Called once nothing else
    writes the file: by the runner once the ServerApp is gone, or by the ServerApp itself
    on its way out of a stop. The rounds are kept; an error the ServerApp
    wrote on its way out (it was stopped mid-round) is kept as ``stopped.server_error``.
    False, and nothing written, if there is no readable results.json or the run had
    finished (``completed`` / ``degraded``) before the stop."""
    path = folder / "results.json"
    try:
        document = json.loads(path.read_text())
        run = document["run"]
        status = run.get("status")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    if status not in (RUNNING, FAILED, STOPPED):
        return False
    stopped = {
        "reason": reason, "after_round": checkpoint_round,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }  # fmt: skip
    if status == FAILED and run.get("error"):
        stopped["server_error"] = first_line(str(run["error"]))
    run.pop("finished", None)
    run.pop("error", None)
    run.update(status=STOPPED, stopped=stopped)
    write_text_atomic(path, results_text(document), shared=True)
    return True


def first_line(text: str) -> str:
    """The first non-empty line of an error (Flower's reasons carry whole tracebacks);
    for a traceback, its last line: the exception itself."""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    if not lines:
        return "(no message)"
    if lines[0].startswith("Traceback") or "Traceback (most recent call last)" in text:
        return lines[-1][:500]
    return lines[0][:500]


#: Terminal colour codes, which Ray puts around the actor's name in its task errors.
ANSI_CODES = re.compile(r"\x1b\[[0-9;]*m")
#: How Flower words a ClientApp's exception in its error reply:
#: ``str(type(ex)) + ":<'" + str(ex) + "'>"`` (``flwr/supernode/runtime/run_clientapp.py``
#: in a deployment, ``flwr/server/superlink/fleet/vce/vce_api.py`` in the simulation).
FLOWER_REASON = re.compile(r"<class '([^']+)'>:<'(.*)'>", re.DOTALL)
#: The lines Python puts between the exceptions of a chain.
CHAIN_SEPARATORS = re.compile(
    r"^(?:The above exception was the direct cause of the following exception:"
    r"|During handling of the above exception, another exception occurred:)$",
    re.MULTILINE,
)
#: The wrapper the simulation's actor raises around every ClientApp exception.
FLOWER_WRAPPER = "flwr.clientapp.client_app.ClientAppException"


def client_error(reason: str) -> str:
    """A client's failure as one line that names the exception, ``OSError: disk on fire``,
    from the reason Flower's error reply carries. In a deployment that is
    ``<class 'OSError'>:<'disk on fire'>``; in the simulation, the type is Ray's task
    error and the message the actor's chained traceback (colour codes, its PID, and
    Flower's ``ClientAppException`` around the ClientApp's own exception). Anything else
    (Flower's own reasons) gives its first line."""
    text = ANSI_CODES.sub("", str(reason)).strip()
    match = FLOWER_REASON.fullmatch(text)
    if match is None:
        return first_line(text)
    kind, message = match.groups()
    if 'File "' in message:
        raised = raised_in_traceback(message)
        if raised is not None:
            return raised[:500]
    described = first_line(message) if message.strip() else ""
    return f"{kind}: {described}"[:500] if described else kind


def raised_in_traceback(text: str) -> str | None:
    """The exception line (``OSError: disk on fire``) of the last exception of a printed
    chain that is not Flower's wrapper: the one the ClientApp raised."""
    raised = []
    for block in CHAIN_SEPARATORS.split(text):
        lines = block.splitlines()
        frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
        after = lines[frames[-1] + 1 :] if frames else lines  # Ray may drop the frames
        found = next((line for line in after if line.strip() and not line[0].isspace()
                      and not line.startswith("ray::")), None)  # fmt: skip
        if found is not None and not found.startswith(FLOWER_WRAPPER):
            raised.append(found.strip())
    return raised[-1] if raised else None
