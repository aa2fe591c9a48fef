"""How each pending run of the grid goes on: resumed from a run folder's checkpoint,
started anew, or refused (:class:`Attempt`, :func:`decide`), with the checks that decide
it (the checkpoint, ``results.json``, the clients' state and the data it trained on); the
``runner.json`` markers the runner leaves in run folders; what ``--dry-run`` reports; and
the tidying of what a killed runner left behind. Every decision reads the disk and changes
nothing but markers, so that the session that runs the grid and ``--dry-run`` share it."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedreg_app.core.checkpoint import Checkpoint, state_path
from fedreg_app.core.config import ConfigError, RunConfig, setting_differences
from fedreg_app.core.metrics import FAILED, first_line, kept_rounds_problem
from fedreg_app.core.persist import RUN_FOLDER_LOCK, folder_holder, save_json
from fedreg_tools.run_records import (
    FINISHED,
    INVALID,
    RUNNING,
    UNREADABLE,
    read_document,
    run_status,
)
from fedreg_tools.runner_plan import STATE_FOLDER, RunSpec
from fedreg_tools.runner_progress import Progress, expected_time

if TYPE_CHECKING:
    from fedreg_app.core.data import PartitionKey


# The data (fedreg_app.core.data) and the algorithms (fedreg_app.registry) bring torch: they
# are imported where they are used, so that `fedreg-experiment --help` answers at once.

#: What the runner notes in a run folder: it stopped the run, or started it anew elsewhere.
MARKER = "runner.json"


@dataclass
class Attempt:
    """How a pending run goes on: resumed from a run folder's checkpoint (``resume``,
    after round ``after_round``), started anew (``resume`` None), or not at all
    (``problem``: its folder cannot be trusted, its data changed or cannot be read, or
    another process holds it). ``note`` says why, for the log; ``status`` is the resumed
    run's recorded status."""

    resume: Path | None = None
    after_round: int = 0
    note: str | None = None
    problem: str | None = None
    status: str = ""
    #: A failed run's error (its first line), the run retried from its checkpoint.
    failed_with: str = ""
    #: Whether ``problem`` is one ``--restart-damaged`` starts anew: a folder that cannot be
    #: trusted (checkpoint, results.json, runner.json, clients' state) or data that changed
    #: (data that cannot be read stop the run whatever the flags).
    damaged: bool = False
    #: Whether ``problem`` is a folder another process holds: it may let go any moment
    #: (a killed runner's ServerApp still exiting), so the run is decided again later.
    busy: bool = False

    def refused(self, restart_damaged: bool) -> bool:
        """Whether the run surely cannot go on in this invocation."""
        return self.problem is not None and not self.busy and not (self.damaged and restart_damaged)


#: What a marker may say: why the runner stopped the run, or why it started it anew.
MARKER_REASONS = ("stopped", "abandoned")


def load_marker(run_folder: Path) -> tuple[dict[str, Any], str | None]:
    """The folder's ``runner.json`` (empty if none) and why it is not one the runner wrote
    (None if it is). It decides whether a run is resumed, so a file of another shape is
    not read as a decision: the folder is reported as damaged instead."""
    path = run_folder / MARKER
    if not path.exists():
        return {}, None
    try:
        marker = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return {}, f"{MARKER} is unreadable ({first_line(str(err))})"
    if not isinstance(marker, dict):
        return {}, f"{MARKER} is not an object"
    reasons = [key for key in MARKER_REASONS if key in marker]
    unknown = sorted(set(marker) - {*MARKER_REASONS, "at"})
    if unknown or len(reasons) != 1:
        return {}, (
            f"{MARKER} must hold one of {', '.join(MARKER_REASONS)} and 'at'; "
            f"it holds {', '.join(sorted(marker)) or 'nothing'}"
        )
    for key in (reasons[0], "at"):
        if not isinstance(marker.get(key), str) or not marker[key].strip():
            return {}, f"{MARKER}: {key} must be a non-empty text; it is {marker.get(key)!r}"
    return marker, None


def marker_problem(run_folder: Path) -> str | None:
    """Why the folder's ``runner.json`` is not one the runner wrote (None: none, or a
    good one); see :func:`load_marker`."""
    return load_marker(run_folder)[1]


def read_marker(run_folder: Path) -> dict[str, Any]:
    """What the runner noted in a run folder (``stopped``: it stopped the run itself;
    ``abandoned``: the run was started anew elsewhere); empty if none, or if the file is
    not one the runner wrote (see :func:`load_marker`)."""
    return load_marker(run_folder)[0]


def write_marker(run_folder: Path, **fields: Any) -> None:
    if run_folder.is_dir():
        marker = {**fields, "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        save_json(run_folder / MARKER, marker)


def decide(spec: RunSpec, declared: dict[str, Any], restart_damaged: bool = False) -> Attempt:
    """Resume the newest run folder that holds a checkpoint, if its run did not finish
    (status ``stopped``: the runner stopped it; ``running``: killed with no time to write;
    ``failed``: an error of its own, such as a data folder gone or every client's reply
    lost, which a rerun retries from the last checkpoint, not from round 1); a seed with no
    checkpoint starts anew, and so does a run whose config changed since. A checkpoint,
    ``results.json`` or client state that cannot be trusted stops the run from going on:
    reported, and started anew in a fresh folder only with ``restart_damaged`` (the damaged
    folder is kept, marked)."""
    folder, marker = None, {}
    for candidate in reversed(spec.run_folders()):  # the newest not abandoned
        if not state_path(candidate).exists():
            continue
        marker, problem = load_marker(candidate)
        if problem:  # abandoned or not: not known
            return _damaged(candidate, problem, restart_damaged)
        if not marker.get("abandoned"):
            folder = candidate
            break
    if folder is None:
        started = [f for f in spec.run_folders() if not never_resumed(f)]
        if started:  # stopped or killed before its first checkpoint: nothing to go on from
            return Attempt(note=(f"{started[-1]} stopped before its first checkpoint; "
                                 "starting the run anew"))  # fmt: skip
        return Attempt()
    holder = folder_holder(folder, RUN_FOLDER_LOCK)
    if holder is not None:  # a ServerApp still writes it (one a killed runner left behind)
        return Attempt(problem=(
            f"{folder} is in use by {holder}: not resumed while that process writes it; "
            "stop it (by its PID) or let it end, then run the same command"
        ), busy=True)  # fmt: skip
    document = read_document(folder / "results.json")  # as the report reads it
    status = run_status(document)
    if status == UNREADABLE:
        error = document["run"]["error"].removeprefix("results.json: ")
        return _damaged(folder, f"results.json is unreadable ({error})", restart_damaged)
    if status == INVALID:
        return _damaged(folder, document["run"]["error"], restart_damaged)
    if status in FINISHED:
        return Attempt()
    try:
        checkpoint, _ = Checkpoint.load(folder)
    except ConfigError as err:
        return _damaged(folder, str(err), restart_damaged)
    problem = kept_rounds_problem(document, checkpoint.round, checkpoint.results)
    if problem:
        return _damaged(folder, f"results.json: {problem}", restart_damaged)
    if spec.keeps_state and checkpoint.state_key != folder.name:  # as the ServerApp refuses
        problem = f"its checkpoint belongs to the run folder {checkpoint.state_key!r} (a copy)"
        return _damaged(folder, problem, restart_damaged)
    from fedreg_app.registry import CATALOG, algorithm_of, load_config

    try:
        config = load_config({**declared, **spec.run_config, "resume": str(folder)})
        checkpoint.check_compatible(config, algorithm_of(config).resume_fixed)
    except ConfigError as err:
        return Attempt(note=f"{folder} cannot be resumed with this config ({err}); starting anew")
    # The ServerApp lets a resume change num-server-rounds and eval-every (a deployed run
    # extended); a grid's run resumed so would mix two settings' rounds under the new one
    # (rounds evaluated that an uninterrupted run never evaluates): it starts anew.
    changed = setting_differences(config.to_run_config(), checkpoint.run_config, CATALOG)
    if changed:
        return Attempt(note=(f"{folder} was made with another setting ({'; '.join(changed)}); "
                             "starting the run anew"))  # fmt: skip
    made_with = (checkpoint.clients or {}).get("num_clients") or document["run"].get(
        "num_clients", spec.clients
    )
    if made_with != spec.clients:  # as the ServerApp refuses it (older checkpoints: results)
        return Attempt(note=(f"{folder} cannot be resumed with {spec.clients} clients: its "
                             f"checkpoint was made with {made_with}; starting anew"))  # fmt: skip
    if spec.keeps_state:
        then = checkpoint.run_config.get("state-dir") or ""
        state = spec.state_dir / "runs" / checkpoint.state_key if spec.state_dir else None
        if not then:
            return Attempt(note=f"{folder} kept its clients' state in memory only; starting anew")
        if state is None or not state.is_dir():
            problem = f"its clients' private state is missing (expected {state})"
            return _damaged(folder, problem, restart_damaged)
    try:
        changed = data_change(checkpoint, config)
    except (OSError, ValueError) as err:  # ConfigError and DataError too: nothing damaged
        return Attempt(problem=(
            f"cannot resume {folder}: its data cannot be read ({first_line(str(err))}); the "
            "folder is left as it is: run the same command once dataset-path is readable"
        ))  # fmt: skip
    if changed:
        return _damaged(folder, changed, restart_damaged)
    note = f"resuming {folder} after round {checkpoint.round}"
    failed_with = ""
    if status == FAILED and not marker.get("stopped"):
        failed_with = first_line(str(document["run"].get("error", "")))
        note += f" (it failed: {failed_with})"
    return Attempt(folder, checkpoint.round, note, status=status, failed_with=failed_with)


def data_change(checkpoint: Checkpoint, config: RunConfig) -> str | None:
    """Why the ServerApp would refuse to resume ``checkpoint`` on the data at the config's
    dataset path (other split sizes or other samples than its run trained on), found here
    before the run is submitted, so that ``--dry-run`` does not promise that resume and the
    grid does not start it at every invocation. Checked only where the checkpoint recorded
    the partitions, in the ServerApp's order: the sizes, then (decoding every partition)
    the content digests, about 9 s for Fashion-MNIST. Raises what reading the data raises:
    data that cannot be read are not data that changed."""
    recorded = checkpoint.clients or {}
    if not recorded.get("split_sizes"):  # an earlier version's (a reference's, before 0.3.0)
        return None
    from fedreg_app.core.data import PartitionKey, federated_dataset, split_digests, split_sizes

    num_clients = recorded["num_clients"]
    key = PartitionKey.from_config(config, num_clients)
    try:
        sizes = _once(split_sizes, key)
        change = _refusal(checkpoint, num_clients, sizes)
        if change is None and checkpoint.compares_digests:
            change = _refusal(checkpoint, num_clients, sizes, _once(split_digests, key))
    finally:
        federated_dataset.cache_clear()  # the runner keeps no dataset open
    return change


def _refusal(checkpoint: Checkpoint, num_clients: int, *facts: dict) -> str | None:
    """The checkpoint's refusal of these partitions' sizes (and digests), if any."""
    try:
        checkpoint.check_clients(num_clients, *facts)
    except ConfigError as err:
        return str(err)
    return None


@cache
def _once(compute: Callable[[PartitionKey], dict], key: PartitionKey) -> dict:
    """``compute(key)`` once per invocation (the grid decides each run twice; ``main``
    clears it); an error is not kept, it is raised again."""
    return compute(key)


def pending_state(spec: RunSpec, declared: dict[str, Any]) -> tuple[str, int]:
    """What running the grid would do with this run, and its rounds done: finished (not
    run again), resumed after round N, started anew (and why), or refused (damaged).
    Changes nothing on disk; keeps the finished results found in ``spec.result``."""
    spec.result = spec.finished_results()
    if spec.result is not None:
        return f"finished ({run_status(spec.result)})", spec.num_rounds
    attempt = decide(spec, declared, restart_damaged=False)
    if attempt.problem:
        return f"not run: {first_line(attempt.problem)}", 0
    if attempt.resume is not None:
        stopped = read_marker(attempt.resume).get("stopped")
        why = f"; {stopped}" if stopped else ""
        if not stopped and attempt.status == RUNNING:
            why = "; its status says running: in progress now, or killed unawares"
        if attempt.failed_with:
            why = f"; it failed: {attempt.failed_with}"
        after = attempt.after_round
        return f"resumes after round {after}/{spec.num_rounds}{why}", after
    other = spec.other_setting()
    if attempt.note is None and other is not None:
        return f"starts: {other}", 0
    return ("starts" if not attempt.note else f"starts anew: {attempt.note}"), 0


def dry_run(specs: list[RunSpec], declared: dict[str, Any]) -> str:
    """``--dry-run``: each run, its folder and what the same command without
    ``--dry-run`` would do with it, then the grid's rounds done and the time left."""
    lines, ahead = [], {}
    for spec in specs:
        state, ahead[id(spec)] = pending_state(spec, declared)
        lines.append(f"{spec.describe()} -> {spec.folder}: {state}")
    progress = Progress(specs, ahead)
    lines.append(
        f"grid {progress.done()}/{progress.total_rounds} rounds done in {len(specs)} runs; "
        f"{expected_time(progress)}"
    )
    return "\n".join(lines)


def _damaged(folder: Path, error: str, restart: bool) -> Attempt:
    if restart:
        write_marker(folder, abandoned=error)
        return Attempt(note=f"cannot resume {folder}: {error}; starting anew (--restart-damaged)")
    return Attempt(problem=(
        f"cannot resume {folder}: {error}\n    the folder is left as it is; add "
        "--restart-damaged to start this run anew in a fresh folder"
    ), damaged=True)  # fmt: skip


def tidy(spec: RunSpec) -> list[Path]:
    """Remove what a killed runner left in a seed folder (the caller holds ``--out``, so no
    other runner is at work there): its temporary run-config files, and the run's own
    client state once no run folder there may be resumed (every one finished or failed:
    another process finished the run, or the runner died between a run's end and the
    state's removal). A folder still resumable, or one that cannot be read, keeps it.
    Returns what it removed."""
    removed = []
    for leftover in spec.folder.glob("tmp*.toml") if spec.folder.is_dir() else []:
        leftover.unlink(missing_ok=True)
        removed.append(leftover)
    state = spec.state_dir
    if not (spec.own_state_dir and state is not None and state.is_dir()) or state.is_symlink():
        return removed
    folders = [f for f in spec.folder.iterdir() if f.is_dir() and f.name != STATE_FOLDER]
    if all(never_resumed(folder) for folder in folders):
        shutil.rmtree(state, ignore_errors=True)
        removed.append(state)
    return removed


def never_resumed(run_folder: Path) -> bool:
    """Whether :func:`decide` would never resume this run folder: finished, abandoned, or
    failed before its first checkpoint; a marker the runner did not write or an unreadable
    record may still be resumed once mended."""
    marker, foreign = load_marker(run_folder)
    if foreign is not None:
        return False
    status = run_status(read_document(run_folder / "results.json"))
    failed_unsaved = status == FAILED and not state_path(run_folder).exists()
    return bool(marker.get("abandoned")) or status in FINISHED or failed_unsaved
