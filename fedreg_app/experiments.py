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
``<out>/<name>/<cell>/seed<k>/``; a run whose folder already holds a completed
``results.json`` is skipped, so an interrupted grid resumes where it stopped.

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
import time
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedreg_app.config import ConfigError, RunConfig
from fedreg_app.launcher import PROJECT, LocalSuperLink
from fedreg_app.reports import mean_std, write_report

EXPERIMENT_TABLE = "experiment"


def declared_run_config(app: Path = PROJECT) -> dict[str, Any]:
    """The app's run-config keys and defaults, from its pyproject.toml."""
    pyproject = tomllib.loads((app / "pyproject.toml").read_text())
    return pyproject["tool"]["flwr"]["app"]["config"]


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
        unknown = sorted(used - set(declared))
        if unknown:
            raise ConfigError(f"{path}: keys not in [tool.flwr.app.config]: {unknown}")
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
    result: dict[str, Any] | None = field(default=None, repr=False)

    def completed_results(self) -> dict[str, Any] | None:
        """The results of a completed earlier run in this folder, if any."""
        for path in sorted(self.folder.glob("*/results.json")):
            results = json.loads(path.read_text())
            if results.get("run", {}).get("status") == "completed":
                return results
        return None

    def rounds_done(self) -> int:
        """Rounds written by the run in progress (the newest run folder)."""
        paths = sorted(self.folder.glob("*/results.json"))
        if not paths:
            return 0
        try:
            return len(json.loads(paths[-1].read_text())["rounds"])
        except (json.JSONDecodeError, KeyError):
            return 0

    @property
    def num_rounds(self) -> int:
        return int(self.run_config["num-server-rounds"])

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
    RunConfig.from_run_config({**declared, **run_config})
    return RunSpec(experiment.name, cell, seed, run_config, folder, experiment.clients)


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


def run_all(specs: list[RunSpec], home: Path, poll_seconds: float = 5.0) -> None:
    """Run what is not completed yet, one run at a time, through one SuperLink."""
    progress = Progress(specs)
    pending = []
    for spec in specs:
        spec.result = spec.completed_results()
        if spec.result is not None:
            progress.skip(spec)
        else:
            pending.append(spec)
    print(
        f"{len(specs) - len(pending)} of {len(specs)} runs already completed; {len(pending)} to run"
    )
    if not pending:
        return
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
            spec.result = spec.completed_results()
            progress.rounds_before += spec.num_rounds
            if spec.result is None:
                print(f"run failed: {spec.describe()}; see {log_path}", file=sys.stderr)
            else:
                print(
                    f"done: {spec.describe()} | best global "
                    f"{spec.result['best_global_accuracy']:.4f} | best personal "
                    f"{spec.result['best_personal_accuracy']:.4f}",
                    flush=True,
                )


# ------------------------------------------------------------------- results
@dataclass(frozen=True)
class CellSummary:
    experiment: str
    cell: dict[str, Any]
    global_accuracies: tuple[float, ...]
    personal_accuracies: tuple[float, ...]
    seeds: int  # planned

    @property
    def complete(self) -> bool:
        return len(self.global_accuracies) == self.seeds


def summarize(specs: list[RunSpec]) -> list[CellSummary]:
    """Best global / best personal accuracy of each cell, over its completed seeds."""
    groups: dict[tuple[str, str], list[RunSpec]] = {}
    for spec in specs:
        groups.setdefault((spec.experiment, cell_id(spec.cell)), []).append(spec)
    summaries = []
    for runs in groups.values():
        finished = [r.result for r in runs if r.result is not None]
        summaries.append(
            CellSummary(
                experiment=runs[0].experiment,
                cell=runs[0].cell,
                global_accuracies=tuple(r["best_global_accuracy"] for r in finished),
                personal_accuracies=tuple(r["best_personal_accuracy"] for r in finished),
                seeds=len(runs),
            )
        )
    return summaries


def markdown_table(summaries: list[CellSummary]) -> str:
    """One row per cell: its grid values, G and P as mean ± std over seeds."""
    keys = list(dict.fromkeys(k for s in summaries for k in s.cell))
    header = ["experiment", *keys, "G (best global %)", "P (best personal %)", "seeds"]
    rows = [
        [
            s.experiment,
            *(str(s.cell.get(k, "")) for k in keys),
            mean_std(s.global_accuracies),
            mean_std(s.personal_accuracies),
            f"{len(s.global_accuracies)}/{s.seeds}",
        ]
        for s in summaries
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------- CLI
def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs, values read as TOML (bare words as strings)."""
    overrides = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise ConfigError(f"--set {pair!r}: expected key=value")
        try:
            overrides[key] = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            overrides[key] = text
    return overrides


def declared_overrides(pairs: list[str], declared: dict[str, Any]) -> dict[str, Any]:
    """``--set`` pairs, each key one the app declares (flwr rejects any other)."""
    overrides = parse_overrides(pairs)
    unknown = sorted(set(overrides) - set(declared))
    if unknown:
        raise ConfigError(f"--set: keys not in [tool.flwr.app.config]: {unknown}")
    return overrides


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
    table = markdown_table(summarize(specs))
    (args.out / "summary.md").write_text(table + "\n")
    print(table)
    if any(s.result is not None for s in specs):
        for path in write_report(args.out, args.out / "report"):
            print(f"wrote {path}")
    return 0 if all(s.result is not None for s in specs) else 1


if __name__ == "__main__":
    sys.exit(main())
