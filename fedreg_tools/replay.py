"""Replay the first rounds of a recorded run and check that they come out the same.

``results.json`` keeps the whole run config as it ran (``config``) and the number of
clients (``run.num_clients``). ``fedreg-replay`` runs that config again, through the same
machinery as ``fedreg-experiment`` (a :class:`~fedreg_tools.launcher.LocalSuperLink` we own,
``flwr run`` in Flower's simulation), into a fresh results folder and client state folder,
and stops it (by PID, with everything it started) as soon as round N is checkpointed. The
run is not shortened: ``num-server-rounds`` stays as recorded, because schedules depend on
it (FedBABU's final fine-tune, FedSeq's unfreeze rounds, ``eval-every``).

Rounds 1..N are then compared, field by field: the global, personal and answered personal
accuracy, every client's accuracy, the sampled clients and the training examples. On the
same kind of machine a CPU run is deterministic (seeded sampling, partitions and training),
so the aim is bit-identical figures; a round evaluated in one run and not in the other is a
difference too. Exit status: 0 identical, 1 some difference (or the replay stopped before
round N), 2 a bad command line or results file (reported before any work), 130 / 143
stopped by SIGINT / SIGTERM.

    fedreg-replay results/.../seed0/results.json --rounds 3 \\
        --set dataset-path=/path/to/fashion_mnist

``--against OTHER`` compares two recorded runs of the same config without running
anything (a rerun on another machine, a resumed run and an uninterrupted one), over the
rounds both record or the first ``--rounds``; configs that differ in anything but where
they read and wrote are refused, by key.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedreg_app.core.checkpoint import committed_round
from fedreg_app.core.config import ConfigError, RunConfig, as_ran, earlier_meanings
from fedreg_app.core.environment import client_devices, describe_environment, environment_note
from fedreg_app.core.metrics import INIT_MODEL_SHA256, first_line, record_problem, status_problem
from fedreg_tools.launcher import (
    ONE_CPU,
    SUPERLINK_HOME,
    ClientResources,
    LocalSuperLink,
    add_resource_arguments,
    resources_of,
)
from fedreg_tools.overrides import check_declared, declared_run_config, parse_overrides
from fedreg_tools.run_records import placement_problem, read_sealed, seal_problem
from fedreg_tools.runner_plan import write_run_config
from fedreg_tools.runner_session import Stop, stop_on_signals

#: Per-round fields compared; the accuracies are fractions in [0, 1] (or None).
ACCURACIES = (
    "global_accuracy",
    "personal_accuracy",
    "personal_accuracy_answered",
    "client_accuracies",
)
COMPARED = (*ACCURACIES, "sampled_clients", "num_train_examples")
#: Compared where both records have them (older records do not): in a degraded round the
#: answering clients' G is the round's only global figure; FedReG's λ where it weights
#: the received head.
COMPARED_IF_RECORDED = (
    "global_accuracy_answered", "personal_accuracy_sampled", "personal_global_weight",
    "personal_accuracy_honest",
)  # fmt: skip
#: Keys ``--set`` may change: where the same inputs lie on this machine, and how the same
#: steps are launched (``cuda-graphs``: whether replayed graphs give the eager record's
#: figures is what such a replay checks); any other key would make it a different run.
INPUT_PATHS = ("dataset-path", "init-model")
LAUNCH_KEYS = ("cuda-graphs",)
SETTABLE = (*INPUT_PATHS, *LAUNCH_KEYS)
#: Keys two runs of the same config may differ in: where they read and wrote, and how
#: their steps were launched.
LOCATIONS = (*SETTABLE, "results-dir", "state-dir", "resume")
EXIT_DIFFERENT = 1
#: The replay ended before the asked round (it failed to start, or its run failed): what
#: it replayed is compared, but the rounds it never reached are no numeric difference.
EXIT_ENDED_EARLY = 3
MAX_ROWS = 40  # difference rows printed; the rest are counted


@dataclass(frozen=True)
class Recording:
    """What a results.json says about a run: its config, clients and round records."""

    path: Path
    config: dict[str, Any]
    num_clients: int
    rounds: list[dict[str, Any]]
    run: dict[str, Any]


@dataclass(frozen=True)
class Difference:
    """One field of one round that differs; ``abs_diff`` where both are numbers."""

    round: int
    field: str
    recorded: Any
    replayed: Any
    abs_diff: float | None = None


# --------------------------------------------------------------- validation
def read_recording(path: Path) -> Recording:
    """The results.json at ``path`` (or in the folder ``path``), checked for everything a
    replay needs; :class:`ConfigError` names the file and what is wrong."""
    if path.is_dir():
        path = path / "results.json"
    try:
        document, seal = read_sealed(path)
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror or err})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: is not JSON ({err})") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: expected a JSON object with config, run and rounds")
    missing = [k for k in ("config", "run", "rounds") if k not in document]
    if missing:
        raise ConfigError(f"{path}: missing key(s) {', '.join(missing)} (not a run's results)")
    # whatever its status (a failed run's first rounds replay too), as a report reads it
    # a record beside a checkpoint must be the one it sealed, as a report requires: a
    # replay of an edited record would "confirm" figures nobody's run produced
    from fedreg_app.registry import ended_after  # the algorithms bring torch: not at start

    problem = (record_problem(document, ended_after) or status_problem(document, ended_after)
               or placement_problem(path, document)
               or seal_problem(seal, document))  # fmt: skip
    if problem:
        raise ConfigError(f"{path}: {problem}")
    config, run, rounds = document["config"], document["run"], document["rounds"]
    clients = run["num_clients"]
    for index, record in enumerate(rounds, start=1):
        absent = [k for k in COMPARED if k not in record]
        if absent:
            raise ConfigError(f"{path}: round {index} has no {', '.join(absent)}")
    return Recording(path.resolve(), config, clients, rounds, run)


def check_rounds(recording: Recording, rounds: int) -> None:
    """``--rounds`` must lie within the rounds the file records."""
    recorded = len(recording.rounds)
    if not recorded:
        raise ConfigError(f"{recording.path} records no round yet; nothing to replay")
    if not 1 <= rounds <= recorded:
        planned = recording.config.get("num-server-rounds", "?")
        raise ConfigError(
            f"--rounds={rounds} is not allowed: expected 1..{recorded}, the rounds "
            f"{recording.path} records (of num-server-rounds={planned})"
        )


def check_same_run(first: Recording, second: Recording) -> list[str]:
    """Two recordings compared with ``--against`` must be runs of one config: a key both
    record with different values (other than :data:`LOCATIONS`) or another number of
    clients raises :class:`ConfigError` naming them. Returns notes on keys only one
    records (it ran with that version's default)."""
    if first.num_clients != second.num_clients:
        raise ConfigError(
            f"run.num_clients differs: {first.num_clients} in {first.path}, "
            f"{second.num_clients} in {second.path}; not runs of the same config"
        )
    from fedreg_app.registry import CATALOG  # the algorithms bring torch: not at start

    ours, theirs = as_ran(first.config, CATALOG), as_ran(second.config, CATALOG)  # earlier's too
    both = (set(ours) & set(theirs)) - set(LOCATIONS)
    differing = sorted(k for k in both if not _same(ours[k], theirs[k]))
    if differing:
        shown = "; ".join(f"{k}={ours[k]!r} vs {theirs[k]!r}" for k in differing)
        raise ConfigError(f"the two runs' configs differ ({shown}); not runs of the same config")
    earlier = earlier_meanings(CATALOG)
    return [
        f"{key} is recorded only in {where.path} ({where.config[key]!r})"
        for where, other in ((first, second), (second, first))
        for key in sorted(set(where.config) - set(other.config) - set(LOCATIONS))
        if key not in earlier
    ]


def replay_config(
    recording: Recording, overrides: dict[str, Any], out: Path, declared: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The recorded config as it ran, with fresh ``results-dir`` / ``state-dir`` under
    ``out``, no ``resume`` and the ``--set`` paths; validated before any work. Returns it
    and notes for the user: the keys of the shared config and of the recorded algorithm
    that the file does not record run with today's defaults (another algorithm's keys
    change nothing and are not named)."""
    from fedreg_app.registry import CATALOG, load_config  # the algorithms bring torch

    refused = sorted(set(overrides) - set(SETTABLE))
    if refused:
        raise ConfigError(
            f"--set {', '.join(refused)}: a replay runs the recorded config; only "
            f"{', '.join(SETTABLE)} (where the same inputs lie on this machine, how the "
            "steps are launched) may be set"
        )
    recorded = as_ran(recording.config, CATALOG)  # keys its version lacked, as it ran them
    check_declared(recorded, declared, f"the recorded config (in {recording.path}); "
                   "it was made by another version of the app")  # fmt: skip
    config = {**recorded, **overrides, "resume": "", "results-dir": str(out / "results")}
    if recorded.get("state-dir"):  # "" kept the clients' state in memory: so does the replay
        config["state-dir"] = str(out / "state")
    for key in INPUT_PATHS:
        value = str(config.get(key) or "")
        if value and not Path(value).expanduser().exists():
            given = "given with --set" if key in overrides else f"recorded in {recording.path}"
            raise ConfigError(
                f"{key}={value!r} ({given}) does not exist on this machine; give its location "
                f"with --set {key}=/path/to/{Path(value).name}"
            )
        if value:
            config[key] = str(Path(value).expanduser().resolve())
    try:  # a bad value fails here, not in the ServerApp
        load_config({**declared, **config})
    except ConfigError as err:
        raise ConfigError(f"the config recorded in {recording.path}: {err}") from None
    its_keys = {*RunConfig.core_keys(), *CATALOG[recorded["algo"]].declared()}
    notes = [
        f"{key} is not recorded; the replay uses today's default {declared[key]!r}"
        for key in declared if key not in recorded and key in its_keys
    ] + [
        f"{key} is not recorded: the version that made the run had no such key and ran as "
        f"{key}={value!r} (today's default {declared.get(key)!r}); so does the replay"
        for key, value in recorded.items() if key not in recording.config
    ]  # fmt: skip
    return config, notes


# ---------------------------------------------------------------- comparing
def _same(a: Any, b: Any) -> bool:
    both_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    return both_nan or (type(a) is type(b) or _number(a) and _number(b)) and a == b


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _difference(round_: int, field: str, recorded: Any, replayed: Any) -> Difference:
    numeric = _number(recorded) and _number(replayed)
    return Difference(round_, field, recorded, replayed,
                      abs(recorded - replayed) if numeric else None)  # fmt: skip


def compare_round(recorded: dict[str, Any], replayed: dict[str, Any]) -> list[Difference]:
    """The compared fields of one round that differ; client accuracies client by client
    (a client present in one and not the other, or a round evaluated in one only, too)."""
    number, found = int(recorded["round"]), []
    for field in COMPARED:
        mine, theirs = recorded.get(field), replayed.get(field)
        if field == "client_accuracies" and isinstance(mine, dict) and isinstance(theirs, dict):
            for client in sorted(set(mine) | set(theirs), key=_client_order):
                a, b = mine.get(client), theirs.get(client)
                if not _same(a, b):
                    found.append(_difference(number, f"client_accuracies[{client}]", a, b))
        elif not _same(mine, theirs):
            found.append(_difference(number, field, mine, theirs))
    for field in COMPARED_IF_RECORDED:
        both = field in recorded and field in replayed
        if both and not _same(recorded[field], replayed[field]):
            found.append(_difference(number, field, recorded[field], replayed[field]))
    return found


def _client_order(client: str) -> tuple[int, str]:
    return (int(client), "") if client.isdigit() else (1 << 62, client)


def compare_rounds(
    recorded: list[dict[str, Any]], replayed: list[dict[str, Any]], rounds: int
) -> list[Difference]:
    """Every difference in rounds 1..``rounds``; a round the replay did not reach is one."""
    theirs = {r.get("round"): r for r in replayed}
    found: list[Difference] = []
    for record in recorded[:rounds]:
        other = theirs.get(record["round"])
        if other is None:
            found.append(Difference(record["round"], "round", "recorded", "not replayed"))
        else:
            found.extend(compare_round(record, other))
    return found


def max_abs_diff(differences: list[Difference]) -> float:
    """The largest |recorded - replayed| among the differing accuracies that both runs
    have (0.0 when they all agree); other differences only show in the table."""
    gaps = [
        d.abs_diff for d in differences
        if d.field.startswith(ACCURACIES + COMPARED_IF_RECORDED)
        and d.abs_diff is not None and not math.isnan(d.abs_diff)
    ]  # fmt: skip
    return max(gaps, default=0.0)


# ----------------------------------------------------------------- printing
def _show(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return repr(value)
    text = json.dumps(value) if isinstance(value, list | dict) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def round_table(recorded: list[dict[str, Any]], replayed: list[dict[str, Any]],
                rounds: int, names: tuple[str, str] = ("recorded", "replayed")) -> str:  # fmt: skip
    """One line per round: the headline accuracies of both runs and whether it agrees."""
    theirs = {r.get("round"): r for r in replayed}
    a, b = names
    lines = [
        f"| round | global {a} | global {b} | personal {a} | personal {b} | same |",
        "|---|---|---|---|---|---|",
    ]
    for record in recorded[:rounds]:
        other = theirs.get(record["round"], {})
        same = bool(other) and not compare_round(record, other)
        lines.append(
            f"| {record['round']} | {_show(record['global_accuracy'])} "
            f"| {_show(other.get('global_accuracy'))} | {_show(record['personal_accuracy'])} "
            f"| {_show(other.get('personal_accuracy'))} | {'yes' if same else 'NO'} |"
        )
    return "\n".join(lines)


def difference_table(differences: list[Difference],
                     names: tuple[str, str] = ("recorded", "replayed")) -> str:  # fmt: skip
    lines = [f"| round | field | {names[0]} | {names[1]} | abs diff |", "|---|---|---|---|---|"]
    for d in differences[:MAX_ROWS]:
        diff = "" if d.abs_diff is None else f"{d.abs_diff:.6g}"
        lines.append(f"| {d.round} | {d.field} | {_show(d.recorded)} | {_show(d.replayed)} "
                     f"| {diff} |")  # fmt: skip
    if len(differences) > MAX_ROWS:
        lines.append(f"... and {len(differences) - MAX_ROWS} more differences")
    return "\n".join(lines)


def summary_line(rounds: int, differences: list[Difference], largest: float,
                 source: Path, replayed: int | None = None) -> str:  # fmt: skip
    """``replay: rounds=N [replayed=K] identical=... max_abs_diff=... [differing_rounds=...]
    source=...``: ``replayed`` only where the replay ended before round N."""
    differing = sorted({d.round for d in differences})
    where = f" differing_rounds={','.join(map(str, differing))}" if differing else ""
    reached = f" replayed={replayed}" if replayed is not None and replayed < rounds else ""
    return (
        f"replay: rounds={rounds}{reached} identical={'false' if differences else 'true'} "
        f"max_abs_diff={largest:.6g}{where} source={source}"
    )


def environment_notes(recording: Recording, current: dict[str, Any]) -> list[str]:
    """Why a replay here may not be bit-identical: the environment the record's first
    attempt (and each resumed attempt) ran in, where it differs from ``current``."""
    notes = []
    first = environment_note(recording.run.get("environment"), current)
    if first:
        notes.append(first)
    for resume in recording.run.get("resumed") or []:
        if isinstance(resume, dict) and "environment" in resume:
            note = environment_note(resume["environment"], current)
            if note:
                notes.append(f"rounds after {resume.get('after_round')}: {note}")
    return notes


def data_notes(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    """Two runs of one config that read other samples (their ``data_digest`` differs: a
    dataset replaced or re-encoded at its path) differ because of the data, whatever the
    code does; runs recorded before the digest existed are not compared. Likewise two
    runs that began from other ``init-model`` files (``init_model_sha256``)."""
    notes = []
    digests = first.get("data_digest"), second.get("data_digest")
    if None not in digests and digests[0] != digests[1]:
        notes.append(
            f"the two runs read other data (data_digest {digests[0][:12]} vs "
            f"{digests[1][:12]}: other samples, or the same ones partitioned otherwise, as by "
            "another flwr-datasets version); their differences come from the data, not from "
            "the code"
        )
    models = first.get(INIT_MODEL_SHA256), second.get(INIT_MODEL_SHA256)
    if None not in models and models[0] != models[1]:
        notes.append(
            f"the two runs began from other init-model files (sha256 {models[0][:12]} vs "
            f"{models[1][:12]}); their differences come from the starting weights, not from "
            "the code"
        )
    return notes


def attempt_environments(recording: Recording) -> list[dict[str, Any]]:
    """The environments a record's attempts ran in: the first's, then each resume's."""
    resumes = [r for r in recording.run.get("resumed") or [] if isinstance(r, dict)]
    found = [recording.run.get("environment"), *(r.get("environment") for r in resumes)]
    return [e for e in found if isinstance(e, dict)]


#: What a client's reply says of where it ran (``client_hosts``), against the keys of
#: :func:`~fedreg_app.core.environment.describe_environment` it corresponds to.
CLIENT_NUMERIC_KEYS = {"torch": "torch", "cpu-capability": "cpu_capability"}


def client_environments(rounds: list[dict[str, Any]], upto: int) -> dict[tuple, list[int]]:
    """The (torch, CPU capability) pairs the clients of rounds 1..``upto`` said they
    trained on, each with the partitions that said it (replies that name neither, as
    records made before clients reported them, are left out)."""
    seen: dict[tuple, set[int]] = {}
    for record in rounds[:upto]:
        hosts = record.get("client_hosts")
        if not isinstance(hosts, dict):
            continue
        for partition, host in hosts.items():
            if not isinstance(host, dict) or not any(k in host for k in CLIENT_NUMERIC_KEYS):
                continue
            kind = tuple((key, host.get(key)) for key in CLIENT_NUMERIC_KEYS)
            if str(partition).isdigit():
                seen.setdefault(kind, set()).add(int(partition))
    return {kind: sorted(partitions) for kind, partitions in seen.items()}


def _describe_kind(kind: tuple, partitions: list[int] | None = None) -> str:
    said = ", ".join(f"{key} {value!r}" for key, value in kind)
    if not partitions:
        return said
    shown = ", ".join(map(str, partitions[:8])) + (" ..." if len(partitions) > 8 else "")
    return f"{said} (partitions {shown})"


def _client_kind(environment: dict[str, Any]) -> tuple:
    """A run environment as the (torch, CPU capability) pair a client reply names."""
    return tuple((key, environment.get(name)) for key, name in CLIENT_NUMERIC_KEYS.items())


def client_environment_notes(recording: Recording, upto: int,
                             current: dict[str, Any]) -> list[str]:  # fmt: skip
    """A note where clients of the compared rounds trained with another torch build or
    CPU kind than ``current`` (a deployed run's devices, or a Ray cluster's machines):
    their updates are replayed here, on this machine's kernels. Clients that ran as the
    record's ServerApp did (a simulation) are left to :func:`environment_notes`."""
    said = {_client_kind(e) for e in attempt_environments(recording)}
    elsewhere = [
        _describe_kind(kind, partitions)
        for kind, partitions in client_environments(recording.rounds, upto).items()
        if kind != _client_kind(current) and kind not in said
    ]
    if not elsewhere:
        return []
    return [
        f"clients of rounds 1..{upto} trained in another environment than this one "
        f"({'; '.join(elsewhere)}): bit-identical figures are expected only where each "
        "update is recomputed on the same CPU kind and torch build"
    ]


def client_environment_differences(first: Recording, second: Recording,
                                   rounds: int) -> list[str]:  # fmt: skip
    """``--against``: a note where the clients of the compared rounds said they trained
    on other (torch, CPU capability) kinds in the two records."""
    kinds = [set(client_environments(r.rounds, rounds)) for r in (first, second)]
    if not kinds[0] or not kinds[1] or kinds[0] == kinds[1]:
        return []
    said = ["; ".join(_describe_kind(kind) for kind in sorted(k, key=str)) for k in kinds]
    return [
        f"clients of rounds 1..{rounds} trained in other environments in the two records "
        f"(the first: {said[0]}; the other: {said[1]}): bit-identical figures are "
        "expected only on the same CPU kinds and torch builds"
    ]


def device_notes(recording: Recording, upto: int, resources: ClientResources) -> list[str]:
    """A note where the record's clients computed on a GPU and this replay's will not
    (or the other way round): kernels of another device round differently."""
    devices = client_devices(recording.rounds, upto)
    gpus = sorted(d for d in devices if d != "cpu")
    if gpus and not resources.gpus:
        return [
            f"the record's clients of rounds 1..{upto} computed on {', '.join(gpus)}; "
            "this replay's clients compute on the CPU: on a machine with that GPU, add "
            "--client-gpus (e.g. 0.1) to compute on it as the record did"
        ]
    if resources.gpus and "cpu" in devices:
        return [
            f"the record's clients of rounds 1..{upto} computed on the CPU; with "
            "--client-gpus this replay's compute on the GPU, which rounds differently"
        ]
    return []


# ------------------------------------------------------------------ running
def run_until_round(
    run_config: dict[str, Any],
    clients: int,
    rounds: int,
    folder: Path,
    poll_seconds: float = 0.5,
    resources: ClientResources = ONE_CPU,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the config in the simulation (client actors reserving ``resources``) until
    round ``rounds`` is checkpointed (or the run ends), then stop the SuperLink and
    everything it started, by PID. Returns the replay's round records and its ``run``
    section (empty if it wrote no results.json)."""
    results_dir = Path(run_config["results-dir"])
    with LocalSuperLink(folder / SUPERLINK_HOME, resources=resources) as superlink:
        config_file = write_run_config(run_config, folder)
        polling = superlink.run_polling(str(config_file), clients, folder / "flwr.log",
                                        poll_seconds)  # fmt: skip
        last = 0
        try:
            for _ in polling:
                done = max((committed_round(f.parent) for f in results_dir.glob("*/results.json")),
                           default=0)  # fmt: skip
                if done != last:
                    print(f"replay: round {done}/{rounds} checkpointed", flush=True)
                    last = done
                if done >= rounds:
                    break
        finally:
            polling.close()  # ends `flwr run`; leaving the block stops the simulation
            config_file.unlink(missing_ok=True)
    found = sorted(results_dir.glob("*/results.json"))
    if not found:
        return [], {}
    document = json.loads(found[-1].read_text())
    return list(document.get("rounds", [])), dict(document.get("run", {}))


def _ended_early(run: dict[str, Any], replayed: int, rounds: int, folder: Path) -> str | None:
    if replayed >= rounds:
        return None
    if not run:
        return f"the replay wrote no results.json; see {folder / 'flwr.log'}"
    error = f": {first_line(run['error'])}" if run.get("error") else ""
    return f"the replay ended after round {replayed} ({run.get('status', '?')}{error})"


# ----------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fedreg-replay",
        description="Rerun the first rounds of a recorded run from its results.json and "
        "check that they give the same per-round figures.",
        epilog="Exit status: 0 identical; 1 some difference; 2 bad arguments or results "
        "file; 3 the replay ended before the asked round, every round it reached identical; "
        "130/143 stopped by SIGINT/SIGTERM.",
    )
    parser.add_argument("results", type=Path, help="a run's results.json (or its folder)")
    parser.add_argument("--rounds", type=int,
                        help="rounds to replay (default 3); with --against, rounds to "
                        "compare (default: every round both record)")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="where an input lies on this machine ("
                        + ", ".join(INPUT_PATHS) + "), or how the steps are launched ("
                        + ", ".join(LAUNCH_KEYS) + ")")  # fmt: skip
    parser.add_argument("--out", type=Path,
                        help="folder for the replay (default: a temporary one, removed "
                        "when the rounds are identical)")  # fmt: skip
    parser.add_argument("--against", type=Path, metavar="OTHER",
                        help="another recorded run of the same config (results.json or "
                        "its folder): compare the two, run nothing")  # fmt: skip
    add_resource_arguments(parser)  # a record whose clients computed on a GPU needs one
    args = parser.parse_args(argv)
    if args.against is not None:
        return compare_recordings(parser, args)
    resources = resources_of(args, parser)
    if args.rounds is None:
        args.rounds = 3
    declared = declared_run_config()
    try:
        recording = read_recording(args.results)
        check_rounds(recording, args.rounds)
        overrides = parse_overrides(args.set)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="replay-", dir=args.out)).resolve()
        try:
            run_config, notes = replay_config(recording, overrides, folder, declared)
        except ConfigError:
            shutil.rmtree(folder, ignore_errors=True)
            raise
    except (ConfigError, OSError) as err:
        parser.error(str(err))
    here = describe_environment()
    for note in [
        *notes,
        *environment_notes(recording, here),
        *client_environment_notes(recording, args.rounds, here),
        *device_notes(recording, args.rounds, resources),
    ]:
        print(f"replay: note: {note}", flush=True)
    print(
        f"replay: rounds 1..{args.rounds} of {run_config.get('algo')} "
        f"(num-server-rounds={run_config.get('num-server-rounds')}, "
        f"{recording.num_clients} clients) from {recording.path} in {folder}",
        flush=True,
    )
    try:
        with stop_on_signals():
            replayed, run = run_until_round(run_config, recording.num_clients, args.rounds,
                                            folder, resources=resources)  # fmt: skip
    except Stop as stop:
        print(f"replay: {stop.reason}; the replay is in {folder}", file=sys.stderr)
        return stop.exit_code
    return report(recording, replayed, run, args.rounds, folder, keep=args.out is not None)


def compare_recordings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--against``: the rounds of two recorded runs of one config, compared as a replay
    is (the first file plays the recorded run, ``OTHER`` the replayed one)."""
    try:
        if args.set or args.out is not None or args.client_gpus:
            raise ConfigError("--against compares two recorded runs; --set, --out and "
                              "--client-gpus do not apply (nothing is run)")  # fmt: skip
        first, second = read_recording(args.results), read_recording(args.against)
        if first.path.samefile(second.path):
            raise ConfigError(f"--against {args.against}: the same file as {args.results} "
                              f"({first.path}); a record always equals itself")  # fmt: skip
        notes = check_same_run(first, second)
        for environment in attempt_environments(second):  # every attempt of the other
            notes += [n for n in environment_notes(first, environment) if n not in notes]
        empty = [r.path for r in (first, second) if not r.rounds]
        if empty:
            raise ConfigError(f"{empty[0]} records no round yet; nothing to compare")
        rounds = args.rounds or min(len(first.rounds), len(second.rounds))
        check_rounds(first, rounds)
        check_rounds(second, rounds)
        notes += client_environment_differences(first, second, rounds)
        notes += data_notes(first.run, second.run)
    except (ConfigError, OSError) as err:
        parser.error(str(err))
    for note in notes:
        print(f"replay: note: {note}", flush=True)
    print(f"replay: rounds 1..{rounds} of {first.path} against {second.path}", flush=True)
    differences = compare_rounds(first.rounds, second.rounds, rounds)
    names = ("first", "other")
    print(round_table(first.rounds, second.rounds, rounds, names))
    if differences:
        print(difference_table(differences, names))
    print(summary_line(rounds, differences, max_abs_diff(differences), first.path)
          + f" against={second.path}", flush=True)  # fmt: skip
    return EXIT_DIFFERENT if differences else 0


def report(recording: Recording, replayed: list[dict[str, Any]], run: dict[str, Any],
           rounds: int, folder: Path, keep: bool) -> int:  # fmt: skip
    """Print the comparison and the summary line; 0 when identical, 1 when a replayed
    round differs, else 3 when the replay ended before round ``rounds`` (the rounds it
    never reached are no numeric difference)."""
    for note in data_notes(recording.run, run):
        print(f"replay: note: {note}", flush=True)
    differences = compare_rounds(recording.rounds, replayed, rounds)
    print(round_table(recording.rounds, replayed, rounds))
    reached = len([r for r in replayed if r.get("round", 0) <= rounds])
    ended = _ended_early(run, reached, rounds, folder)
    if ended:
        print(f"replay: {ended}", file=sys.stderr)
    if differences:
        print(difference_table(differences))
    if differences or keep:
        print(f"replay: the replayed run is in {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    largest = max_abs_diff(differences)
    print(summary_line(rounds, differences, largest, recording.path, reached), flush=True)
    if any(d.round <= reached for d in differences):
        return EXIT_DIFFERENT
    return EXIT_ENDED_EARLY if ended else 0


if __name__ == "__main__":
    sys.exit(main())
