"""The runner's plan: a config file's ``[experiment]`` table read and checked
(:class:`Experiment`), the command line's seeds and names parsed, and every run of the grid
laid out as a :class:`RunSpec` (its cell, seed, validated run config and seed folder),
refused as a whole before any run starts when a value is bad; with what a seed folder holds
(its finished results, why it has none) and the run-config file handed to ``flwr run``. It
sits below the rest of the runner (decisions, progress, session, summary), which all work
on the run specs it makes."""

from __future__ import annotations

import difflib
import itertools
import re
import tempfile
import textwrap
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedreg_app.core.checkpoint import committed_round
from fedreg_app.core.config import (
    INPUT_PATH_KEYS,
    MAX_SEED,
    ConfigError,
    is_count,
    setting_differences,
)
from fedreg_app.core.metrics import FAILED
from fedreg_app.core.protocol import STATE_KEY_PATTERN
from fedreg_tools.launcher import toml_value
from fedreg_tools.overrides import check_declared
from fedreg_tools.paper_cells import PAPER_TABLE, PaperCells
from fedreg_tools.run_records import (
    FINISHED,
    RUNNING,
    cell_problem,
    clients_difference,
    read_document,
    run_order,
    run_status,
)

# The data (fedreg_app.core.data) and the algorithms (fedreg_app.registry) bring torch: they
# are imported where they are used, so that `fedreg-experiment --help` answers at once.

EXPERIMENT_TABLE = "experiment"
#: A run's own client state dir, in its seed folder (algorithms whose clients keep state).
STATE_FOLDER = "state"


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
        from fedreg_app.registry import CATALOG  # the algorithms bring torch: not at start

        return setting_differences(recorded, self.setting, CATALOG) + clients_difference(
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
    from fedreg_app.registry import algorithm_of, load_config

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
    keeps_state = algorithm_of(config).client.keeps_state(config)
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


def checkpoint_round(run_folder: Path | None) -> int:
    """The round of the run folder's committed checkpoint (0 if none can be read)."""
    return 0 if run_folder is None else committed_round(run_folder)
