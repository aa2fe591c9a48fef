"""The records a report reads: every ``results.json`` under a results root, in the
runner's layout (``<experiment>/<cell>/seed<k>/[<run>/]results.json``), or a run given on
its own; each checked before it counts (a figure its rounds do not bear out, a record in
another seed's or cell's folder, one its checkpoint did not seal), the newest finished
run of each seed picked, and the seeds of another setting than their cell's set aside
with the reason (:class:`Collection`). What a report counts is decided here, in one
place and without matplotlib or the tables, so that the runner (``fedreg-experiment``)
and ``fedreg-replay`` read records as the report does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedreg_app.core.checkpoint import RESUMABLE_CHANGES, Seal, read_seal
from fedreg_app.core.config import ConfigError, as_ran, is_whole, setting_differences
from fedreg_app.core.figures import CLIENT_FIGURES, client_figures
from fedreg_app.core.metrics import (
    COMPLETED,
    DEGRADED,
    RUNNING,
    STOPPED,
    first_line,
    is_real,
    kept_rounds_problem,
    record_problem,
    status_problem,
)
from fedreg_app.core.persist import RUN_FOLDER_LOCK, folder_holder

# the algorithms (fedreg_app.registry) bring torch: they are imported where they are
# used, so that `fedreg-report --help` and a wrong argument answer at once.


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


def run_status(document: dict[str, Any]) -> str:
    """``running``, ``completed``, ``degraded`` or ``failed`` ("" if the file has none)."""
    return str(document.get("run", {}).get("status", ""))


def round_seconds(document: dict[str, Any]) -> list[float]:
    """Each recorded round's wall seconds as the server measured them (training plus
    evaluation phase), of a document :func:`read_document` accepted (costs checked)."""
    return [r["train_seconds"] + r["eval_seconds"] for r in document.get("rounds", [])]


def fault_kinds(document: dict[str, Any]) -> str:
    """What degraded a run, by kind, with the rounds and partitions: replies missing or
    refused (each distinct error's first words), private state that started afresh (which
    records). "" when nothing did."""
    errors: dict[str, tuple[set[int], set[int]]] = {}
    resets: dict[str, tuple[set[int], set[int]]] = {}
    for record in document.get("rounds", []):
        number = record.get("round")
        for error in record.get("errors") or []:
            kind = (
                f"{error.get('phase', '?')} replies failed or refused ({_gist(error.get('error'))})"
            )
            rounds, partitions = errors.setdefault(kind, (set(), set()))
            rounds.add(number)
            partitions.update(error.get("partitions") or [])
        named = record.get("state_reset_records") or []
        for entry in named:
            kind = f"private state started afresh ({', '.join(entry.get('records', []))})"
            rounds, partitions = resets.setdefault(kind, (set(), set()))
            rounds.add(number)
            partitions.add(entry.get("partition"))
        if record.get("state_resets") and not named:  # records made before names were kept
            resets.setdefault("private state started afresh", (set(), set()))[0].add(number)
    parts = []
    for kind, (rounds, partitions) in {**errors, **resets}.items():
        where = f"rounds {_numbers(rounds)}"
        if partitions - {None}:
            where += f", partitions {_numbers(partitions - {None})}"
        parts.append(f"{kind}: {where}")
    return "; ".join(parts)


def _gist(text: Any, words: int = 12) -> str:
    """An error's first line, cut to its first words."""
    line = str(text or "").splitlines()[0] if text else "no reason given"
    cut = line.split()
    return " ".join(cut[:words]) + (" …" if len(cut) > words else "")


def _numbers(values: set) -> str:
    return ", ".join(str(v) for v in sorted(values))


def personal_figure(document: dict[str, Any], which: str = "all") -> tuple[float | None, bool]:
    """A finished run's best personal accuracy and whether it is over the answering clients
    only: the all-client figure (complete rounds) where there is one, else, for a degraded
    run, the figure over the clients that answered. ``which="sampled"``: the best figure
    over the clients that had trained (None for runs written before it existed)."""
    if which == "sampled":
        return document.get("best_personal_accuracy_sampled"), False
    if which != "all":  # a per-client figure: its best over the rounds
        field = "personal_accuracy_" + which.replace("-", "_")
        values = [round_figure(record, field) for record in document.get("rounds", [])]
        return max((v for v in values if v is not None), default=None), False
    value = document.get("best_personal_accuracy")
    if value is not None or run_status(document) != DEGRADED:
        return value, False
    answered = document.get("best_personal_accuracy_answered")
    return answered, answered is not None


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
            value = round_figure(record, metric)
            if value is None and answered:
                value = record.get(f"{metric}_answered")
            if value is not None:
                points.append((record["round"], value))
        return [p[0] for p in points], [p[1] for p in points]


def round_figure(record: dict[str, Any], field: str) -> Any:
    """A round's figure; a per-client figure that a record written before the field
    existed does not state comes from its clients' accuracies, where every client
    answered."""
    if field in record or field not in CLIENT_FIGURES:
        return record.get(field)
    accuracies = record.get("client_accuracies")
    if not accuracies or record.get("personal_accuracy") is None:
        return None
    return client_figures(accuracies.values())[field]


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
    from fedreg_app.registry import ended_after  # the algorithms bring torch: not at start

    return record_problem(document, ended_after) or status_problem(document, ended_after)


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
    from fedreg_app.registry import CATALOG  # the algorithms bring torch: not at start

    changed = setting_differences(document["config"], seal.run_config, CATALOG,
                                  RESUMABLE_CHANGES)  # fmt: skip
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
    from fedreg_app.registry import CATALOG  # the algorithms bring torch: not at start

    return {**document, "config": as_ran(config, CATALOG)}  # an earlier version's: as it ran


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
    from fedreg_app.registry import CATALOG  # the algorithms bring torch: not at start

    gap = setting_differences(
        run.document["config"], reference.document["config"], CATALOG, ignore=("seed",)
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


# --------------------------------------------------------- one run on its own
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
    from fedreg_app.registry import ended_after  # the algorithms bring torch: not at start

    done = status in (*FINISHED, *UNFINISHED)
    problem = None if done else record_problem(document, ended_after)
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
