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
replies were missing) is skipped, so an interrupted grid resumes where it stopped. A
``failed`` run, or one that left no ``results.json``, is run again next time; the runner
lists such runs at the end and exits non-zero. The summary table marks degraded figures.

    fedreg-experiment configs/smoke.toml --seeds 3 --algos fedreg,fedavg \\
        --set dataset-path=../shared/data/fashion_mnist
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import tempfile
import textwrap
import time
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedreg_app.config import ConfigError
from fedreg_app.launcher import LocalSuperLink
from fedreg_app.overrides import check_declared, declared_overrides, declared_run_config
from fedreg_app.registry import load_config
from fedreg_app.reports import (
    DEGRADED,
    FINISHED,
    footnotes,
    marked,
    mean_std,
    personal_figure,
    run_status,
    write_report,
)

EXPERIMENT_TABLE = "experiment"


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

    @classmethod
    def load(cls, path: Path, declared: dict[str, Any]) -> Experiment:
        document = tomllib.loads(path.read_text())
        meta = document.pop(EXPERIMENT_TABLE, {})
        variant_keys = {k for v in meta.get("variants", {}).values() for k in v}
        used = set(document) | set(meta.get("grid", {})) | variant_keys
        check_declared(used, declared, f"run config (in {path})")
        experiment = cls(
            name=str(meta.get("name", path.stem)),
            clients=int(meta.get("clients", 20)),
            algos=tuple(meta.get("algos", [document.get("algo", declared["algo"])])),
            seeds=int(meta.get("seeds", 1)),
            grid={k: list(v) for k, v in meta.get("grid", {}).items()},
            run_config=document,
            variants={str(k): dict(v) for k, v in meta.get("variants", {}).items()},
        )
        if experiment.clients < 1 or experiment.seeds < 1:
            raise ConfigError(f"{path}: [experiment] clients and seeds must be >= 1")
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
    result: dict[str, Any] | None = field(default=None, repr=False)

    def _documents(self) -> list[tuple[Path, dict[str, Any]]]:
        """Every run's results in this folder, oldest first (run folders sort by time); an
        unreadable file reads as a failed run, so that it is run again."""
        documents = []
        for path in sorted(self.folder.glob("*/results.json")):
            try:
                documents.append((path, json.loads(path.read_text())))
            except (OSError, json.JSONDecodeError) as err:
                documents.append((path, {"run": {"status": "failed", "error": str(err)}}))
        return documents

    def finished_results(self) -> dict[str, Any] | None:
        """The newest finished run's results (completed or degraded), if any: such a run
        is not run again (a degraded one would most likely degrade again, and its figures
        are kept, marked)."""
        finished = [d for _, d in self._documents() if run_status(d) in FINISHED]
        return finished[-1] if finished else None

    def failure(self) -> str:
        """Why this seed has no finished run: the newest run's folder, status and error."""
        documents = self._documents()
        if not documents:
            return f"no results.json in {self.folder}; see {self.folder / 'flwr.log'}"
        path, document = documents[-1]
        run = document.get("run", {})
        status = run.get("status") or "no status"
        if status == "running":
            status = "still 'running' when flwr run ended (the ServerApp was stopped)"
        error = "\n" + textwrap.indent(f"error: {run['error']}", "    ") if run.get("error") else ""
        return f"{path.parent} ({status}){error}"

    def rounds_done(self) -> int:
        """Rounds written by the run in progress (the newest run folder)."""
        paths = sorted(self.folder.glob("*/results.json"))
        if not paths:
            return 0
        try:
            return len(json.loads(paths[-1].read_text())["rounds"])
        except (json.JSONDecodeError, KeyError):
            return 0

    def describe(self) -> str:
        extras = " ".join(f"{k}={v}" for k, v in self.cell.items() if k != "algo")
        return f"{self.experiment} {self.cell['algo']} {extras} seed {self.seed}".replace("  ", " ")


def plan(
    experiments: Iterable[Experiment],
    out: Path,
    declared: dict[str, Any],
    overrides: dict[str, Any],
    seeds: int | None = None,
    algos: tuple[str, ...] | None = None,
) -> list[RunSpec]:
    """All runs, validated before any starts (a bad value fails the whole plan). Seed-major:
    every cell's first seed comes first, so a partially finished grid already compares."""
    specs = []
    for experiment in experiments:
        if algos:
            experiment = Experiment(**{**experiment.__dict__, "algos": algos})
        for seed, cell in itertools.product(range(seeds or experiment.seeds), experiment.cells()):
            specs.append(run_spec(experiment, cell, seed, out, declared, overrides))
    return specs


def run_spec(
    experiment: Experiment,
    cell: dict[str, Any],
    seed: int,
    out: Path,
    declared: dict[str, Any],
    overrides: dict[str, Any],
) -> RunSpec:
    folder = out / experiment.name / cell_id(cell) / f"seed{seed}"
    run_config = {
        **experiment.run_config,
        **experiment.variants.get(cell.get("variant"), {}),
        **{k: v for k, v in cell.items() if k != "variant"},
        **overrides,
        "seed": seed,
        "results-dir": str(folder.resolve()),
    }
    if run_config.get("dataset-path"):  # the ServerApp runs in another working directory
        run_config["dataset-path"] = str(Path(run_config["dataset-path"]).resolve())
    config = load_config({**declared, **run_config})
    return RunSpec(
        experiment.name, cell, seed, run_config, folder, experiment.clients,
        config.num_server_rounds,
    )  # fmt: skip


def write_run_config(run_config: dict[str, Any], directory: Path) -> Path:
    """A flat TOML file for ``flwr run --run-config FILE``."""
    lines = [f"{key} = {toml_value(value)}" for key, value in run_config.items()]
    path = Path(tempfile.mkstemp(suffix=".toml", dir=directory)[1])
    path.write_text("\n".join(lines) + "\n")
    return path


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string


class Progress:
    """Runs and rounds done, elapsed time and an estimate of the time left."""

    def __init__(self, specs: list[RunSpec], write: Callable[[str], None] = print) -> None:
        self.total_rounds = sum(s.num_rounds for s in specs)
        self.rounds_before = 0
        self.started = time.monotonic()
        self.rounds_at_start = 0
        self.write = write

    def skip(self, spec: RunSpec) -> None:
        self.rounds_before += spec.num_rounds
        self.rounds_at_start += spec.num_rounds

    def line(self, index: int, total: int, spec: RunSpec, rounds_in_run: int) -> str:
        done = self.rounds_before + rounds_in_run
        elapsed = time.monotonic() - self.started
        fresh = done - self.rounds_at_start
        left = (self.total_rounds - done) * elapsed / fresh if fresh > 0 else math.nan
        return (
            f"[run {index}/{total} | round {rounds_in_run}/{spec.num_rounds}] {spec.describe()}"
            f" | elapsed {_clock(elapsed)} | left ~{_clock(left)}"
        )


def _clock(seconds: float) -> str:
    if math.isnan(seconds):
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def run_all(specs: list[RunSpec], home: Path, poll_seconds: float = 5.0) -> list[RunSpec]:
    """Run what is not finished yet, one run at a time, through one SuperLink; returns the
    runs that are still not finished (failed, or no results.json)."""
    progress = Progress(specs)
    pending = []
    for spec in specs:
        spec.result = spec.finished_results()
        if spec.result is not None:
            progress.skip(spec)
        else:
            pending.append(spec)
    print(
        f"{len(specs) - len(pending)} of {len(specs)} runs already finished; {len(pending)} to run"
    )
    if not pending:
        return []
    with LocalSuperLink(home) as superlink:
        for index, spec in enumerate(pending, start=len(specs) - len(pending) + 1):
            spec.folder.mkdir(parents=True, exist_ok=True)
            config_file = write_run_config(spec.run_config, spec.folder)
            log_path = spec.folder / "flwr.log"
            last = -1
            for _ in superlink.run_polling(str(config_file), spec.clients, log_path, poll_seconds):
                rounds = spec.rounds_done()
                if rounds != last:
                    print(progress.line(index, len(specs), spec, rounds), flush=True)
                    last = rounds
            config_file.unlink(missing_ok=True)
            spec.result = spec.finished_results()
            progress.rounds_before += spec.num_rounds
            if spec.result is None:
                print(f"run failed: {spec.describe()}: {spec.failure()}", file=sys.stderr)
            else:
                print(f"done: {done_line(spec)}", flush=True)
    return [s for s in specs if s.result is None]


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
    """Each run without a finished results.json: its name, folder and error."""
    failed = [s for s in specs if s.result is None]
    lines = [f"{len(failed)} of {len(specs)} runs failed (run again to retry them):"]
    lines += [f"  {s.describe()}: {s.failure()}" for s in failed]
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
            marked(mean_std(s.global_accuracies), s.degraded > 0),
            marked(mean_std(s.personal_accuracies), s.degraded > 0, s.answered_only > 0),
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
    )
    parser.add_argument("configs", nargs="+", type=Path, help="config files (configs/*.toml)")
    parser.add_argument("--seeds", type=int, help="seeds per cell (default: the file's)")
    parser.add_argument("--algos", help="comma-separated algorithms (default: the file's)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a run-config key in every run (repeatable)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("experiments"), help="results root")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and stop")
    args = parser.parse_args(argv)

    declared = declared_run_config()
    try:
        overrides = declared_overrides(args.set, declared)
        experiments = [Experiment.load(path, declared) for path in args.configs]
        algos = tuple(a.strip() for a in args.algos.split(",")) if args.algos else None
        specs = plan(experiments, args.out, declared, overrides, args.seeds, algos)
    except (ConfigError, OSError, tomllib.TOMLDecodeError) as err:
        parser.error(str(err))
    if args.dry_run:
        for spec in specs:
            print(f"{spec.describe()} -> {spec.folder}")
        return 0
    run_all(specs, args.out / ".flwr_home")
    return finish(specs, args.out)


def finish(specs: list[RunSpec], out: Path) -> int:
    """Summary table and report over the finished runs, then the failed ones by name:
    exit status 1 if any run has no finished results, so that scripts and CI notice."""
    table = markdown_table(summarize(specs))
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(table + "\n")
    print(table)
    if any(s.result is not None for s in specs):
        for path in write_report(out, out / "report"):
            print(f"wrote {path}")
    if any(s.result is None for s in specs):
        print(failure_report(specs), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
