"""Experiment runner: a config file (or several) x algorithms x seeds, through ``flwr run``
in Flower's simulation, resumable, with mean ± std over seeds at the end.

A config file is a run config (the keys of ``[tool.flwr.app.config]``) plus an optional
``[experiment]`` table that only the runner reads::

    algo = "fedreg"
    dataset = "zalando-datasets/fashion_mnist"
    num-server-rounds = 100

    [experiment]
    name = "table1"
    clients = 20                      # SuperNodes the runs need
    algos = ["fedreg"]                # default: the run config's algo
    seeds = 5                         # default: 1; seeds 0..seeds-1
    grid = { augment = ["auto", "simple"], threshold = ["max", "median", "mean", "secmin"] }
    # optional named variants, each a set of overrides (crossed with grid and algos):
    variants = { fedreg = {}, a = { fedreg-head-weight = "original" } }

Every cell (grid values x algorithm) runs once per seed into
``<out>/<name>/<cell>/seed<k>/``; a run whose folder already holds a finished
``results.json`` (status ``completed``, or ``degraded``: it ran to its end but some client
replies were missing) is skipped. A run that was interrupted (the runner stopped by
Ctrl-C, SIGTERM or ``--max-minutes``, or killed with the machine) continues from its
last checkpoint (``resume``), in the same run folder, with the same client state dir
(``<seed folder>/state`` for algorithms whose clients keep state): its results equal an
uninterrupted run's. A checkpoint that cannot be trusted is reported by folder and error
and that run is left alone, unless ``--restart-damaged`` asks to start it anew. A
``failed`` run (its own error: a data folder gone, every reply lost) is retried from its
last checkpoint by the next invocation; one that left no checkpoint is run again from
round 1; the runner lists failed runs at the end and exits non-zero. The summary table
marks degraded figures. Exit status: 0 every run finished, 1 some run failed or cannot be
resumed, 2 a bad command line or config, 3 stopped by ``--max-minutes`` (resumable),
130 / 143 stopped by SIGINT / SIGTERM (resumable).

    fedreg-experiment configs/smoke.toml --seeds 3 --algos fedreg,fedavg \\
        --set dataset-path=../shared/data/fashion_mnist

``--seeds 1-2`` (or ``0,3``) runs those seeds only, in the folders ``--seeds 3`` would
give them: seeds spread over machines, each with its own ``--out``, are merged by
``fedreg-report ROOT ROOT...``.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import itertools
import json
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import textwrap
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedreg_app.core.checkpoint import Checkpoint, committed_round, state_path
from fedreg_app.core.config import (
    INPUT_PATH_KEYS,
    MAX_SEED,
    ConfigError,
    RunConfig,
    is_count,
    setting_differences,
)
from fedreg_app.core.metrics import FAILED, first_line, kept_rounds_problem, mark_stopped
from fedreg_app.core.persist import (
    RUN_FOLDER_LOCK,
    FolderInUseError,
    UnsafeLockError,
    folder_holder,
    hold_folder,
    release_folder,
    save_json,
)
from fedreg_app.core.protocol import STATE_KEY_PATTERN
from fedreg_tools.launcher import (
    ONE_CPU,
    SUPERLINK_HOME,
    ClientResources,
    LocalSuperLink,
    add_resource_arguments,
    resources_of,
    toml_value,
)
from fedreg_tools.overrides import check_declared, declared_overrides, declared_run_config
from fedreg_tools.reports import (
    DEGRADED,
    FINISHED,
    INVALID,
    PAPER_TABLE,
    RUNNING,
    UNFINISHED,
    UNREADABLE,
    PaperCells,
    cell_problem,
    clients_difference,
    footnotes,
    marked,
    mean_std,
    of_seeds,
    personal_figure,
    read_document,
    round_seconds,
    run_order,
    run_status,
    write_report,
)

if TYPE_CHECKING:
    from fedreg_app.core.data import PartitionKey

# The data (fedreg_app.core.data) and the algorithms (fedreg_app.registry) bring torch: they
# are imported where they are used, so that `fedreg-experiment --help` answers at once.

EXPERIMENT_TABLE = "experiment"
#: A run's own client state dir, in its seed folder (algorithms whose clients keep state).
STATE_FOLDER = "state"
#: What the runner notes in a run folder: it stopped the run, or started it anew elsewhere.
MARKER = "runner.json"
EXIT_FAILED = 1  # some run failed, or its checkpoint cannot be trusted
EXIT_TIME_UP = 3  # stopped by --max-minutes; the same command continues
EXIT_BUSY = 4  # another runner is using the same --out
#: In ``--out``: held (``flock``) by the runner using that folder, with its PID inside.
RUNNER_LOCK = ".fedreg-experiment.lock"


#: The most seeds one invocation plans (``--seeds`` or the file's ``seeds``): far above any
#: paper's 3 to 5, far below a typo's billion, which would be planned, run by run, first.
MAX_SEEDS = 1000
#: The keys of a config file's ``[experiment]`` table.
EXPERIMENT_KEYS = ("name", "clients", "algos", "seeds", "grid", "variants", PAPER_TABLE)
#: A name that becomes a folder under ``--out``: no separator, no ``..``, no hidden name
#: (the rule a state key follows).
FOLDER_NAME = STATE_KEY_PATTERN


def experiment_table_problem(meta: Any) -> str | None:
    """What is wrong with an ``[experiment]`` table (None if nothing): each key with the
    type it needs, so that a bad file is refused naming the key, before any run (a name
    such as ``../x`` would put runs outside ``--out``, ``seeds = 2.9`` would run 2)."""
    if not isinstance(meta, dict):
        return "must be a table"
    for key in meta:
        if key not in EXPERIMENT_KEYS:
            close = difflib.get_close_matches(key, EXPERIMENT_KEYS, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            return f"{key!r} is not one of its keys ({', '.join(EXPERIMENT_KEYS)}){hint}"
    name = meta.get("name")
    if name is not None and not (isinstance(name, str) and FOLDER_NAME.fullmatch(name)):
        return f"name={name!r} is not allowed: expected a folder name (letters, digits, ._-)"
    for key in ("clients", "seeds"):
        if key in meta and not is_count(meta[key]):
            return f"{key}={meta[key]!r} is not allowed: expected an integer >= 1"
    if meta.get("seeds", 1) > MAX_SEEDS:
        return f"seeds={meta['seeds']!r} is not allowed: expected an integer from 1 to {MAX_SEEDS}"
    algos = meta.get("algos")
    if algos is not None and not (
        isinstance(algos, list) and algos and all(isinstance(a, str) for a in algos)
    ):
        return f"algos={algos!r} is not allowed: expected a list of algorithm names"
    grid = meta.get("grid", {})
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        return f"grid={grid!r} is not allowed: expected a table of non-empty lists of values"
    variants = meta.get("variants", {})
    if not isinstance(variants, dict) or not all(
        isinstance(v, dict) and FOLDER_NAME.fullmatch(str(k)) for k, v in variants.items()
    ):
        return (
            f"variants={variants!r} is not allowed: expected a table of tables, each named "
            "as a folder (letters, digits, ._-)"
        )
    return None


#: ``flwr run``'s output for the run in progress, in the seed's folder.
FLWR_LOG = "flwr.log"


@dataclass(frozen=True)
class Experiment:
    """One config file: the shared run config and the cells to run."""

    name: str
    clients: int
    algos: tuple[str, ...]
    seeds: int
    grid: dict[str, list[Any]]
    run_config: dict[str, Any]
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    paper: PaperCells | None = None  # the published figures, reported beside ours

    @classmethod
    def load(cls, path: Path, declared: dict[str, Any]) -> Experiment:
        document = tomllib.loads(path.read_text())
        meta = document.pop(EXPERIMENT_TABLE, {})
        problem = experiment_table_problem(meta)
        if problem:
            raise ConfigError(f"{path}: [{EXPERIMENT_TABLE}] {problem}")
        variant_keys = {k for v in meta.get("variants", {}).values() for k in v}
        used = set(document) | set(meta.get("grid", {})) | variant_keys
        check_declared(used, declared, f"run config (in {path})")
        name = str(meta.get("name", path.stem))
        paper = meta.get(PAPER_TABLE)
        experiment = cls(
            name=name,
            clients=int(meta.get("clients", 20)),
            algos=tuple(meta.get("algos", [document.get("algo", declared["algo"])])),
            seeds=int(meta.get("seeds", 1)),
            grid={k: list(v) for k, v in meta.get("grid", {}).items()},
            run_config=document,
            variants={str(k): dict(v) for k, v in meta.get("variants", {}).items()},
            paper=None if paper is None else PaperCells.from_table(name, paper, str(path)),
        )
        return experiment

    def cells(self) -> list[dict[str, Any]]:
        """Every combination of the grid values, times every algorithm, times every
        variant (a variant's own ``algo`` replaces the cell's)."""
        keys = list(self.grid)
        combos = list(itertools.product(*(self.grid[k] for k in keys)) if keys else [()])
        variants = self.variants.items() if self.variants else [(None, {})]
        cells = []
        for values, algo, (label, overrides) in itertools.product(combos, self.algos, variants):
            cell = {"algo": overrides.get("algo", algo), **dict(zip(keys, values, strict=True))}
            if label is not None:
                cell["variant"] = label
            if cell not in cells:
                cells.append(cell)
        return cells


def cell_id(cell: dict[str, Any]) -> str:
    """A folder name for a cell, e.g. ``fedreg__augment-simple__threshold-mean``."""
    parts = [str(cell["algo"])] + [f"{k}-{v}" for k, v in cell.items() if k != "algo"]
    return "__".join(parts).replace("/", "_")


@dataclass
class RunSpec:
    """One run: an experiment's cell with one seed, and where its results go."""

    experiment: str
    cell: dict[str, Any]
    seed: int
    run_config: dict[str, Any]
    folder: Path
    clients: int
    num_rounds: int  # from the validated config: the file may leave it to the default
    keeps_state: bool = False  # the algorithm's clients carry state from round to round
    own_state_dir: bool = False  # ``<folder>/state``, made by the runner (not --set)
    #: the whole validated config, as a ServerApp records it: what a finished run must match
    setting: dict[str, Any] = field(default_factory=dict, repr=False)
    result: dict[str, Any] | None = field(default=None, repr=False)
    problem: str | None = field(default=None, repr=False)  # why it was not run
    damaged: bool = field(default=False, repr=False)  # not run, the folder untrusted

    def _documents(self) -> list[tuple[Path, dict[str, Any]]]:
        """Every run's results in this folder, oldest first (by ``run.started``, as the
        report orders them); a file that cannot be read, or that its rounds do not bear out
        (the report's check), reads as not finished, with why."""
        documents = [(path, read_document(path))
                     for path in self.folder.glob("*/results.json")]  # fmt: skip
        return sorted(documents, key=run_order)

    def finished_results(self) -> dict[str, Any] | None:
        """The newest finished run's results (completed or degraded) of this setting, if
        any: such a run is not run again (a degraded one would most likely degrade again,
        and its figures are kept, marked). A finished run of another setting (the config
        file or ``--set`` changed since) is not this run's result."""
        finished = [
            d for _, d in self._documents()
            if run_status(d) in FINISHED and not self.differences(d)
        ]  # fmt: skip
        return finished[-1] if finished else None

    def differences(self, document: dict[str, Any]) -> list[str]:
        """Where a results.json's recorded config is not this run's setting (``key=its
        value, not this run's``)."""
        recorded = document.get("config")
        if not isinstance(recorded, dict):
            return ["config: not recorded"]
        return setting_differences(recorded, self.setting) + clients_difference(
            document, self.clients
        )

    def other_setting(self) -> str | None:
        """The newest finished run in this seed's folder that is of another setting, and
        how it differs (None when there is none), so the log says why it runs again."""
        others = [
            (path, self.differences(d)) for path, d in self._documents()
            if run_status(d) in FINISHED and self.differences(d)
        ]  # fmt: skip
        if not others:
            return None
        path, differences = others[-1]
        return f"{path.parent} finished with another setting ({'; '.join(differences)})"

    def failure(self) -> str:
        """Why this seed has no finished run: the newest run's folder, status and error."""
        if self.problem:
            return self.problem
        documents = self._documents()
        if not documents:
            return f"no results.json in {self.folder}; see {self.folder / FLWR_LOG}"
        path, document = documents[-1]
        run = document.get("run", {})
        status = run.get("status") or "no status"
        after = checkpoint_round(path.parent)
        if status == RUNNING:  # killed, or its last write failed (a full disk)
            then = "it has no checkpoint, so the same command starts it anew"
            if after:
                then = f"its checkpoint is of round {after}, so the same command resumes it there"
            status = (
                "still 'running' when flwr run ended: the ServerApp ended without writing "
                f"its status (see {self.folder / FLWR_LOG}); {then}"
            )
        elif status == FAILED and after:  # retried from there once what it names is mended
            status += f"; the same command retries it after round {after}"
        error = "\n" + textwrap.indent(f"error: {run['error']}", "    ") if run.get("error") else ""
        return f"{path.parent} ({status}){error}"

    def run_folders(self) -> list[Path]:
        """The ServerApp's run folders in this seed's folder, oldest first."""
        return sorted(path.parent for path in self.folder.glob("*/results.json"))

    @property
    def state_dir(self) -> Path | None:
        value = self.run_config.get("state-dir")
        return Path(value) if value else None

    def describe(self) -> str:
        extras = " ".join(f"{k}={v}" for k, v in self.cell.items() if k != "algo")
        return f"{self.experiment} {self.cell['algo']} {extras} seed {self.seed}".replace("  ", " ")


def plan(
    experiments: Iterable[Experiment],
    out: Path,
    declared: dict[str, Any],
    overrides: dict[str, Any],
    seeds: int | Sequence[int] | None = None,
    algos: tuple[str, ...] | None = None,
    variants: tuple[str, ...] | None = None,
) -> list[RunSpec]:
    """All runs, validated before any starts (a bad value fails the whole plan). Seed-major:
    every cell's first seed comes first, so a partially finished grid already compares.
    ``seeds`` is a number n (seeds 0..n-1) or the seeds themselves (``--seeds 1-2``: a
    machine runs seeds another has not, into folders a report merges with the others').
    ``variants`` keeps only those named variants of each file (a run of one variant lands
    in the folder the whole file would give it, so reports pair it as before)."""
    specs = []
    check_runner_keys(overrides)
    for experiment in experiments:
        grid = {k: None for k in experiment.grid if k != "seed"}  # seed: run_spec names it
        for where in (experiment.run_config, *experiment.variants.values(), grid):
            try:
                check_runner_keys(where)
            except ConfigError as err:
                raise ConfigError(f"{experiment.name}: {str(err).replace('--set ', '')}") from None
        if algos:
            experiment = Experiment(**{**experiment.__dict__, "algos": algos})
        if variants:
            chosen = chosen_variants(experiment, variants)
            experiment = Experiment(**{**experiment.__dict__, "variants": chosen})
        numbers = seeds if isinstance(seeds, Sequence) else range(seeds or experiment.seeds)
        for seed, cell in itertools.product(numbers, experiment.cells()):
            specs.append(run_spec(experiment, cell, seed, out, declared, overrides))
    return one_run_a_folder(specs)


def seed_numbers(text: str) -> int | tuple[int, ...]:
    """``--seeds``: a number n (seeds 0..n-1, as the file's ``seeds``) or the seeds
    themselves, ranges and single seeds separated by commas (``1-2``, ``0,3``, ``4-4``).
    Anything else (a range upside down, a seed twice, a sign, a digit that is not ASCII)
    is refused: each would run fewer seeds, or other ones, than the command says. So are
    more than :data:`MAX_SEEDS` seeds and a seed above the config's ``MAX_SEED``, counted
    before any range is spelled out: ``0-1000000000`` once planned a billion runs first."""
    allowed = (f"expected a number of seeds from 1 to {MAX_SEEDS} (seeds 0..n-1) or seeds "
               f"such as 1-2 or 0,3, each at most 2**63 - 1")  # fmt: skip
    refuse = ConfigError(f"--seeds={text} is not allowed: {allowed}")
    if re.fullmatch(r"\s*\d+\s*", text, re.ASCII):  # a number of seeds
        if not 1 <= int(text) <= MAX_SEEDS:
            raise refuse
        return int(text)
    ranges: list[range] = []
    for part in text.split(","):
        ends = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part, re.ASCII)
        if not ends:
            raise refuse
        first, last = int(ends[1]), int(ends[2] or ends[1])
        if not first <= last <= MAX_SEED:
            raise refuse
        ranges.append(range(first, last + 1))
    if sum(map(len, ranges)) > MAX_SEEDS:
        raise refuse
    seeds = [seed for seeds in ranges for seed in seeds]
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds={text} is not allowed: it names a seed twice ({allowed})")
    return tuple(seeds)


def names_list(flag: str, text: str | None) -> tuple[str, ...] | None:
    """A comma-separated list of names from the command line; None when the flag is absent
    (the file's own list). An empty name is refused: ``--algos ''`` once ran every one."""
    if text is None:
        return None
    names = tuple(name.strip() for name in text.split(","))
    if not all(names):
        raise ConfigError(f"{flag}={text!r} is not allowed: expected names separated by commas "
                          f"(leave {flag} out for the file's)")  # fmt: skip
    return names


def chosen_variants(experiment: Experiment, names: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The named variants of ``experiment``, in the file's order; a name the file does not
    define is refused with the names it does (a typo would otherwise run nothing)."""
    unknown = [name for name in names if name not in experiment.variants]
    if unknown:
        defined = ", ".join(experiment.variants) or "none: the file has no [experiment.variants]"
        raise ConfigError(
            f"--variants={','.join(names)!r} is not allowed: {experiment.name} defines no "
            f"variant {', '.join(map(repr, unknown))} (its variants: {defined})"
        )
    return {name: overrides for name, overrides in experiment.variants.items() if name in names}


def one_run_a_folder(specs: list[RunSpec]) -> list[RunSpec]:
    """The runs, each folder once. Two cells can name one folder (grid values ``1`` and
    ``"1"``, or ``a/b`` and ``a_b``; two config files with one experiment name): their
    runs would resume and overwrite each other's records, so two settings in one folder are
    refused; the same setting twice is one run."""
    kept: dict[Path, RunSpec] = {}
    for spec in specs:
        first = kept.setdefault(spec.folder, spec)
        if first is not spec and (first.setting, first.clients) != (spec.setting, spec.clients):
            raise ConfigError(
                f"[{EXPERIMENT_TABLE}] {spec.experiment}: the cells {first.cell} and {spec.cell} "
                f"would both run in {spec.folder.parent.name}/{spec.folder.name} with different "
                "settings; give values that name different folders ('/' becomes '_'), or "
                "experiments in different files different names"
            )
    return list(kept.values())


#: Keys the runner sets for each run itself, with what to use instead.
RUNNER_KEYS = {
    "resume": "the runner resumes each interrupted run itself",
    "seed": "--seeds gives the seeds (n: 0..n-1; or seeds such as 1-2)",
    "results-dir": "--out gives where the runs are written",
}


def check_runner_keys(overrides: dict[str, Any]) -> None:
    """A ``--set`` of a key the runner sets per run would be ignored (``seed``,
    ``results-dir``) or would resume another run's folder and rewrite its record
    (``resume``): refused before any work, naming what to use instead."""
    for key in sorted(overrides.keys() & RUNNER_KEYS.keys()):
        raise ConfigError(f"--set {key}=... is not allowed: {RUNNER_KEYS[key]}")


def run_spec(
    experiment: Experiment,
    cell: dict[str, Any],
    seed: int,
    out: Path,
    declared: dict[str, Any],
    overrides: dict[str, Any],
) -> RunSpec:
    """One run's config. Where the algorithm's clients keep state (FedReG's private head,
    Ditto's personal model, FedDyn's correction, ...), the run gets its own persistent
    ``state-dir`` in its seed folder (unless one is set), so that it can be resumed."""
    from fedreg_app.registry import get_algorithm, load_config

    # absolute: its paths go into run configs (resume, results-dir, state-dir) that the
    # ServerApp reads in another working directory (a relative --out resumed nothing)
    folder = out.absolute() / experiment.name / cell_id(cell) / f"seed{seed}"
    run_config = {
        **experiment.run_config,
        **experiment.variants.get(cell.get("variant"), {}),
        **{k: v for k, v in cell.items() if k != "variant"},
        **overrides,
        "seed": seed,
        "results-dir": str(folder.resolve()),
    }
    for key in INPUT_PATH_KEYS:  # the ServerApp runs in another working directory
        if run_config.get(key):
            run_config[key] = str(Path(run_config[key]).expanduser().resolve())
    config = load_config({**declared, **run_config})
    misnamed = cell_problem(cell_id(cell), config.to_run_config())
    if misnamed:  # the folder would name another run than the one made in it
        raise ConfigError(
            f"[{EXPERIMENT_TABLE}] {experiment.name}: "
            f"{misnamed.replace('the file lies in', 'its runs would lie in')}; a --set or a "
            "variant may not change the algorithm or a grid key a cell is named by, and the "
            "grid may not set seed (--seeds does)"
        )
    keeps_state = get_algorithm(config.algo).client.keeps_state(config)
    own_state_dir = keeps_state and not config.state_dir
    if own_state_dir:
        if (folder / STATE_FOLDER).is_symlink():  # the runner deletes it when the run ends
            raise ConfigError(
                f"{folder / STATE_FOLDER} is a link; the runner keeps a run's client state "
                "there and deletes the folder once the run has finished: remove the link "
                "(or --set state-dir=... to keep the state elsewhere)"
            )
        run_config["state-dir"] = str((folder / STATE_FOLDER).resolve())
    elif config.state_dir:
        run_config["state-dir"] = str(Path(config.state_dir).expanduser().resolve())
    return RunSpec(
        experiment.name, cell, seed, run_config, folder, experiment.clients,
        config.num_server_rounds, keeps_state, own_state_dir, setting=config.to_run_config(),
    )  # fmt: skip


def write_run_config(run_config: dict[str, Any], directory: Path) -> Path:
    """A flat TOML file for ``flwr run --run-config FILE``."""
    lines = [f"{key} = {toml_value(value)}" for key, value in run_config.items()]
    path = Path(tempfile.mkstemp(suffix=".toml", dir=directory)[1])
    path.write_text("\n".join(lines) + "\n")
    return path


# ------------------------------------------------------------- resuming runs
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


def checkpoint_round(run_folder: Path | None) -> int:
    """The round of the run folder's committed checkpoint (0 if none can be read)."""
    return 0 if run_folder is None else committed_round(run_folder)


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
    from fedreg_app.registry import get_algorithm, load_config

    try:
        config = load_config({**declared, **spec.run_config, "resume": str(folder)})
        checkpoint.check_compatible(config, get_algorithm(config.algo).resume_fixed)
    except ConfigError as err:
        return Attempt(note=f"{folder} cannot be resumed with this config ({err}); starting anew")
    # The ServerApp lets a resume change num-server-rounds and eval-every (a deployed run
    # extended); a grid's run resumed so would mix two settings' rounds under the new one
    # (rounds evaluated that an uninterrupted run never evaluates): it starts anew.
    changed = setting_differences(config.to_run_config(), checkpoint.run_config)
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


def expected_time(progress: Progress) -> str:
    """What the runs still to do are expected to take, by their cells' records on disk (the
    median seconds of a round, this machine or another); where some cells have none, which,
    and what the others are expected to take (a lower bound on the whole, not a guess at
    the cells with no record: Ditto's round costs twice FedAvg's)."""
    if not progress.open:
        return "nothing left to run"
    expected = progress.seconds_per_round()
    known: list[RunSpec] = []
    blind: list[RunSpec] = []
    for spec in progress.open:
        (blind if math.isnan(expected[cell_key(spec)]) else known).append(spec)
    if not blind:
        return f"about {_clock(progress.seconds_left())} left at the seconds a round of the records"
    unknown = sorted({s.describe().rsplit(" seed ", 1)[0] for s in blind})
    named = unknown[:3] + ([f"{len(unknown) - 3} more"] if len(unknown) > 3 else [])
    said = f"time left unknown: no record yet of {', '.join(named)}"
    if not known:
        return said
    runs = f"{len(known)} runs, by their" if len(known) > 1 else "run, by its"
    return f"{said}; about {_clock(progress.seconds_left(runs=known))} for the other {runs} records"


def _damaged(folder: Path, error: str, restart: bool) -> Attempt:
    if restart:
        write_marker(folder, abandoned=error)
        return Attempt(note=f"cannot resume {folder}: {error}; starting anew (--restart-damaged)")
    return Attempt(problem=(
        f"cannot resume {folder}: {error}\n    the folder is left as it is; add "
        "--restart-damaged to start this run anew in a fresh folder"
    ), damaged=True)  # fmt: skip


# ------------------------------------------------------------------ progress
def cell_key(spec: RunSpec) -> tuple[str, str]:
    """What makes two runs cost alike: the experiment and the cell (every seed's)."""
    return spec.experiment, json.dumps(spec.cell, sort_keys=True, default=str)


def recorded_seconds(specs: Sequence[RunSpec]) -> dict[tuple[str, str], float]:
    """Per cell, the median wall seconds of a round in the records already in its seed
    folders (finished or partial, any seed): what a cell not yet run in this invocation is
    expected to cost, where the cells of a grid cost very differently (Ditto trains two
    models a round, FedAvg one)."""
    seconds: dict[tuple[str, str], list[float]] = {}
    for spec in specs:
        for _, document in spec._documents():
            # rounds the report's check bore out (not a failed run's, which it does not
            # check), of this setting (not the 50 epochs a round of an earlier one)
            if run_status(document) in (*FINISHED, *UNFINISHED) and not spec.differences(document):
                seconds.setdefault(cell_key(spec), []).extend(round_seconds(document))
    return {key: statistics.median(values) for key, values in seconds.items() if values}


#: per cell (``cell_key``): seconds and rounds summed
Tallies = dict[tuple[str, str], list[float]]

#: A run is timed over its last this many rounds: a stretch on a shared machine (a test
#: suite beside it) should not weigh on the estimate for the rest.
RECENT_ROUNDS = 10


class Progress:
    """Runs and rounds done over the whole grid, seconds per round of the run in progress,
    elapsed time and an estimate of the time left (and when that is).

    A run's first round in an invocation also pays its start-up (Ray, the partitions,
    CUDA: a minute on a GPU whose rounds take 5 s), so the seconds a round are timed from
    the end of each run's first round here on, and the start-ups are counted apart. The
    estimate adds up, over the rounds still to run, each cell's seconds a round: as timed
    in this invocation where the cell has run, else as its records on disk say, scaled by
    how this invocation's cells compare with their own records (the records may come from
    another machine), else this invocation's mean; and a start-up for each run still to
    start, once one has been timed. A run timed here, the one in progress too, counts
    with its last ``RECENT_ROUNDS`` rounds only, so the estimate follows the machine's
    present pace.
    """

    def __init__(
        self,
        specs: list[RunSpec],
        ahead: dict[int, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``specs`` with their finished results found (``result``); ``ahead``: per
        unfinished run (by ``id``), the round its checkpoint lets it resume after."""
        self.clock = clock
        self.total_rounds = sum(s.num_rounds for s in specs)
        self.open = [s for s in specs if s.result is None]  # neither finished nor given up
        self.ahead = ahead or {}
        #: rounds of the runs finished (before or in this invocation) or given up
        self.rounds_closed = sum(s.num_rounds for s in specs if s.result is not None)
        self.current: RunSpec | None = None
        self.run_start = 0  # rounds the current run had when this invocation started it
        self.started = self.run_started = clock()
        #: the clock and the run's rounds when its first round here was seen (None before)
        self.first_seen: tuple[float, int] | None = None
        #: (clock, rounds) of the current run's first round here and of the rounds seen
        #: since, the oldest dropped once the later ones span RECENT_ROUNDS rounds
        self.seen: list[tuple[float, int]] = []
        #: per cell: seconds and rounds timed after each closed run's first round here
        self.measured: Tallies = {}
        #: per cell: seconds and rounds of each closed run's first round here (start-up in)
        self.first: Tallies = {}
        self.starts: dict[tuple[str, str], int] = {}  # per cell: runs started here
        self.recorded = recorded_seconds(specs)

    def start(self, spec: RunSpec, rounds_at_start: int) -> None:
        self.current, self.run_start, self.run_started = spec, rounds_at_start, self.clock()
        self.first_seen, self.seen = None, []
        self.starts[cell_key(spec)] = self.starts.get(cell_key(spec), 0) + 1

    def observe(self, rounds_in_run: int) -> None:
        """The current run has ``rounds_in_run`` rounds checkpointed now."""
        if self.first_seen is None and rounds_in_run > self.run_start:
            self.first_seen = (self.clock(), rounds_in_run)
            self.seen = [self.first_seen]
        elif self.seen and rounds_in_run > self.seen[-1][1]:
            self.seen.append((self.clock(), rounds_in_run))
            while len(self.seen) > 1 and rounds_in_run - self.seen[1][1] >= RECENT_ROUNDS:
                del self.seen[0]  # the window still spans RECENT_ROUNDS rounds without it

    def close(self, spec: RunSpec, rounds_in_run: int) -> None:
        """``spec`` ended here with ``rounds_in_run`` rounds, or was given up unstarted."""
        if spec is self.current:
            self.measured, self.first = self._timed(spec, rounds_in_run)
            self.current, self.run_start, self.first_seen, self.seen = None, 0, None, []
        self.open = [s for s in self.open if s is not spec]
        self.rounds_closed += spec.num_rounds

    def done(self, rounds_in_run: int = 0) -> int:
        """Rounds done over the grid: of closed runs, of the current one (``rounds_in_run``)
        and those the checkpoints of the runs still to come hold."""
        return self.rounds_closed + rounds_in_run + sum(self._ahead(s) for s in self.open)

    def _ahead(self, spec: RunSpec) -> int:
        return 0 if spec is self.current else self.ahead.get(id(spec), 0)

    def _timed(self, spec: RunSpec | None, rounds_in_run: int) -> tuple[Tallies, Tallies]:
        """Per cell, the seconds and rounds of this invocation after each run's first round
        here (of a run longer than ``RECENT_ROUNDS`` rounds here, its last ones), and those
        of the first rounds; the current run's (``spec``) included."""
        measured = {key: list(tally) for key, tally in self.measured.items()}
        first = {key: list(tally) for key, tally in self.first.items()}
        if spec is None:
            return measured, first
        now, seen = self.clock(), self.first_seen
        if seen is None:  # no round seen yet: all of it is the first round
            seen = (now, max(self.run_start, rounds_in_run))
        since = self.seen[0] if self.seen else seen  # the recent rounds' start
        parts = (
            (first, seen[0] - self.run_started, seen[1] - self.run_start),
            (measured, now - since[0], max(0, rounds_in_run - since[1])),
        )
        for tallies, seconds, rounds in parts:
            tally = tallies.setdefault(cell_key(spec), [0.0, 0])
            tally[0], tally[1] = tally[0] + seconds, tally[1] + rounds
        return measured, first

    def measured_per_round(self, spec: RunSpec, rounds_in_run: int) -> float:
        """The seconds a round of the current run's cell, as timed in this invocation: after
        the runs' first rounds here once there is such a round, else with the start-up."""
        measured, first = self._timed(spec, rounds_in_run)
        for seconds, rounds in (measured[cell_key(spec)], first[cell_key(spec)]):
            if rounds:
                return seconds / rounds
        return math.nan

    def seconds_per_round(
        self, spec: RunSpec | None = None, rounds_in_run: int = 0
    ) -> dict[tuple[str, str], float]:
        """Each open cell's expected seconds a round (NaN where nothing tells yet)."""
        measured, first = self._timed(spec, rounds_in_run)
        rates = {key: s / r for key, (s, r) in measured.items() if r > 0}
        with_start = {key: s / r for key, (s, r) in first.items() if r > 0}
        both = [key for key in rates if key in self.recorded and self.recorded[key] > 0]
        scale = (
            sum(measured[k][0] for k in both) / sum(self.recorded[k] * measured[k][1] for k in both)
            if both else 1.0
        )  # fmt: skip
        pooled = measured if rates else first
        spent = sum(s for s, _ in pooled.values())
        computed = sum(r for _, r in pooled.values())
        mean = spent / computed if computed else math.nan
        expected = {}
        for key in {cell_key(s) for s in self.open}:
            if key in rates:
                expected[key] = rates[key]
            elif key in self.recorded:
                expected[key] = self.recorded[key] * scale
            else:
                expected[key] = with_start.get(key, mean)
        return expected

    def start_up_seconds(self, spec: RunSpec | None = None, rounds_in_run: int = 0) -> float:
        """What a run's start costs beyond its first round: over the runs started here in
        cells with a timed rate, the mean of (first rounds' seconds - those rounds at the
        cell's rate); 0 until then."""
        measured, first = self._timed(spec, rounds_in_run)
        extra, starts = 0.0, 0
        for key, (seconds, rounds) in first.items():
            timed = measured.get(key)
            if rounds and timed and timed[1]:
                extra += seconds - rounds * timed[0] / timed[1]
                starts += self.starts[key]
        return max(0.0, extra / starts) if starts else 0.0

    def seconds_left(
        self,
        spec: RunSpec | None = None,
        rounds_in_run: int = 0,
        runs: Sequence[RunSpec] | None = None,
    ) -> float:
        """The estimate of the time the open runs (or those of them in ``runs``) still need
        (NaN while unknown); ``spec``: the run in progress, with ``rounds_in_run`` done."""
        expected = self.seconds_per_round(spec, rounds_in_run)
        runs = self.open if runs is None else runs
        to_start = sum(1 for s in runs if s is not spec)
        return to_start * self.start_up_seconds(spec, rounds_in_run) + sum(
            (s.num_rounds - (rounds_in_run if s is spec else self._ahead(s)))
            * expected[cell_key(s)]
            for s in runs
        )

    def line(self, index: int, total: int, spec: RunSpec, rounds_in_run: int) -> str:
        done = self.done(rounds_in_run)
        elapsed = self.clock() - self.started
        per_round = self.measured_per_round(spec, rounds_in_run)
        left = self.seconds_left(spec, rounds_in_run)
        eta = "" if math.isnan(left) else f", ETA {_wall_clock(left)}"
        return (
            f"[run {index}/{total} | round {rounds_in_run}/{spec.num_rounds}] {spec.describe()}"
            f" | grid {done}/{self.total_rounds} rounds"
            f" | {'?' if math.isnan(per_round) else f'{per_round:.1f}'} s/round"
            f" | elapsed {_clock(elapsed)} | left ~{_clock(left)}{eta}"
        )


def _clock(seconds: float) -> str:
    if math.isnan(seconds):
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _wall_clock(seconds_from_now: float) -> str:
    """The local time that many seconds from now: ``21:35``, with the date past a day."""
    moment = time.localtime(time.time() + seconds_from_now)
    return time.strftime("%H:%M" if seconds_from_now < 20 * 3600 else "%Y-%m-%d %H:%M", moment)


# -------------------------------------------------------------------- running
class Stop(BaseException):
    """The runner stops before the grid is done, leaving every run resumable: on a signal
    (exit status 128 + its number) or when ``--max-minutes`` is up (3)."""

    def __init__(self, reason: str, exit_code: int) -> None:
        super().__init__(reason)
        self.reason, self.exit_code = reason, exit_code


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT (Ctrl-C) and SIGTERM raise :class:`Stop` in the main thread; the runner then
    stops the SuperLink and the simulation by PID. Further signals while it does so are
    ignored, so that nothing it started is left behind."""

    def handler(signum: int, _frame: object) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        name = signal.Signals(signum).name
        raise Stop(f"stopped by {name}", 128 + signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def exclusive_out(out: Path) -> Iterator[None]:
    """Hold ``out`` for this runner: two runners on one ``--out`` would resume the same
    run folders and share one SuperLink database (``.flwr_home``), writing over each
    other's results. Raises :class:`FolderInUseError` naming the other's PID."""
    try:
        handle = hold_folder(out, RUNNER_LOCK, f"another fedreg-experiment (PID {os.getpid()})")
    except UnsafeLockError:
        raise  # a planted link, not another runner: its own message says so
    except FolderInUseError as busy:
        raise FolderInUseError(
            f"{busy}: two runners on one --out would resume the same runs and write over "
            "each other. Wait for it to end, stop that PID, or give this grid another --out"
        ) from None
    try:
        yield
    finally:
        release_folder(handle)


@dataclass
class Limits:
    """When to stop: ``deadline`` (a time.monotonic() value; None = never) is honoured at
    a round boundary, once this invocation has done at least one round."""

    deadline: float | None = None
    restart_damaged: bool = False

    def time_up(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


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


def run_all(
    specs: list[RunSpec],
    home: Path,
    poll_seconds: float = 5.0,
    limits: Limits | None = None,
    declared: dict[str, Any] | None = None,
    resources: ClientResources = ONE_CPU,
) -> list[RunSpec]:
    """Run what is not finished yet, one run at a time, through one SuperLink (each client
    actor reserving ``resources``), resuming interrupted runs from their checkpoints;
    returns the runs that are still not finished (failed, not resumable, or no
    results.json). No SuperLink is started when every pending run is surely refused (a
    damaged checkpoint, changed or unreadable data; not a folder in use, which its holder
    may release while the SuperLink starts: decided again then). Raises :class:`Stop` when
    stopped early, after the SuperLink and everything it started are stopped."""
    limits = limits or Limits()
    declared = declared if declared is not None else declared_run_config()
    attempts = {}  # each pending run's prospect, nothing changed on disk yet
    for spec in specs:
        tidy(spec)
        spec.result = spec.finished_results()
        if spec.result is None:
            attempts[id(spec)] = decide(spec, declared, restart_damaged=False)
    progress = Progress(specs, {key: a.after_round for key, a in attempts.items()})
    pending = [spec for spec in specs if spec.result is None]
    print(
        f"{len(specs) - len(pending)} of {len(specs)} runs already finished; {len(pending)} to run"
    )
    if not pending:
        return []
    session = Session(progress, limits, len(specs), poll_seconds, declared)
    first = len(specs) - len(pending) + 1
    if all(attempts[id(spec)].refused(limits.restart_damaged) for spec in pending):
        for spec in pending:  # named as below, with no SuperLink started for nothing
            session.refuse(spec, attempts[id(spec)].problem or "", attempts[id(spec)].damaged)
        return pending
    try:
        with LocalSuperLink(home, resources=resources) as superlink:
            try:
                for index, spec in enumerate(pending, start=first):
                    session.run(superlink, index, spec)
            except Stop as stop:
                session.mark_stopped(stop)  # before the SuperLink goes
                raise
    except Stop as stop:
        session.write_stopped(stop)  # the SuperLink and the ServerApp are gone now
        session.report_stop(stop)
        raise
    return [s for s in specs if s.result is None]


def submitted_run_id(log_path: Path) -> int | None:
    """The run id ``flwr run`` printed on submitting the run (None before it did)."""
    try:
        with log_path.open(errors="replace") as log:
            head = log.read(1 << 16)
    except OSError:
        return None
    found = re.search(r"Successfully started run (\d+)", head)
    return int(found[1]) if found else None


class Session:
    """The runs of one invocation: starts or resumes each, reports progress, and stops
    at a round boundary when the time is up."""

    def __init__(
        self, progress: Progress, limits: Limits, total: int, poll_seconds: float,
        declared: dict[str, Any],
    ) -> None:  # fmt: skip
        self.progress, self.limits, self.total = progress, limits, total
        self.poll_seconds = min(poll_seconds, 0.5) if limits.deadline is not None else poll_seconds
        self.declared = declared
        self.rounds_run = 0  # rounds this invocation completed (a slice does at least one)
        self.current: Path | None = None  # the run folder in progress
        self.confirmed = False  # whether it is known to be this run's (resumed, or by run id)
        self.spec: RunSpec | None = None
        self.before: set[Path] = set()  # the seed's run folders before the run started

    def find_run_folder(self) -> None:
        """A new run's folder, once the ServerApp has made it: the one named by the run id
        ``flwr run`` printed, where it printed one, so that a folder another run makes in
        the seed's folder meanwhile (a run an earlier SuperLink left pending, before
        :func:`~fedreg_tools.launcher.forget_earlier_runs`) is never taken for this run's."""
        if self.spec is None or self.confirmed:
            return
        new = [f for f in self.spec.run_folders() if f not in self.before]
        run_id = submitted_run_id(self.spec.folder / FLWR_LOG)
        if run_id is not None:
            new = [f for f in new if f.name.endswith(f"_run{run_id}")]
            self.confirmed = bool(new)  # the run's own folder: looked for no more
        self.current = new[-1] if new else self.current

    def run(self, superlink: LocalSuperLink, index: int, spec: RunSpec) -> None:
        if self.rounds_run and self.limits.time_up():
            raise Stop("stopped by --max-minutes", EXIT_TIME_UP)
        attempt = decide(spec, self.declared, self.limits.restart_damaged)
        if attempt.problem:
            self.refuse(spec, attempt.problem, attempt.damaged)
            return
        if attempt.note:
            print(f"{spec.describe()}: {attempt.note}", flush=True)
        elif attempt.resume is None and (other := spec.other_setting()):
            print(f"{spec.describe()}: {other}; running this setting", flush=True)
        spec.folder.mkdir(parents=True, exist_ok=True)
        run_config = dict(spec.run_config)
        if attempt.resume is not None:
            run_config["resume"] = str(attempt.resume)
            (attempt.resume / MARKER).unlink(missing_ok=True)  # running again
        elif spec.own_state_dir and spec.state_dir is not None:
            shutil.rmtree(spec.state_dir / "runs", ignore_errors=True)  # nothing resumes it
        self.before = set(spec.run_folders())
        self.spec, self.current = spec, attempt.resume
        self.confirmed = attempt.resume is not None
        self.progress.start(spec, attempt.after_round)
        config_file = write_run_config(run_config, spec.folder)
        log_path = spec.folder / FLWR_LOG
        last, boundary = -1, None
        polling = superlink.run_polling(str(config_file), spec.clients, log_path,
                                        self.poll_seconds)  # fmt: skip
        try:
            for _ in polling:
                self.find_run_folder()
                rounds = checkpoint_round(self.current)
                if rounds != last:
                    self.progress.observe(rounds)
                    print(self.progress.line(index, self.total, spec, rounds), flush=True)
                    self.rounds_run += max(0, rounds - max(last, attempt.after_round))
                    last = rounds
                if boundary is None and self.limits.time_up():
                    boundary = rounds  # stop once the round in progress is checkpointed
                if boundary is not None and boundary < rounds < spec.num_rounds:
                    raise Stop("stopped by --max-minutes", EXIT_TIME_UP)
                # After the last round the run is ending: let it write ``completed``.
        finally:
            polling.close()  # ends `flwr run` at once, also when stopped mid-run
            config_file.unlink(missing_ok=True)
        rounds = checkpoint_round(self.current)
        self.rounds_run += max(0, rounds - max(last, attempt.after_round))
        self.progress.close(spec, rounds)
        self.spec, self.current, self.confirmed = None, None, False
        spec.result = spec.finished_results()
        if spec.result is None:
            print(f"run failed: {spec.describe()}: {spec.failure()}", file=sys.stderr)
            return
        if spec.own_state_dir and spec.state_dir is not None:
            shutil.rmtree(spec.state_dir, ignore_errors=True)  # only a resume would need it
        print(f"done: {done_line(spec)}", flush=True)

    def refuse(self, spec: RunSpec, problem: str, damaged: bool = False) -> None:
        """Name a run that cannot go on, and why; it stays unfinished. ``damaged``: its
        folder cannot be trusted, which a plain rerun does not change."""
        spec.problem, spec.damaged = problem, damaged
        print(f"not run: {spec.describe()}: {problem}", file=sys.stderr, flush=True)
        self.progress.close(spec, 0)

    def mark_stopped(self, stop: Stop) -> None:
        """Note in the run folder in progress that the runner stopped it, so that the
        ``failed`` status the ServerApp may write on its way out reads as resumable."""
        self.find_run_folder()
        if self.spec is not None and self.current is not None:
            write_marker(self.current, stopped=stop.reason)

    def write_stopped(self, stop: Stop) -> None:
        """Say in the results.json of the run in progress that the runner stopped it
        (status ``stopped``), so that a report does not take it for a run still going."""
        if self.spec is not None and self.current is not None:
            mark_stopped(self.current, stop.reason, checkpoint_round(self.current))

    def report_stop(self, stop: Stop) -> None:
        """Where the grid stands, once the SuperLink and the simulation are stopped."""
        where = ""
        rounds = checkpoint_round(self.current) if self.current is not None else 0
        if self.spec is not None and rounds > 0:
            where = (
                f"; {self.spec.describe()} stopped after round {rounds}/{self.spec.num_rounds}"
                f" (checkpoint in {self.current})"
            )
        elif self.spec is not None:  # its folder holds no checkpoint: it starts anew
            where = (f"; {self.spec.describe()} stopped before its first checkpoint (the "
                     "next run of this command starts it anew)")  # fmt: skip
        done = self.progress.done(checkpoint_round(self.current) if self.spec else 0)
        print(
            f"{stop.reason}{where}; grid {done}/{self.progress.total_rounds} rounds done",
            file=sys.stderr,
            flush=True,
        )


def done_line(spec: RunSpec) -> str:
    """A finished run's best figures, its status, and which P it is."""
    result = spec.result or {}
    personal, answered = personal_figure(result)
    best_global = _fraction(result.get("best_global_accuracy"))
    return (
        f"{spec.describe()} | {run_status(result)} | best global {best_global}"
        f" | best personal {_fraction(personal)}"
        + (" (over the clients that answered)" if answered else "")
    )


def _fraction(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def failure_report(specs: list[RunSpec]) -> str:
    """Each run without a finished results.json: its name, folder and error, the runs a
    rerun retries apart from those it leaves alone (a folder that cannot be trusted)."""
    unfinished = [s for s in specs if s.result is None]
    retried = [s for s in unfinished if not s.damaged]
    damaged = [s for s in unfinished if s.damaged]
    lines = []
    if retried:
        lines.append(f"{len(retried)} of {len(specs)} runs failed or were not run (run again "
                     "to retry them, once what is named is mended):")  # fmt: skip
        lines += [f"  {s.describe()}: {s.failure()}" for s in retried]
    if damaged:
        lines.append(f"{len(damaged)} of {len(specs)} runs left alone as they stand (a rerun "
                     "leaves them alone too; --restart-damaged starts each anew in a fresh "
                     "folder):")  # fmt: skip
        lines += [f"  {s.describe()}: {s.failure()}" for s in damaged]
    return "\n".join(lines)


# ------------------------------------------------------------------- results
@dataclass(frozen=True)
class CellSummary:
    """A cell's figures over its finished seeds, and how many of them are degraded."""

    experiment: str
    cell: dict[str, Any]
    global_accuracies: tuple[float, ...]
    personal_accuracies: tuple[float, ...]
    seeds: int  # planned
    finished: int  # seeds with a finished run (completed or degraded)
    degraded: int = 0  # finished seeds whose run was degraded
    answered_only: int = 0  # personal figures over the clients that answered, not all

    @property
    def complete(self) -> bool:
        return self.finished == self.seeds


def summarize(specs: list[RunSpec]) -> list[CellSummary]:
    """Best global / best personal accuracy of each cell, over its finished seeds; a
    degraded run's P is its all-client figure where it has one, else the one over the
    clients that answered (counted in ``answered_only``, so the table can mark it)."""
    groups: dict[tuple[str, str], list[RunSpec]] = {}
    for spec in specs:
        groups.setdefault((spec.experiment, cell_id(spec.cell)), []).append(spec)
    summaries = []
    for runs in groups.values():
        finished = [r.result for r in runs if r.result is not None]
        personal = [personal_figure(r) for r in finished]
        summaries.append(
            CellSummary(
                experiment=runs[0].experiment,
                cell=runs[0].cell,
                global_accuracies=tuple(
                    r["best_global_accuracy"]
                    for r in finished
                    if r.get("best_global_accuracy") is not None
                ),
                personal_accuracies=tuple(p for p, _ in personal if p is not None),
                seeds=len(runs),
                finished=len(finished),
                degraded=sum(run_status(r) == DEGRADED for r in finished),
                answered_only=sum(answered for _, answered in personal),
            )
        )
    return summaries


def markdown_table(summaries: list[CellSummary]) -> str:
    """One row per cell: its grid values, G and P as mean ± std over seeds; figures with
    degraded runs in them are marked (footnotes under the table), so that a P over the
    clients that answered never passes for the all-client one."""
    keys = list(dict.fromkeys(k for s in summaries for k in s.cell))
    header = ["experiment", *keys, "G (best global %)", "P (best personal %)", "seeds"]
    rows = [
        [
            s.experiment,
            *(str(s.cell.get(k, "")) for k in keys),
            of_seeds(
                marked(mean_std(s.global_accuracies), s.degraded > 0),
                len(s.global_accuracies),
                s.finished,
            ),
            of_seeds(
                marked(mean_std(s.personal_accuracies), s.degraded > 0, s.answered_only > 0),
                len(s.personal_accuracies),
                s.finished,
            ),
            f"{s.finished}/{s.seeds}" + (f" ({s.degraded} degraded)" if s.degraded else ""),
        ]
        for s in summaries
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return footnotes("\n".join(lines))


# ----------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fedreg-experiment",
        description="Run config files x algorithms x seeds in Flower's simulation; "
        "resumable; prints mean ± std over seeds.",
        epilog="Exit status: 0 every run finished; 1 some run failed or cannot be resumed; "
        "2 bad arguments or config; 3 stopped by --max-minutes; 4 another runner is using "
        "--out; 130/143 stopped by SIGINT/SIGTERM. After 3, 130 or 143 the same command "
        "continues where it stopped.",
    )
    parser.add_argument("configs", nargs="+", type=Path, help="config files (configs/*.toml)")
    parser.add_argument("--seeds", help="seeds per cell: n runs seeds 0..n-1; 1-2 or 0,3 "
                        "runs those seeds (default: the file's number)")  # fmt: skip
    parser.add_argument("--algos", help="comma-separated algorithms (default: the file's)")
    parser.add_argument("--variants", help="comma-separated variant names: run only these "
                        "of each file's [experiment.variants] (default: all)")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a run-config key in every run (repeatable)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("experiments"), help="results root")
    parser.add_argument("--dry-run", action="store_true",
                        help="list the runs, each with what a run of the same command would do "
                        "(finished, resume after round N, start), and stop")  # fmt: skip
    parser.add_argument("--max-minutes", type=float, metavar="N",
                        help="stop at the first round boundary after N minutes (at least one "
                        "round is run); exit status 3; the same command continues")  # fmt: skip
    parser.add_argument("--restart-damaged", action="store_true",
                        help="start runs whose checkpoint cannot be trusted anew, in a fresh "
                        "folder (default: name them and leave them alone)")  # fmt: skip
    add_resource_arguments(parser)
    args = parser.parse_args(argv)
    if args.max_minutes is not None and not args.max_minutes >= 0:
        parser.error(f"--max-minutes={args.max_minutes} is not allowed: expected >= 0")
    resources = resources_of(args, parser)

    declared = declared_run_config()
    _once.cache_clear()  # data read by an earlier invocation in this process may differ now
    try:
        seeds = None if args.seeds is None else seed_numbers(args.seeds)
        overrides = declared_overrides(args.set, declared)
        experiments = [Experiment.load(path, declared) for path in args.configs]
        algos = names_list("--algos", args.algos)
        variants = names_list("--variants", args.variants)
        specs = plan(experiments, args.out, declared, overrides, seeds, algos, variants)
    except (ConfigError, OSError, tomllib.TOMLDecodeError) as err:
        parser.error(str(err))
    except UnicodeDecodeError as err:
        parser.error(f"a config file is not UTF-8 text ({err})")
    if args.dry_run:
        print(dry_run(specs, declared))
        return 0
    deadline = None if args.max_minutes is None else time.monotonic() + 60 * args.max_minutes
    limits = Limits(deadline, args.restart_damaged)
    try:
        with exclusive_out(args.out), stop_on_signals():
            run_all(specs, args.out / SUPERLINK_HOME, limits=limits, declared=declared,
                    resources=resources)  # fmt: skip
    except FolderInUseError as busy:
        print(f"fedreg-experiment: {busy}", file=sys.stderr, flush=True)
        return EXIT_BUSY
    except Stop as stop:
        finished = sum(s.result is not None for s in specs)
        again = shlex.join(["fedreg-experiment", *(sys.argv[1:] if argv is None else argv)])
        print(
            f"{finished} of {len(specs)} runs finished; every other run is resumable. "
            f"Continue with the same command:\n  {again}",
            file=sys.stderr,
            flush=True,
        )
        return stop.exit_code
    return finish(specs, args.out, [e.paper for e in experiments if e.paper])


def finish(specs: list[RunSpec], out: Path, papers: Sequence[PaperCells] = ()) -> int:
    """Summary table and report over the finished runs, then the failed ones by name:
    exit status 1 if any run has no finished results, so that scripts and CI notice."""
    table = markdown_table(summarize(specs))
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(table + "\n")
    print(table)
    if any(s.result is not None for s in specs):
        for path in write_report(out, out / "report", papers=papers):
            print(f"wrote {path}")
    if any(s.result is None for s in specs):
        print(failure_report(specs), file=sys.stderr)
        return EXIT_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
