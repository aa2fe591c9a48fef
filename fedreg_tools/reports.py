"""Reports from finished runs: tables laid out like the FedReG paper's, and PNG plots.

Everything here reads the ``results.json`` files the runs wrote, so a report can be made
again at any time, from a partial grid too::

    fedreg-report experiments/                    # tables + accuracy curves (+ Figure 7)
    fedreg-report experiments/ --out docs/figures
    fedreg-report results/<time>_fedreg_..._run<id>/   # one run, whatever its status
    fedreg-report classes --clients 30 --set dataset-path=../shared/data/fashion_mnist

The folder layout is the runner's: ``<root>/<experiment>/<cell>/seed<k>/<run>/results.json``,
or the same without the ``<run>`` folder (``<root>/<experiment>/<cell>/seed<k>/results.json``,
as results are committed under ``results/``).
A run counts when its status is ``completed`` (every client answered every phase) or
``degraded`` (it finished, but some replies were missing or rejected): degraded runs are
kept and their figures marked ``†`` in the tables; where none of a run's evaluated rounds
had every client's reply, its P is the figure over the clients that answered, marked ``‡``
(never shown as the all-client figure). Failed and unfinished runs are left out, and the
report says how many and why; ``--unfinished`` keeps a seed's unfinished run (status
``running``: interrupted, stopped by ``--max-minutes``, or still going) when it has no
finished one, with its best figures over the rounds done so far marked ``§`` and its
rounds done listed under the table. ``--paper CONFIG`` adds, for the experiment of a
config file with an ``[experiment.paper]`` table, our G and P beside the published ones
and the differences in points (the runner does so for its own config files).
``--personal sampled`` shows, in the P columns and the personal curves, the personal
accuracy over the clients that had trained at least once (``personal_accuracy_sampled``)
instead of the all-client figure (the default: the sources evaluate every client, trained
or not). Plots:

* ``<experiment>_accuracy.png`` - global and personal accuracy per round for each cell,
  mean over seeds with a band of one standard deviation;
* ``log_ratio_vs_clients.png`` - the paper's Figure 7: log10(g/p) of best global and best
  personal accuracy against the number of clients, one line per algorithm (drawn when the
  runs cover at least two client counts);
* ``class_distribution.png`` - the paper's Figure 4: each client's class counts in its
  original train split and in its rebalanced dataset (augmented part hatched).

A run folder (as ``flwr run`` writes it under ``results-dir``) or its ``results.json``
is reported on its own, running, stopped or failed too (:func:`write_run_report`):
``table.md`` with its best, final and last-10 mean of G and P, ``costs.md``, ``runs.md``
and ``accuracy.png``; several runs given so are set side by side.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import statistics
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedreg_app.core.checkpoint import RESUMABLE_CHANGES, Seal, read_seal
from fedreg_app.core.config import (
    EARLIER_MEANING,
    PLACE_KEYS,
    ConfigError,
    RunConfig,
    as_ran,
    is_whole,
    setting_differences,
)
from fedreg_app.core.environment import client_devices
from fedreg_app.core.metrics import (
    COMPLETED,
    DEGRADED,
    FAILED,
    RUNNING,
    STOPPED,
    first_line,
    is_real,
    kept_rounds_problem,
    record_problem,
    status_problem,
)
from fedreg_app.core.persist import RUN_FOLDER_LOCK, folder_holder
from fedreg_tools.cell_tables import cells_table
from fedreg_tools.overrides import declared_overrides, declared_run_config
from fedreg_tools.round_tables import GLOBAL, personal_metric, rounds_report

# torch, the data and the algorithms (fedreg_app.registry), and matplotlib are imported
# where they are used: `fedreg-report --help` and a wrong argument answer at once.

CELL_SEPARATOR = "__"

# ---------------------------------------------------------------- run status
#: Statuses of a run that ran to its end; ``failed``, ``running`` and ``stopped`` are not.
FINISHED = (COMPLETED, DEGRADED)
#: Statuses of a run that may go on: in progress (or killed unawares), or stopped by the
#: runner (resumable); ``--unfinished`` reports them.
UNFINISHED = (RUNNING, STOPPED)
DEGRADED_MARK = "†"
ANSWERED_MARK = "‡"
UNFINISHED_MARK = "§"
DEGRADED_NOTE = (
    f"{DEGRADED_MARK} degraded: some client replies were missing or rejected in these runs "
    "(each round's `errors` in results.json says which); the figures are kept"
)
ANSWERED_NOTE = (
    f"{ANSWERED_MARK} P over the clients that answered, for the seeds where no evaluated round "
    "had every client's reply (the all-client figure does not exist there)"
)
UNFINISHED_NOTE = (
    f"{UNFINISHED_MARK} unfinished: these runs have not done all their rounds (status "
    "`running` or `stopped`); the figures are the best over the rounds done so far"
)

#: The personal figures a report can show: every client's (the sources'), or only those
#: of the clients that had trained at least once.
PERSONAL_FIGURES = ("all", "sampled")
DEFAULT_VERSUS = "fedreg"  # rounds.md's reference cell: the product's method
SAMPLED_NOTE = (
    "P sampled: the personal accuracy over the clients that had trained at least once by "
    "that round (best round; the all-client P includes never-sampled clients)"
)


def run_status(document: dict[str, Any]) -> str:
    """``running``, ``completed``, ``degraded`` or ``failed`` ("" if the file has none)."""
    return str(document.get("run", {}).get("status", ""))


def round_seconds(document: dict[str, Any]) -> list[float]:
    """Each recorded round's wall seconds as the server measured them (training plus
    evaluation phase), of a document :func:`read_document` accepted (costs checked)."""
    return [r["train_seconds"] + r["eval_seconds"] for r in document.get("rounds", [])]


def personal_figure(document: dict[str, Any], which: str = "all") -> tuple[float | None, bool]:
    """A finished run's best personal accuracy and whether it is over the answering clients
    only: the all-client figure (complete rounds) where there is one, else, for a degraded
    run, the figure over the clients that answered. ``which="sampled"``: the best figure
    over the clients that had trained (None for runs written before it existed)."""
    if which == "sampled":
        return document.get("best_personal_accuracy_sampled"), False
    value = document.get("best_personal_accuracy")
    if value is not None or run_status(document) != DEGRADED:
        return value, False
    answered = document.get("best_personal_accuracy_answered")
    return answered, answered is not None


def marked(text: str, degraded: bool, answered: bool = False, unfinished: bool = False) -> str:
    """A table value with the marks its footnotes explain (none on an empty value)."""
    if text == "–":
        return text
    present = {DEGRADED_MARK: degraded, ANSWERED_MARK: answered, UNFINISHED_MARK: unfinished}
    return text + "".join(mark for mark, shown in present.items() if shown)


def footnotes(table: str) -> str:
    """The table with a footnote line for each mark it uses."""
    notes = [n for n in (DEGRADED_NOTE, ANSWERED_NOTE, UNFINISHED_NOTE) if n[0] in table]
    return "\n\n".join([table, *notes]) if notes else table


@dataclass(frozen=True)
class RunResult:
    """One finished run (completed or degraded), or with ``--unfinished`` an unfinished one
    (``running``), located by the runner's folder layout; or a run reported on its own
    (:func:`read_runs`: any status), named by its folder and its algorithm and seed."""

    experiment: str  # a run reported on its own: its folder's name
    cell: str  # the cell folder, e.g. ``fedreg`` or ``fedreg__variant-a``; or ``fedreg seed0``
    seed: int
    document: dict[str, Any]
    folder: Path | None = None  # where its results.json lies

    @property
    def algo(self) -> str:
        return str(self.document["config"]["algo"])

    @property
    def clients(self) -> int:
        return int(self.document["run"]["num_clients"])

    @property
    def best_global(self) -> float | None:
        return self.document.get("best_global_accuracy")

    @property
    def degraded(self) -> bool:
        return run_status(self.document) == DEGRADED

    @property
    def unfinished(self) -> bool:
        return run_status(self.document) in UNFINISHED

    @property
    def progress(self) -> str:
        """``rounds done/rounds configured``, e.g. ``74/100``."""
        total = self.document.get("config", {}).get("num-server-rounds", "?")
        return f"{len(self.document.get('rounds', []))}/{total}"

    @property
    def state(self) -> str:
        """What an unfinished run's status says about it, for the report's note."""
        run = self.document.get("run", {})
        if run.get("status") == STOPPED:
            stopped = run.get("stopped") or {}
            return f"stopped ({stopped.get('reason', 'by the runner')}; resumable)"
        holder = None if self.folder is None else folder_holder(self.folder, RUN_FOLDER_LOCK)
        if holder is not None:
            return f"running now ({holder})"
        if self.folder is not None and (self.folder / RUN_FOLDER_LOCK).exists():
            return "killed: status `running` but no ServerApp holds it; resumable"
        return "running (in progress when written, or killed with no chance to say so)"

    @property
    def best_personal(self) -> float | None:
        """The all-client figure, over complete rounds only (None if there were none)."""
        return self.document.get("best_personal_accuracy")

    @property
    def personal(self) -> tuple[float | None, bool]:
        """The P a table shows, and whether it is over the answering clients only."""
        return personal_figure(self.document)

    def series(self, metric: str, answered: bool = False) -> tuple[list[int], list[float]]:
        """(rounds, values) of a per-round accuracy, skipping rounds not evaluated; with
        ``answered``, a round without the all-client figure gives the one over the clients
        that answered (``<metric>_answered``), if it has one."""
        points = []
        for record in self.document["rounds"]:
            value = record.get(metric)
            if value is None and answered:
                value = record.get(f"{metric}_answered")
            if value is not None:
                points.append((record["round"], value))
        return [p[0] for p in points], [p[1] for p in points]


@dataclass(frozen=True)
class Skipped:
    """A seed folder without a finished run, and why: what its newest run says."""

    seed_folder: Path
    status: str  # failed, running, stopped, or "no results" / "unreadable"
    error: str | None = None

    @property
    def cell(self) -> str:
        """The cell folder the seed folder lies in, as :attr:`RunResult.cell` names it."""
        return self.seed_folder.parent.name

    def line(self, root: Path | Sequence[Path]) -> str:
        """``- <experiment>/<cell>/seed<k>: <status>: <first line of the error>``; with
        several roots the path keeps the name of the root it lies under."""
        reason = self.status + (f": {self.error.splitlines()[0]}" if self.error else "")
        roots = [root] if isinstance(root, Path) else list(root)
        where = self.seed_folder
        under = next((r for r in roots if where.is_relative_to(r)), None)
        if under is not None:
            where = where.relative_to(under if len(roots) == 1 else under.parent)
        return f"- {where}: {reason}"


@dataclass(frozen=True)
class Collection:
    """The runs a report uses and the seed folders it leaves out."""

    results: list[RunResult]
    skipped: list[Skipped]

    def of_cells(self, only: Sequence[str]) -> Collection:
        """The runs and left-out folders of the cells named in ``only`` (all when it is
        empty); a name no run or left-out folder has is refused, naming the cells there
        are, before anything is written."""
        if not only:
            return self
        present = {r.cell for r in self.results} | {s.cell for s in self.skipped}
        unknown = [name for name in only if name not in present]
        if unknown:
            raise ConfigError(f"--cells: {', '.join(map(repr, unknown))} not a cell of these "
                              f"runs: expected some of {', '.join(sorted(present))}")  # fmt: skip
        return Collection(
            [r for r in self.results if r.cell in only],
            [s for s in self.skipped if s.cell in only],
        )

    def unfinished_note(self) -> str:
        """The unfinished runs the report kept, with their rounds done ("" if none)."""
        runs = [r for r in self.results if r.unfinished]
        if not runs:
            return ""
        lines = [f"{UNFINISHED_MARK} Unfinished runs kept (rounds done/configured):"]
        return "\n".join(
            lines
            + [f"- {r.experiment}/{r.cell}/seed{r.seed}: {r.progress}, {r.state}" for r in runs]
        )

    def skipped_note(self, root: Path | Sequence[Path]) -> str:
        """How many seed folders were left out and why ("" if none)."""
        if not self.skipped:
            return ""
        counts = by_key(self.skipped, lambda s: s.status)
        why = ", ".join(f"{len(v)} {k}" for k, v in counts.items())
        lines = [f"Left out {len(self.skipped)} run(s) or file(s) ({why}):"]
        return "\n".join(lines + [s.line(root) for s in self.skipped])


LINKED = "linked"


def results_files(root: Path) -> tuple[dict[Path, list[Path]], list[Skipped]]:
    """Every results.json under ``root`` per seed folder, oldest first: the runner's
    ``seed<k>/<run>/results.json`` (run folders sort by time) and the committed
    ``seed<k>/results.json`` (one run, no run folder). A file reached a second time
    through a link (an experiment or cell folder linked under another name) is counted
    once, under the path :func:`preference` picks, and the other path is named."""
    found = [(path, path.parent) for path in sorted(root.glob("*/*/seed*/results.json"))]
    found += [(path, path.parent.parent) for path in sorted(root.glob("*/*/seed*/*/results.json"))]
    first: dict[Path, Path] = {}
    for path, _ in sorted(found, key=lambda item: preference(*item, root)):
        first.setdefault(path.resolve(), path)
    files: dict[Path, list[Path]] = {}
    linked: list[Skipped] = []
    for path, seed_folder in found:
        used = first[path.resolve()]
        if used != path:
            linked.append(Skipped(path, LINKED, f"the same file as {used}; counted once there"))
            continue
        files.setdefault(seed_folder, []).append(path)
    return dict(sorted(files.items())), linked


def preference(path: Path, seed_folder: Path, root: Path) -> tuple[bool, int, str]:
    """Which of a file's paths counts: one in a validly named seed folder (a link
    ``seed1 -> seed1-v2`` counts as seed 1), then the one with the fewest links."""
    return (not SEED_FOLDER.fullmatch(seed_folder.name), links_in(path, root), str(path))


def links_in(path: Path, root: Path) -> int:
    """How many of ``path``'s folders below ``root`` are symbolic links."""
    parents = [p for p in path.parents if p.is_relative_to(root) and p != root]
    return sum(p.is_symlink() for p in parents)


#: A seed folder's name: ``seed0``, ``seed1``, ... (no sign, no leading zero: ``seed01``
#: beside ``seed1`` would be the same seed twice).
SEED_FOLDER = re.compile(r"seed(0|[1-9][0-9]*)")


def run_order(item: tuple[Path, dict[str, Any]]) -> tuple[str, str]:
    """Sort key of a seed's runs, oldest first: when each started (``run.started``), then
    the path. Folder names alone do not order runs: a copy named ``committed`` sorts
    after every time-stamped run folder."""
    path, document = item
    run = document.get("run")
    started = run.get("started") if isinstance(run, dict) else None
    return (started if isinstance(started, str) else "", str(path))


INVALID = "invalid"
UNREADABLE = "unreadable"


def document_problem(document: Any) -> str | None:
    """Why a results.json cannot be reported as it stands (None when it can): a report
    publishes what the file says, so a value out of range, a round out of place, a best
    figure or total the rounds do not give, or a status its rounds contradict (a hand
    edit, a damaged copy) is refused, not shown."""
    if not isinstance(document, dict):
        return "expected a JSON object with config, run and rounds"
    run = document.get("run")
    if not isinstance(run, dict):
        return "run is not an object"
    for key in ("status", "error"):
        if run.get(key) is not None and not isinstance(run[key], str):
            return f"run.{key} is {run[key]!r}; expected a string"
    if run_status(document) not in (*FINISHED, *UNFINISHED):
        return None  # failed or unknown: reported as skipped with what it says
    return record_problem(document) or status_problem(document)


def placement_problem(path: Path, document: dict[str, Any]) -> str | None:
    """A record must lie where its run belongs: in the seed folder of its config's seed
    (``seed<k>/results.json`` or ``seed<k>/<run folder>/results.json``) and in the cell
    folder of its algorithm and grid values (``fedreg__alpha-0.5``). Else a copy of
    another cell's run would be averaged and published as this cell's. A file outside
    that layout (no ``seed<k>`` folder, or none below a folder named for an algorithm)
    is not checked. The path is taken as given, links not followed: it is the one the
    report counts the file under (a cell folder linked to another cell's elsewhere
    would otherwise be checked as that cell and counted as this one)."""
    path = Path(os.path.normpath(path.absolute()))  # a root given as '..' hides nothing
    seed_folder = next((f for f in (path.parent, path.parent.parent)
                        if SEED_FOLDER.fullmatch(f.name)), None)  # fmt: skip
    if seed_folder is None:
        return None
    from fedreg_app.registry import algorithm_names

    config, cell = document["config"], seed_folder.parent.name
    if cell.split(CELL_SEPARATOR)[0] not in algorithm_names():
        return None  # a seed<k> folder of a user's own, not the runner's layout
    seed = int(seed_folder.name.removeprefix("seed"))
    if config.get("seed") != seed:
        return f"config.seed is {config.get('seed')!r} but the file lies in {seed_folder.name}"
    return cell_problem(cell, config)


#: Keys a cell's folder may name but a run records resolved (a path made absolute):
#: where a run read and wrote, not what it was.
LOCATION_KEYS = ("dataset-path", "init-model", "results-dir", "state-dir", "resume")


def cell_problem(cell: str, config: dict[str, Any]) -> str | None:
    """Whether the cell folder's name (the runner's ``cell_id``: the algorithm, then a
    ``key-value`` per grid key, then the variant's label) names this config's values. A
    value may itself hold the separator; a part that names no key of the config (the
    variant's label) is passed over."""
    algo, *parts = cell.split(CELL_SEPARATOR)
    if algo != str(config["algo"]).replace("/", "_"):
        return f"config.algo is {config['algo']!r} but the file lies in cell {cell!r}"
    index = 0
    while index < len(parts):
        key = max((k for k in config if parts[index].startswith(f"{k}-")), key=len, default=None)
        if key is None or key in LOCATION_KEYS:
            index += 1
            continue
        ends = [end for end in range(index + 1, len(parts) + 1)
                if _names_value(CELL_SEPARATOR.join(parts[index:end])[len(key) + 1 :],
                                config[key])]  # fmt: skip
        if not ends:
            return f"config {key}={config[key]!r} but the file lies in cell {cell!r}"
        index = ends[0]
    return None


def _names_value(text: str, value: Any) -> bool:
    """Whether a folder name's ``text`` is ``value`` as ``cell_id`` writes it (a grid's
    1 and a config's 1.0 are the same value)."""
    if text == str(value).replace("/", "_"):
        return True
    if is_real(value):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    return False


def seal_problem(seal: Seal | None, document: dict[str, Any]) -> str | None:
    """A record beside a checkpoint must be the one it sealed (``seal``, read before the
    record: see :func:`read_sealed`): the same run, the rounds up to the checkpoint's, and
    the setting it was made with. A record edited by hand, its figures and best values
    made consistent, or its config changed, would otherwise be published and taken as
    finished: checking the seal on resume alone does not catch it."""
    if seal is None:
        return None
    if seal.results is not None:
        problem = kept_rounds_problem(document, seal.round, seal.results)
        if problem:
            return problem
    # a resume that extends a run (num-server-rounds, eval-every) writes its config into
    # results.json at once and into the checkpoint only with its first round
    changed = setting_differences(document["config"], seal.run_config, RESUMABLE_CHANGES)
    if changed:
        return f"its config is not its checkpoint's ({'; '.join(changed[:3])}): edited?"
    return None


def read_sealed(path: Path) -> tuple[Any, Seal | None]:
    """The results.json at ``path`` and its checkpoint's seal, the seal read first. A
    running round writes results.json, then its checkpoint: read in that order, a round
    committed between the two reads would show a checkpoint ahead of the record, and a
    running run would be named invalid. Raises what reading or parsing
    results.json raises."""
    seal = read_seal(path.parent)
    return json.loads(path.read_text()), seal


def read_document(path: Path) -> dict[str, Any]:
    """A results.json, or an ``unreadable`` / ``invalid`` status that says why. A record
    that does not lie in its own seed's and cell's folder is invalid
    (:func:`placement_problem`): it would be averaged as that seed, or that cell."""
    try:
        document, seal = read_sealed(path)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        return {"run": {"status": UNREADABLE, "error": f"{path.name}: {err}"}}
    problem = document_problem(document)
    readable = not problem and run_status(document) in (*FINISHED, *UNFINISHED)
    if readable:
        problem = placement_problem(path, document) or seal_problem(seal, document)
    if problem:
        return {"run": {"status": INVALID, "error": f"{path.name}: {problem}"}}
    config = document.get("config")  # a failed record's is not checked: maybe none
    if not isinstance(config, dict):
        return document
    return {**document, "config": as_ran(config)}  # an earlier version's: as it ran


#: A seed left out of its cell's figures: its run is of another setting than the others'.
OTHER_SETTING = "other setting"


def one_setting(results: list[RunResult]) -> tuple[list[RunResult], list[Skipped]]:
    """Per cell, the seeds whose runs are of one setting (the one most seeds share; on a
    tie, the lowest seed's), and the others named with how they differ: a mean over seeds
    must be over one setting, never over runs of an edited config mixed in."""
    kept, skipped = [], []
    for runs in by_key(results, lambda r: (r.experiment, r.cell)).values():
        ordered = sorted(runs, key=lambda r: r.seed)  # max() keeps the first on a tie
        reference = max(ordered, key=lambda run: sum(not _setting_gap(run, r) for r in ordered))
        for run in runs:
            gap = _setting_gap(reference, run)
            if not gap:
                kept.append(run)
                continue
            where = run.folder or Path(run.experiment, run.cell, f"seed{run.seed}")
            why = f"config differs from seed{reference.seed}'s: {'; '.join(gap)}"
            skipped.append(Skipped(where, OTHER_SETTING, why))
    return kept, skipped


def _setting_gap(reference: RunResult, run: RunResult) -> list[str]:
    gap = setting_differences(
        run.document["config"], reference.document["config"], ignore=("seed",)
    )
    return gap + clients_difference(run.document, reference.clients)


def clients_difference(document: dict[str, Any], clients: int) -> list[str]:
    """``clients=N, not M`` where a run had another number of clients: the client count is
    part of a setting (it changes every partition) but is recorded under ``run``, not in
    the config."""
    recorded = document.get("run", {}).get("num_clients")
    return [] if recorded == clients else [f"clients={recorded!r}, not {clients!r}"]


def scan(root: Path, unfinished: bool = False) -> Collection:
    """Per seed folder under ``root``, its newest finished run (completed or degraded);
    a seed folder with none is skipped, with its newest run's status and error. With
    ``unfinished``, such a seed keeps instead its newest ``running`` or ``stopped`` run
    that has rounds."""
    files, skipped = results_files(root)
    results = []
    for seed_folder, paths in files.items():
        if not SEED_FOLDER.fullmatch(seed_folder.name):
            why = "not a seed folder's name (seed0, seed1, ...): not counted as any seed"
            skipped.append(Skipped(seed_folder, INVALID, why))
            continue
        seed = int(seed_folder.name.removeprefix("seed"))
        runs = sorted(((path, read_document(path)) for path in paths), key=run_order)
        kept = [(p, d) for p, d in runs if run_status(d) in FINISHED]
        if not kept and unfinished:
            kept = [(p, d) for p, d in runs if run_status(d) in UNFINISHED and d.get("rounds")]
        if not kept:
            run = runs[-1][1].get("run", {})
            skipped.append(Skipped(seed_folder, run.get("status") or "no status", run.get("error")))
            continue
        # a damaged file beside the run used is named, never passed over in silence
        skipped += [
            Skipped(path, run_status(d), d["run"].get("error"))
            for path, d in runs
            if run_status(d) in (INVALID, UNREADABLE)
        ]
        path, document = kept[-1]
        results.append(
            RunResult(
                experiment=seed_folder.parent.parent.name,
                cell=seed_folder.parent.name,
                seed=seed,
                document=document,
                folder=path.parent,
            )
        )
    results, other_settings = one_setting(results)
    return Collection(results, skipped + other_settings)


def scan_roots(roots: Sequence[Path], unfinished: bool = False) -> Collection:
    """:func:`scan` over several results roots, as one: several runners side by side (one
    ``--out`` each, e.g. four cells on one GPU) give one table. A seed of a cell found
    under two roots is refused, naming both: the report counts each seed once, and which
    of two runs is the seed's is the user's choice, not the report's."""
    if len(roots) == 1:
        return scan(roots[0], unfinished)
    seen: dict[Path, Path] = {}
    for root in roots:
        first = seen.setdefault(root.resolve(), root)
        if first is not root:
            raise ConfigError(f"the results root {root} is given twice (as {first} too)")
    results: list[RunResult] = []
    skipped: list[Skipped] = []
    where: dict[tuple[str, str, int], Path] = {}
    for root in roots:
        collection = scan(root, unfinished)
        for run in collection.results:
            key = (run.experiment, run.cell, run.seed)
            if key in where:
                raise ConfigError(
                    f"{run.experiment}/{run.cell}/seed{run.seed} has a run under two roots: "
                    f"{where[key]} and {run.folder}; a report counts each seed once: move "
                    "one of them away, or report the roots apart"
                )
            where[key] = run.folder or root
        results += collection.results
        skipped += collection.skipped
    kept, other_settings = one_setting(results)
    return Collection(kept, skipped + other_settings)


def collect(root: Path, unfinished: bool = False) -> list[RunResult]:
    """Every finished run under ``root``: completed or degraded (the newest per seed);
    with ``unfinished``, also the unfinished runs of seeds that have no finished one."""
    return scan(root, unfinished).results


def by_key(results: Sequence[RunResult], key: Any) -> dict[Any, list[RunResult]]:
    """Group runs, keeping the order in which keys first appear."""
    groups: dict[Any, list[RunResult]] = {}
    for result in results:
        groups.setdefault(key(result), []).append(result)
    return groups


def mean_std(values: Sequence[float]) -> str:
    """Percent, ``mean ± std`` over seeds (sample std; none with one seed)."""
    if not values:
        return "–"
    mean = 100 * statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.2f}"
    return f"{mean:.2f} ± {100 * statistics.stdev(values):.2f}"


# ----------------------------------------------------------------------- tables
def cell_figures(
    runs: Sequence[RunResult], personal: str = "all"
) -> tuple[list[float], list[float], str, str]:
    """One cell's best G and P per seed, and their ``mean ± std`` texts with the marks
    their footnotes explain (degraded, answering clients only, unfinished)."""
    degraded = any(r.degraded for r in runs)
    running = any(r.unfinished for r in runs)
    globals_ = [r.best_global for r in runs if r.best_global is not None]
    figures = [f for f in (personal_figure(r.document, personal) for r in runs) if f[0] is not None]
    personals = [f for f, _ in figures]
    answered = any(a for _, a in figures)
    g_text = of_seeds(marked(mean_std(globals_), degraded, unfinished=running),
                      len(globals_), len(runs))  # fmt: skip
    p_text = of_seeds(marked(mean_std(personals), degraded, answered, running),
                      len(personals), len(runs))  # fmt: skip
    return globals_, personals, g_text, p_text


def of_seeds(text: str, given: int, runs: int) -> str:
    """``(n of N seeds)`` after a figure that fewer seeds than the cell's runs give (a
    degraded or unfinished run with no such figure): the seeds column counts runs, not
    figures."""
    return text if given in (0, runs) else f"{text} ({given} of {runs} seeds)"


def paper_table(results: Sequence[RunResult], personal: str = "all") -> str:
    """The paper's layout: one row per cell (algorithm, variant, grid values), a G and a P
    column per experiment (dataset, client count, ...), mean ± std over seeds; values that
    include degraded runs are marked, with a footnote per mark. ``personal`` picks the P
    (one of ``PERSONAL_FIGURES``)."""
    experiments = list(by_key(results, lambda r: r.experiment))
    cells = list(by_key(results, lambda r: r.cell))
    groups = by_key(results, lambda r: (r.cell, r.experiment))
    p = "P" if personal == "all" else f"P {personal}"
    # one count per experiment, in the columns' order, which the header names ("2/1")
    seeds = "seeds" if len(experiments) == 1 else f"seeds ({'/'.join(experiments)})"
    header = ["cell"] + [f"{e} {m}" for e in experiments for m in ("G", p)] + [seeds]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cell in cells:
        row = [cell.replace(CELL_SEPARATOR, " ")]
        seeds = []
        for experiment in experiments:
            runs = groups.get((cell, experiment), [])
            _, _, g_text, p_text = cell_figures(runs, personal)
            row += [g_text, p_text]
            seeds.append(str(len(runs)))
        lines.append("| " + " | ".join(row + ["/".join(seeds)]) + " |")
    table = footnotes("\n".join(lines))
    return table if personal == "all" else f"{table}\n\n{SAMPLED_NOTE}"


#: Keys the cells of one experiment share for their comparison to be fair (the data and
#: its partition, the training budget, the model and optimiser, how often G is measured).
SHARED_KEYS = (
    "dataset", "partition", "dirichlet-balance", "alpha", "shard-classes", "participation-gamma",
    "data-fraction", "min-partition-size", "fraction-train", "num-server-rounds", "local-epochs",
    "batch-size", "drop-last", "lr", "momentum", "model", "augment", "eval-every", "init-model",
)  # fmt: skip


def differing_settings(results: Sequence[RunResult]) -> str:
    """The shared keys (:data:`SHARED_KEYS`) whose value is not the same in every cell of
    an experiment, each value with its cells ("" when the cells agree): a table sets its
    cells side by side, so a cell run with fewer rounds or another partition must say so
    under it. A key of the experiment's grid, named in its cells, is not listed."""
    lines = []
    for experiment, runs in by_key(results, lambda r: r.experiment).items():
        for key in (*SHARED_KEYS, "clients"):
            cells: dict[str, set[str]] = {}
            for run in runs:
                value = run.clients if key == "clients" else run.document["config"].get(key)
                in_grid = any(
                    part.startswith(f"{key}-") for part in run.cell.split(CELL_SEPARATOR)[1:]
                )
                if value is not None and not in_grid:
                    cells.setdefault(json.dumps(value), set()).add(run.cell)
            if len(cells) > 1:
                ordered = sorted(cells.items(), key=lambda item: (-len(item[1]), item[0]))
                values = "; ".join(
                    f"{value} ({', '.join(sorted(names))})" for value, names in ordered
                )
                lines.append(f"- {experiment}: `{key}` is {values}")
    if not lines:
        return ""
    head = "Settings that differ between the cells of one experiment (compare with care):"
    return "\n".join([head, *lines])


# ------------------------------------------------------------ the paper's cells
#: Where a config file keeps the published figures its runs reproduce.
PAPER_TABLE = "paper"
PAPER_FIGURES = ("G", "P")


@dataclass(frozen=True)
class PaperCells:
    """The published G and P (percent) of an experiment's cells, from its config file's
    ``[experiment.paper]`` table: ``source = "..."`` and one ``cell = { G = .., P = .. }``
    per cell (a cell is an algorithm, or the report's cell name of a variant)."""

    experiment: str
    source: str
    cells: dict[str, dict[str, float]]
    #: the run-config keys its file sets, and its ``[experiment]`` clients: the setting
    #: the figures are set beside (``--paper``; empty for the runner's own file)
    setting: dict[str, Any] = field(default_factory=dict)

    def setting_gaps(self, runs: Sequence[RunResult]) -> list[str]:
        """``key=the runs', not the file's`` for each key the file sets that some run
        was not run with (where the run happened aside): the differences in points then
        compare two settings, which the table must say."""
        gaps: dict[str, None] = {}
        for run in runs:
            config = {**run.document["config"], "clients": run.clients}
            for key, value in self.setting.items():
                if key not in PLACE_KEYS and key in config and config[key] != value:
                    gaps[f"{key}={config[key]!r}, not {value!r}"] = None
        return list(gaps)

    @classmethod
    def from_table(cls, experiment: str, table: Any, where: str) -> PaperCells:
        """Checked: ``source`` a string, each cell a table of G and/or P in [0, 100];
        :class:`ConfigError` names the file and the key otherwise."""
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: [experiment.{PAPER_TABLE}] must be a table")
        source = table.get("source")
        if not isinstance(source, str) or not source.strip():
            raise ConfigError(f"{where}: [experiment.{PAPER_TABLE}] source must name where "
                              "the figures come from (a non-empty string)")  # fmt: skip
        cells: dict[str, dict[str, float]] = {}
        for cell, figures in table.items():
            if cell == "source":
                continue
            key = f"{where}: experiment.{PAPER_TABLE}.{cell}"
            if not isinstance(figures, dict) or not figures:
                raise ConfigError(f"{key} must be a table like {{ G = 84.27, P = 84.27 }}")
            unknown = sorted(set(figures) - set(PAPER_FIGURES))
            if unknown:
                raise ConfigError(f"{key}: unknown figure(s) {', '.join(unknown)}; allowed: "
                                  + ", ".join(PAPER_FIGURES))  # fmt: skip
            for name, value in figures.items():
                number = isinstance(value, int | float) and not isinstance(value, bool)
                if not number or not 0 <= value <= 100:
                    raise ConfigError(f"{key}.{name}={value!r}: expected a percentage in [0, 100]")
            cells[str(cell)] = {name: float(value) for name, value in figures.items()}
        return cls(experiment, source.strip(), cells)


def read_paper_cells(path: Path) -> PaperCells:
    """The ``[experiment.paper]`` table of a config file (``ConfigError`` if it has none)."""
    try:
        document = tomllib.loads(path.read_text())
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror or err})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: is not TOML ({err})") from None
    meta = document.get("experiment", {})
    if not isinstance(meta, dict):
        raise ConfigError(f"{path}: 'experiment' is {meta!r}; expected an [experiment] table")
    if PAPER_TABLE not in meta:
        raise ConfigError(f"{path}: has no [experiment.{PAPER_TABLE}] table of published figures")
    cells = PaperCells.from_table(str(meta.get("name", path.stem)), meta[PAPER_TABLE], str(path))
    varied = {"algo", *meta.get("grid", {}), *(k for v in meta.get("variants", {}).values()
                                                 for k in v)}  # fmt: skip
    setting = {k: v for k, v in document.items() if k != "experiment" and k not in varied
               and not (k == "head-depth" and v == "auto")}  # fmt: skip
    # a key whose default changed since the records this file may meet were made: the
    # file's setting is today's default, which those records did not run (as_ran)
    core = RunConfig.core_keys()
    setting |= {k: core[k] for k in EARLIER_MEANING if k in core and k not in setting}
    if "clients" in meta:
        setting["clients"] = meta["clients"]
    return dataclasses.replace(cells, setting=setting)


def _points(ours: Sequence[float], published: float | None) -> str:
    """Our mean minus the published figure, in percentage points, signed."""
    if not ours or published is None:
        return "–"
    return f"{100 * statistics.fmean(ours) - published:+.2f}"


def _published(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def paper_comparison(results: Sequence[RunResult], paper: PaperCells,
                     personal: str = "all") -> str:  # fmt: skip
    """Our G and P (mean ± std over seeds, marked as in :func:`paper_table`) beside the
    published ones and the differences in points, for one experiment: the paper's cells
    in its order (a cell not run shows ``–``), then cells the paper does not have."""
    runs = [r for r in results if r.experiment == paper.experiment]
    if not runs:  # a table of dashes would read as "not run yet", not "another name"
        found = ", ".join(sorted({r.experiment for r in results})) or "none"
        return (f"{paper.experiment} against {paper.source}: no runs of the experiment "
                f"{paper.experiment!r} under this root (experiments found: {found})")  # fmt: skip
    groups = by_key(runs, lambda r: r.cell)
    p = "P" if personal == "all" else f"P {personal}"
    header = ["cell", "G", "paper G", "G − paper", p, "paper P", "P − paper", "seeds"]
    lines = [
        f"{paper.experiment} against {paper.source} (percent; differences in points, our "
        "mean minus the published figure)",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for cell in [*paper.cells, *(c for c in groups if c not in paper.cells)]:
        cell_runs = groups.get(cell, [])
        published = paper.cells.get(cell, {})
        globals_, personals, g_text, p_text = cell_figures(cell_runs, personal)
        lines.append("| " + " | ".join([
            cell.replace(CELL_SEPARATOR, " "),
            g_text,
            _published(published.get("G")),
            _points(globals_, published.get("G")),
            p_text,
            _published(published.get("P")) if personal == "all" else "–",
            _points(personals, published.get("P")) if personal == "all" else "–",
            str(len(cell_runs)),
        ]) + " |")  # fmt: skip
    table = footnotes("\n".join(lines))
    gaps = paper.setting_gaps(runs)
    if gaps:
        table += ("\n\nThese runs are not of the setting the paper's file gives beside its "
                  f"figures ({'; '.join(gaps[:6])}): the differences in points compare two "
                  "settings.")  # fmt: skip
    if personal != "all":  # the sources publish P over all clients: no like-for-like P
        table += f"\n\nPaper P is left out: the sources' P is over all clients, not {p}."
    return table


def cost_table(
    results: Sequence[RunResult], names: tuple[str, str] = ("experiment", "cell")
) -> str:
    """Per cell (mean over seeds): traffic both ways, parameters trained, samples passed
    through training (every epoch, every step) and seconds per round; what the FedSeq
    paper compares and what an edge deployment pays. A cell with
    degraded runs is marked: missing replies carry no traffic, so its costs are lower.
    ``names`` head the first two columns (runs reported on their own: folder and run)."""
    header = [*names, "MB to clients", "MB from clients", "training MB to / from",
              "trained params (M)", "samples trained (k)", "s/round (median)",
              "seeds"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (experiment, cell), runs in by_key(results, lambda r: (r.experiment, r.cell)).items():

        def mean(key: str, scale: float, runs: list[RunResult] = runs) -> str:
            return f"{statistics.fmean(r.document.get(key, 0) for r in runs) / scale:.1f}"

        samples = statistics.fmean(
            sum(record.get("num_train_examples") or 0 for record in r.document.get("rounds", []))
            for r in runs
        )
        per_run = [statistics.median(s) for r in runs if (s := round_seconds(r.document))]
        seconds = f"{statistics.fmean(per_run):.1f}" if per_run else "–"
        name = marked(
            cell.replace(CELL_SEPARATOR, " "),
            any(r.degraded for r in runs),
            unfinished=any(r.unfinished for r in runs),
        )
        lines.append(
            f"| {experiment} | {name} | "
            f"{mean('total_bytes_to_clients', 1e6)} | {mean('total_bytes_from_clients', 1e6)} | "
            f"{mean('total_train_bytes_to_clients', 1e6)} / "
            f"{mean('total_train_bytes_from_clients', 1e6)} | "
            f"{mean('total_trained_parameters', 1e6)} | {samples / 1e3:.1f} | {seconds} | "
            f"{len(runs)} |"
        )
    return footnotes("\n".join(lines))


# ------------------------------------------------------------------- provenance
def _resumes(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The resumes a run recorded (a file is not trusted: anything else is left out)."""
    resumed = run.get("resumed")
    return [r for r in resumed if isinstance(r, dict)] if isinstance(resumed, list) else []


def _environments(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The environments a run's attempts recorded: the first's, then each resume's."""
    attempts = [run.get("environment"), *(r.get("environment") for r in _resumes(run))]
    return [e for e in attempts if isinstance(e, dict)]


def _distinct(values: Sequence[str]) -> str:
    """The values once each, in order, joined by `` + `` ("–" if none)."""
    return " + ".join(dict.fromkeys(v for v in values if v)) or "–"


def _where(document: dict[str, Any]) -> str:
    """The machines that made a run: each attempt's CPU (and its vector capability), and
    the devices its clients trained on where they named one other than the CPU."""
    environments = _environments(document.get("run", {}))
    machines = [f"{e.get('cpu', '?')} ({e.get('cpu_capability', '?')})" for e in environments]
    devices = client_devices(document.get("rounds", [])) - {"cpu"}
    where = _distinct(machines) if machines else "not recorded"
    return where + (f"; clients on {', '.join(sorted(devices))}" if devices else "")


def _attempts(run: dict[str, Any]) -> str:
    """``1``, or the attempts with the rounds each resume continued after."""
    resumed = _resumes(run)
    if not resumed:
        return "1"
    after = ", ".join(str(r.get("after_round", "?")) for r in resumed)
    return f"{1 + len(resumed)} (resumed after {after})"


def _best_with_round(run: RunResult, metric: str) -> str:
    """The best per-round figure in percent and the first round that reached it."""
    rounds, values = run.series(metric)
    if not values:
        return "–"
    best = max(values)
    return f"{100 * best:.2f} (r{rounds[values.index(best)]})"


def provenance_table(
    results: Sequence[RunResult], names: tuple[str, str] = ("experiment", "cell")
) -> str:
    """One line per run: how it ran (status, rounds, attempts, the machines, software and
    code of every attempt, seconds a round, failed replies) beside its best figures with
    their rounds, so that a published figure can be traced to what made it. ``names``
    head the first two columns (runs reported on their own: folder and run)."""
    header = [*names, "seed", "status", "rounds", "attempts", "machine",
              "torch / flwr", "code", "s/round (median)", "failed replies", "best G (round)",
              "best P (round)", "started"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in sorted(results, key=lambda r: (r.experiment, r.cell, r.seed)):
        document, info = run.document, run.document.get("run", {})
        environments = _environments(info)
        rounds = document.get("rounds", [])
        seconds = round_seconds(document)
        failures = sum(
            count for r in rounds for count in (r.get("train_failures"), r.get("eval_failures"))
            if isinstance(count, int)
        )  # fmt: skip
        software = _distinct([f"{e.get('torch')} / {e.get('flwr')}" for e in environments])
        cells = [
            run.experiment, run.cell.replace(CELL_SEPARATOR, " "), str(run.seed),
            run_status(document) or "–", run.progress, _attempts(info), _where(document),
            software, _distinct([str(e.get("code") or "") for e in environments]),
            f"{statistics.median(seconds):.1f}" if seconds else "–", str(failures),
            _best_with_round(run, "global_accuracy"),
            _best_with_round(run, "personal_accuracy"),
            str(info.get("started", "–"))[:10],
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------ plots
def _mean_band(
    runs: Sequence[RunResult], metric: str, answered: bool = False
) -> tuple[np.ndarray, ...] | None:
    """Rounds common to all seeds, the mean and the std of the metric there."""
    series = [dict(zip(*r.series(metric, answered), strict=True)) for r in runs]
    rounds = sorted(set.intersection(*(set(s) for s in series))) if series else []
    if not rounds:
        return None
    values = np.array([[s[k] for k in rounds] for s in series]) * 100
    # the sample std, as the tables' mean ± std (none with one seed)
    std = values.std(axis=0, ddof=1) if len(series) > 1 else np.zeros(len(rounds))
    return np.array(rounds), values.mean(axis=0), std


def plot_accuracy_curves(
    results: Sequence[RunResult],
    title: str,
    path: Path,
    personal: str = "all",
    paper: PaperCells | None = None,
) -> Path:
    """Global (left) and personal (right) accuracy per round, one line per cell, mean over
    seeds with a +-1 std band. In a degraded run's rounds with missing replies, the
    personal curve shows the accuracy over the clients that answered; such cells are
    labelled ``†`` and a note under the figure says so. ``personal="sampled"``: the
    personal curve is over the clients that had trained by each round. With ``paper``,
    each cell's published G and P are dashed lines in the cell's colour."""
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    personal_series = personal_metric(personal)
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharex=True)
    cells = by_key(results, lambda r: r.cell)
    colours = plt.get_cmap("tab10" if len(cells) <= 10 else "tab20")
    for index, (cell, runs) in enumerate(cells.items()):
        degraded = sum(r.degraded for r in runs)
        for axis, metric in zip(axes, ("global_accuracy", personal_series), strict=True):
            band = _mean_band(runs, metric, answered=degraded > 0)
            if band is None:
                continue
            rounds, mean, std = band
            colour = colours(index % colours.N)
            note = f", {degraded} degraded{DEGRADED_MARK}" if degraded else ""
            progress = [r.progress for r in runs if r.unfinished]
            note += f", unfinished{UNFINISHED_MARK} {' '.join(progress)}" if progress else ""
            label = f"{cell.replace(CELL_SEPARATOR, ' ')} (n={len(runs)}{note})"
            width = 2.6 if cell.split(CELL_SEPARATOR)[0] == "fedreg" else 1.4
            axis.plot(rounds, mean, marker="o", markersize=3, color=colour, label=label,
                      linewidth=width)  # fmt: skip
            axis.fill_between(rounds, mean - std, mean + std, color=colour, alpha=0.15)
            published = (paper.cells.get(cell, {}) if paper else {}).get(
                "G" if metric == "global_accuracy" else "P"
            )
            if published is not None:
                axis.axhline(published, color=colour, linestyle="--", linewidth=1, alpha=0.8)
    personal_name = "personal models" + ("" if personal == "all" else " (trained clients)")
    for axis, name in zip(axes, ("global model", personal_name), strict=True):
        axis.set_title(f"{name}: accuracy per round")
        axis.set_xlabel("round")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_ylabel("accuracy (%)")
        axis.grid(alpha=0.3)
    axes[1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8)
    if any(r.degraded for r in results):
        figure.text(0.01, -0.02, f"{DEGRADED_MARK} degraded runs: some client replies were "
                    "missing; their personal accuracy there is over the clients that answered",
                    fontsize=8, ha="left", va="top")  # fmt: skip
    if any(r.unfinished for r in results):
        figure.text(0.99, -0.02, f"{UNFINISHED_MARK} unfinished runs: rounds done/configured "
                    "in the legend", fontsize=8, ha="right", va="top")  # fmt: skip
    if paper is not None:
        figure.text(0.5, -0.06, f"dashed: {paper.source} (best G and P)", fontsize=8,
                    ha="center", va="top")  # fmt: skip
    figure.suptitle(title)
    return _save(figure, path)


#: Shared keys the paper's own scaling experiments change with the client count (Table 3:
#: batch 1 and a topped-up partition at 500 clients): not a reason to split Figure 7's line.
CLIENT_SCALED_KEYS = ("batch-size", "partition", "min-partition-size")


def series_key(run: RunResult) -> str:
    """What must be equal for two runs to lie on one line of Figure 7: the shared settings
    (:data:`SHARED_KEYS`) but those scaled with the client count."""
    config = run.document["config"]
    kept = [k for k in SHARED_KEYS if k not in CLIENT_SCALED_KEYS]
    return json.dumps({key: config.get(key) for key in kept}, sort_keys=True)


def log_ratio_lines(results: Sequence[RunResult]) -> dict[str, list[tuple[int, float]]]:
    """Figure 7's lines: per cell and setting (:func:`series_key`; runs of another dataset,
    budget or data fraction at the same client count are another line, never averaged
    into one point), the mean log10(g/p) over seeds at each client count. Only all-client
    personal figures count: a degraded run with no complete round has none and is left
    out of its point. Labelled by cell, and by the experiments joined where several
    settings are drawn."""
    lines = by_key(results, lambda r: (r.cell, series_key(r)))
    several = len({key for _, key in lines}) > 1
    drawn: dict[str, list[tuple[int, float]]] = {}
    for (cell, _), runs in lines.items():
        points = []
        for clients, group in sorted(by_key(runs, lambda r: r.clients).items()):
            scores = [
                math.log10(r.best_global / r.best_personal)
                for r in group
                if r.best_global and r.best_personal
            ]
            if scores:
                points.append((clients, statistics.fmean(scores)))
        label = cell.replace(CELL_SEPARATOR, " ")
        if several:
            names = sorted({r.experiment for r in runs})
            common = (names[0] if len(names) == 1
                      else os.path.commonprefix(names).rstrip("0123456789_"))  # fmt: skip
            label += f" ({common or ', '.join(names)})"
        while label in drawn:  # two settings of the same experiments: never merged
            label += "'"
        if points:
            drawn[label] = points
    return drawn


def plot_log_ratio_vs_clients(results: Sequence[RunResult], path: Path) -> Path:
    """The paper's Figure 7: mean log10(g/p) over seeds against the number of clients, one
    line per cell and setting (:func:`log_ratio_lines`)."""
    from matplotlib.ticker import NullFormatter

    figure, axis = pyplot().subplots(figsize=(7, 4.5))
    for label, points in log_ratio_lines(results).items():
        xs, ys = zip(*points, strict=True)
        axis.plot(xs, ys, marker="o", label=label)
    counts = sorted({r.clients for r in results})
    axis.set_xscale("log")
    axis.set_xticks(counts, [str(c) for c in counts])  # the client counts run, no log clutter
    axis.xaxis.set_minor_formatter(NullFormatter())
    axis.set_xlabel("number of clients")
    axis.set_ylabel("log10(g / p)   (0: global as good as personal)")
    axis.set_title("Best global vs best personal accuracy (FedReG paper, Figure 7)")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return _save(figure, path)


def rebalanced_counts(original: np.ndarray, thresholds: Sequence[int]) -> tuple[np.ndarray, ...]:
    """Per client and class: original samples kept (min(n_c, t)) and augmented samples
    added (t - n_c where n_c < t) in the rebalanced dataset; absent classes stay absent."""
    t = np.asarray(thresholds)[:, None]
    present = original > 0
    kept = np.where(present, np.minimum(original, t), 0)
    added = np.where(present, np.maximum(t - original, 0), 0)
    return kept, added


def rebalance_summary(original: np.ndarray, thresholds: Sequence[int]) -> str:
    """One line on what the threshold makes of the partition, so that a comparison of two
    thresholds (``mean`` against ``global-mean``, say) is a command, not a one-off script:
    train and rebalanced sizes (min/median/max over clients), the share of augmented copies
    among all rebalanced samples, and the largest client's share of all clients' effective
    samples (sum_c min(n_c, t): what weights ``head_g`` in aggregation under
    ``fedreg-head-weight = "effective"``; a round weighs only the clients it drew)."""
    kept, added = rebalanced_counts(original, thresholds)
    effective = kept.sum(axis=1)
    rebalanced = effective + added.sum(axis=1)

    def spread(sizes: np.ndarray) -> str:
        return f"{sizes.min()}/{np.median(sizes):g}/{sizes.max()}"

    return (
        f"rebalanced: clients={len(original)} train={spread(original.sum(axis=1))} "
        f"rebalanced={spread(rebalanced)} copies={added.sum() / rebalanced.sum():.3f} "
        f"head_g_weight_max={effective.max() / effective.sum():.3f}"
    )


def plot_class_distribution(
    original: np.ndarray, thresholds: Sequence[int], title: str, path: Path
) -> Path:
    """The paper's Figure 4: stacked class counts per client, original (top) and
    rebalanced (bottom, augmented samples hatched)."""
    clients, classes = original.shape
    kept, added = rebalanced_counts(original, thresholds)
    plt = pyplot()
    figure, axes = plt.subplots(2, 1, figsize=(max(8, clients * 0.35), 8), sharex=True)
    colours = plt.get_cmap("tab10" if classes <= 10 else "tab20")
    x = np.arange(clients)
    bottoms = [np.zeros(clients), np.zeros(clients)]
    for c in range(classes):
        colour = colours(c % colours.N)
        axes[0].bar(x, original[:, c], bottom=bottoms[0], color=colour, label=f"class {c}")
        bottoms[0] += original[:, c]
        axes[1].bar(x, kept[:, c], bottom=bottoms[1], color=colour)
        bottoms[1] += kept[:, c]
        axes[1].bar(x, added[:, c], bottom=bottoms[1], color=colour, hatch="//",
                    edgecolor="white", linewidth=0)  # fmt: skip
        bottoms[1] += added[:, c]
    axes[0].set_title("original train split per client")
    axes[1].set_title("rebalanced dataset per client (hatched: augmented samples)")
    for axis in axes:
        axis.set_ylabel("samples")
        axis.grid(axis="y", alpha=0.3)
    axes[1].set_xlabel("client (partition id)")
    axes[1].set_xticks(x)
    if classes <= 20:
        axes[0].legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    figure.suptitle(title)
    return _save(figure, path)


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only (no display on servers and devices)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110, bbox_inches="tight")
    pyplot().close(figure)
    return path


# --------------------------------------------------------------------- reports
def write_report(
    root: Path | Sequence[Path],
    out: Path,
    personal: str = "all",
    unfinished: bool = False,
    papers: Sequence[PaperCells] = (),
    versus: str | None = None,
    only: Sequence[str] = (),
) -> list[Path]:
    """Tables and plots for every finished run (completed or degraded) under ``root`` (or
    under each of several roots, see :func:`scan_roots`); the table says which seed
    folders were left out and why. ``personal`` picks the personal figure shown (one of
    ``PERSONAL_FIGURES``); ``unfinished`` keeps unfinished runs of seeds with no finished
    one, marked, with their rounds done under the table. ``rounds.md`` compares each cell
    round by round with ``versus`` (a cell; by default FedReG's, where it ran), and a
    ``versus`` that names no cell of the runs is refused. ``only`` keeps just those cells
    (the seeds some cells have and others lack, reported apart); a name that is no cell of
    the runs is refused, as is a ``versus`` it leaves out."""
    roots = [root] if isinstance(root, Path) else list(root)
    collection = scan_roots(roots, unfinished).of_cells(only)
    results, skipped = collection.results, collection.skipped_note(roots)
    if not results:
        kinds = "completed, degraded or unfinished" if unfinished else "completed or degraded"
        raise FileNotFoundError(
            f"{', '.join(map(str, roots))}: no {kinds} results.json under */*/seed*/ or "
            "*/*/seed*/*/" + (f"\n{skipped}" if skipped else "")
        )
    cells = sorted({r.cell for r in results})
    if versus is not None and versus not in cells:
        raise ConfigError(f"--versus={versus!r} is not a cell of these runs: expected one of "
                          f"{', '.join(cells)}")  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "table.md", out / "costs.md", out / "runs.md", out / "rounds.md",
               out / "cells.md"]  # fmt: skip
    table = paper_table(results, personal)
    progress = collection.unfinished_note()
    if only:  # the published cells left out are not "not run yet"
        papers = [dataclasses.replace(paper, cells={c: v for c, v in paper.cells.items()
                                                    if c in only}) for paper in papers]  # fmt: skip
    compared = [paper_comparison(results, paper, personal) for paper in papers]
    parts = [table, differing_settings(results), *compared, progress, skipped]
    written[0].write_text("\n\n".join(filter(None, parts)) + "\n")
    written[1].write_text(cost_table(results) + "\n")
    written[2].write_text(provenance_table(results) + "\n")
    written[3].write_text(rounds_report(results, versus or DEFAULT_VERSUS, personal))
    written[4].write_text(cells_table(results, versus or DEFAULT_VERSUS, personal))
    published = {paper.experiment: paper for paper in papers}
    for experiment, runs in by_key(results, lambda r: r.experiment).items():
        title = f"{experiment}: {describe_setting(runs[0].document)}"
        path = out / f"{experiment}_accuracy.png"
        written.append(plot_accuracy_curves(runs, title, path, personal, published.get(experiment)))
    if len({r.clients for r in results}) >= 2:
        written.append(plot_log_ratio_vs_clients(results, out / "log_ratio_vs_clients.png"))
    return written


def describe_setting(document: dict[str, Any]) -> str:
    """The settings that define a run, for plot titles: each named by its key where a bare
    word would leave two readings (``fraction`` was either of two fractions)."""
    config = document["config"]
    dataset = Path(str(config.get("dataset", "?"))).name
    share = config.get("data-fraction", 1.0)
    part = "" if share in (None, 1, 1.0) else f"data-fraction {share}, "
    return (
        f"{dataset}, {part}{document['run']['num_clients']} clients, alpha "
        f"{config.get('alpha')}, {config.get('num-server-rounds')} rounds, fraction-train "
        f"{config.get('fraction-train')}, E={config.get('local-epochs')}, "
        f"B={config.get('batch-size')}"
    )


# --------------------------------------------------------- one run on its own
#: The first columns of a report of runs given one by one (``costs.md``, ``runs.md``).
RUN_NAMES = ("run folder", "run")
#: The evaluated rounds whose mean a run's table gives beside its best and final figures.
LAST_ROUNDS = 10
RUN_NOTE = (
    f"best: the highest figure, with its round; final: the last evaluated round's; last "
    f"{LAST_ROUNDS}: the mean over the last {LAST_ROUNDS} evaluated rounds (over all of them "
    f"where fewer were evaluated). Percent."
)
RUN_DEGRADED_NOTE = (
    "In a degraded run's rounds with missing replies, P is over the clients that answered "
    "(as in the curves)."
)


def is_run(path: Path) -> bool:
    """Whether a path names one run, not a results root: a ``results.json`` (any file),
    or a run folder, which holds one (as ``flwr run`` writes it under ``results-dir``)."""
    return path.is_file() or (path / "results.json").is_file()


def read_run(path: Path) -> RunResult:
    """The run of a run folder or of its ``results.json``, whatever its status: a
    ``running``, ``stopped`` or ``failed`` run is reported as far as it got. Checked as a
    results root's records are; a failed run's rounds too. :class:`ConfigError` names
    the file where it cannot be read or is not a consistent record."""
    file = path if path.is_file() else path / "results.json"
    document = read_document(file)
    status = run_status(document)
    if status in (INVALID, UNREADABLE):
        error = str(document["run"]["error"]).removeprefix(f"{file.name}: ")
        raise ConfigError(f"{file}: {status}: {error}")
    problem = None if status in (*FINISHED, *UNFINISHED) else record_problem(document)
    if problem:
        error = document["run"].get("error")
        why = f" ({status}: {first_line(error)})" if error else ""
        raise ConfigError(f"{file}: the record{why} cannot be reported: {problem}")
    seed = document["config"].get("seed")
    if not is_whole(seed):
        raise ConfigError(f"{file}: config.seed is {seed!r}; expected an integer >= 0")
    name = f"{document['config']['algo']} seed{seed}"
    return RunResult(file.parent.name, name, seed, document, file.parent)


def read_runs(paths: Sequence[Path]) -> list[RunResult]:
    """:func:`read_run` of each path, in the order given; runs of the same algorithm and
    seed are numbered (``fedreg seed0 (2)``), and a run given twice is refused."""
    runs, seen = [], {}
    for path in paths:
        run = read_run(path)
        key = (run.folder / "results.json").resolve()
        if key in seen:
            raise ConfigError(f"{path}: the same run as {seen[key]}, given twice")
        seen[key] = path
        runs.append(run)
    names = [run.cell for run in runs]
    count: dict[str, int] = {}
    for index, run in enumerate(runs):
        if names.count(run.cell) > 1:
            count[run.cell] = count.get(run.cell, 0) + 1
            runs[index] = dataclasses.replace(run, cell=f"{run.cell} ({count[run.cell]})")
    return runs


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.2f}"


def run_figures(run: RunResult, metric: str, answered: bool = False) -> list[str]:
    """A run's best (with its round), final and last-rounds mean of a per-round accuracy,
    as percent texts ("–" where no round was evaluated)."""
    rounds, values = run.series(metric, answered)
    if not values:
        return ["–", "–", "–"]
    best = max(values)
    recent = values[-LAST_ROUNDS:]
    return [
        f"{_percent(best)} (r{rounds[values.index(best)]})",
        f"{_percent(values[-1])} (r{rounds[-1]})",
        _percent(statistics.fmean(recent)),
    ]


def run_state(run: RunResult) -> str:
    """What a run's status says, for the lines under its table."""
    status = run_status(run.document)
    if status in UNFINISHED:
        return run.state
    if status == FAILED:
        return f"failed: {first_line(run.document['run'].get('error') or '')}"
    return status or "no status recorded"


def run_table(runs: Sequence[RunResult], personal: str = "all") -> str:
    """One line per run, whatever its status: its best, final and last-rounds mean of G
    and P, with its rounds done; under it, each run's file and what its status says."""
    p = "P" if personal == "all" else f"P {personal}"
    header = ["run", "status", "rounds"] + [
        f"{m} {f}" for m in ("G", p) for f in ("best", "final", f"last {LAST_ROUNDS}")
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in runs:
        g = run_figures(run, GLOBAL)
        p_values = [
            marked(text, run.degraded)
            for text in run_figures(run, personal_metric(personal), run.degraded)
        ]
        cells = [run.cell, run_status(run.document) or "–", run.progress, *g, *p_values]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [RUN_NOTE] + ([RUN_DEGRADED_NOTE] if any(r.degraded for r in runs) else [])
    if personal != "all":
        notes.append(SAMPLED_NOTE)
    where = [f"- {run.cell}: {run.folder / 'results.json'}; {run_state(run)}" for run in runs]
    return "\n\n".join([footnotes("\n".join(lines)), *notes, "\n".join(where)])


def write_run_report(paths: Sequence[Path], out: Path, personal: str = "all") -> list[Path]:
    """The report of one run, or of several side by side, each given by its run folder or
    its ``results.json``, whatever its status (:func:`read_runs`): ``table.md``
    (:func:`run_table`), ``costs.md``, ``runs.md`` and ``accuracy.png`` (G and P per round;
    left out while no run has an evaluated round, which the table then says)."""
    runs = read_runs(paths)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "table.md", out / "costs.md", out / "runs.md"]
    table = run_table(runs, personal)
    metric = personal_metric(personal)
    drawn = any(r.series(GLOBAL)[0] or r.series(metric, answered=True)[0] for r in runs)
    if not drawn:
        table += "\n\nNo evaluated round yet: no accuracy curves."
    written[0].write_text(table + "\n")
    written[1].write_text(cost_table(runs, RUN_NAMES) + "\n")
    written[2].write_text(provenance_table(runs, RUN_NAMES) + "\n")
    if drawn:
        settings = {describe_setting(r.document) for r in runs}
        named = runs[0].cell if len(runs) == 1 else f"{len(runs)} runs"
        title = f"{named}: {settings.pop()}" if len(settings) == 1 else (
            f"{named} of {len(settings)} settings (runs.md)")  # fmt: skip
        written.append(plot_accuracy_curves(runs, title, out / "accuracy.png", personal))
    return written


def class_distribution_report(
    run_config: dict[str, Any], clients: int, out: Path
) -> tuple[Path, str]:
    """Figure 4 for a run config: partition as the runs do, count labels (no decoding),
    and apply the rebalancing rule with the configured threshold. Returns the figure's
    path and :func:`rebalance_summary`'s line."""
    import torch

    from clients.rebalance import class_threshold
    from fedreg_app.core.data import PartitionKey, client_splits, federated_dataset
    from fedreg_app.registry import load_config

    config = load_config(run_config)
    key = PartitionKey.from_config(config, clients)
    num_classes = federated_dataset(key).load_split("train").features["label"].num_classes
    original = np.stack(
        [
            np.bincount(client_splits(key, pid)["train"]["label"], minlength=num_classes)
            for pid in range(clients)
        ]
    )
    sizes = original.sum(axis=1).tolist()  # every client's train size, for global-* readings
    thresholds = [
        class_threshold(torch.as_tensor(row), config.threshold, sizes) for row in original
    ]
    title = (
        f"{Path(config.dataset).name}, {clients} clients, Dirichlet alpha {config.alpha}, "
        f"seed {config.seed}, threshold {config.threshold}"
    )
    path = plot_class_distribution(original, thresholds, title, out)
    return path, rebalance_summary(original, thresholds)


def cell_names(text: str) -> list[str]:
    """``--cells``: names as the table prints them (a variant's after a space) or as its
    folder names them (after ``__``); an empty name or one given twice is refused."""
    names = [name.strip().replace(" ", CELL_SEPARATOR) for name in text.split(",")]
    if "" in names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated cells, each once")
    return names


PATHS_HELP = """\
PATH is one of:
  a results root (fedreg-experiment --out): the newest finished run of each seed;
      writes table.md (mean ± std over seeds), costs.md, runs.md, rounds.md, cells.md
      and <experiment>_accuracy.png, by default in ROOT/report
  a run folder (results/<time>_<algo>_..._run<id>/, as `flwr run` writes it) or its
      results.json, whatever the run's status (running, failed, ...): writes table.md
      (best, final and last-10 mean of G and P), costs.md, runs.md and accuracy.png,
      by default in RUN-FOLDER/report
Several roots make one report; several runs are set side by side (both with --out)."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["classes"]:
        return _classes_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="fedreg-report",
        description="Tables and plots from the runs under a results root, or of single runs.\n"
        "`fedreg-report classes ...`: the Figure 4 class distribution (see its --help).",
        epilog=PATHS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("root", type=Path, nargs="+", metavar="PATH",
                        help="a results root, a run folder or a results.json; several of one "
                        "kind (with --out)")  # fmt: skip
    parser.add_argument("--out", type=Path, help="where to write (default: PATH/report, or "
                        "RUN-FOLDER/report; needed with several paths)")  # fmt: skip
    parser.add_argument(
        "--personal", choices=PERSONAL_FIGURES, default="all",
        help="personal accuracy shown: over all clients (default, as the sources) or over "
        "the clients that had trained at least once (sampled)",
    )  # fmt: skip
    parser.add_argument(
        "--unfinished", action="store_true",
        help="also report a seed's unfinished run (interrupted, stopped or still going) when "
        "it has no finished one: best figures over the rounds done, marked",
    )  # fmt: skip
    parser.add_argument(
        "--paper", action="append", default=[], type=Path, metavar="CONFIG",
        help="a config file with an [experiment.paper] table (e.g. configs/table2_fmnist.toml): "
        "the table also shows the published figures beside ours (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--versus", metavar="CELL",
        help="the cell rounds.md compares every other cell with, round by round on the same "
        f"seed, and cells.md's Δ columns (default: {DEFAULT_VERSUS}, where it ran), e.g. fedrod",
    )  # fmt: skip
    parser.add_argument(
        "--cells", metavar="CELL,CELL", type=cell_names, default=[],
        help="report only these cells, comma-separated, as the table names them, e.g. the "
        "ones with every seed (default: all)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        runs = runs_given(args)
        if args.out is None and len(args.root) > 1:
            kind = "runs" if runs else "roots"
            raise ConfigError(f"--out is needed with {len(args.root)} {kind}: where to write "
                              "their one report")  # fmt: skip
        if runs:
            folder = args.root[0] if args.root[0].is_dir() else args.root[0].parent
            written = write_run_report(args.root, args.out or folder / "report", args.personal)
        else:
            papers = [read_paper_cells(path) for path in args.paper]
            out = args.out or args.root[0] / "report"
            written = write_report(args.root, out, args.personal, args.unfinished, papers,
                                   args.versus, args.cells)  # fmt: skip
    except (FileNotFoundError, ConfigError) as err:
        parser.error(str(err))
    print(written[0].read_text())
    for path in written:
        print(f"wrote {path}")
    return 0


def runs_given(args: argparse.Namespace) -> bool:
    """Whether the paths are runs (run folders or results.json files), not results roots;
    a path that does not exist, roots and runs mixed, and the options that read a root's
    cells (``--paper``, ``--versus``, ``--cells``) with runs are refused."""
    missing = [path for path in args.root if not path.exists()]
    if missing:
        raise ConfigError(f"{missing[0]}: no such file or folder")
    runs = [is_run(path) for path in args.root]
    if any(runs) and not all(runs):
        raise ConfigError(
            f"{args.root[runs.index(True)]} is a run and {args.root[runs.index(False)]} is not "
            "(no results.json in it): give results roots, or runs (run folders or "
            "results.json files), not both"
        )
    if all(runs) and (args.paper or args.versus or args.cells):
        raise ConfigError("--paper, --versus and --cells read the cells of a results root; "
                          "a report of runs given one by one sets them side by side")  # fmt: skip
    return all(runs)


def _classes_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="fedreg-report classes",
        description="Per-client class counts, original and rebalanced (paper Figure 4).",
    )
    parser.add_argument("--clients", type=int, default=30, help="number of partitions")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="run-config key (repeatable), e.g. dataset-path=...")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("class_distribution.png"),
                        help="image file to write (.png added if it has no suffix)")  # fmt: skip
    args = parser.parse_args(argv)
    if not args.out.suffix:  # matplotlib would add .png and the printed path would not exist
        args.out = args.out.with_suffix(".png")
    declared = declared_run_config()
    try:
        overrides = declared_overrides(args.set, declared)
        path, summary = class_distribution_report({**declared, **overrides}, args.clients, args.out)
    except ConfigError as err:
        parser.error(str(err))
    print(f"wrote {path}")
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
