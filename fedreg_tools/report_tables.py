"""The markdown tables of a report: the paper's layout (``table.md``: mean ± std over
seeds, with the marks their footnotes explain), the settings that differ between the
cells of one experiment, our figures beside the published ones, the costs
(``costs.md``), each run's provenance (``runs.md``), and the table of runs reported on
their own. Text only, from the records :mod:`fedreg_tools.run_records` read: nothing
heavy is imported, so the runner writes its summaries with the same functions. The
round-by-round and per-cell comparisons are :mod:`fedreg_tools.round_tables` and
:mod:`fedreg_tools.cell_tables`.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from typing import Any

from fedreg_app.core.environment import client_devices
from fedreg_app.core.figures import CLIENT_FIGURES, LAST_ROUNDS, client_figures
from fedreg_app.core.metrics import FAILED, first_line
from fedreg_tools.cell_tables import final_clients
from fedreg_tools.paper_cells import PaperCells
from fedreg_tools.round_tables import GLOBAL, personal_metric, personal_note
from fedreg_tools.run_records import (
    ANSWERED_MARK,
    CELL_SEPARATOR,
    DEGRADED_MARK,
    UNFINISHED,
    UNFINISHED_MARK,
    RunResult,
    by_key,
    fault_kinds,
    personal_figure,
    round_seconds,
    run_status,
)

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
    return table if personal == "all" else f"{table}\n\n{personal_note(personal)} (best round)"


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


# --------------------------------------------------------- one run on its own
RUN_NOTE = (
    f"best: the highest figure, with its round; final: the last evaluated round's; last "
    f"{LAST_ROUNDS}: the mean over the last {LAST_ROUNDS} evaluated rounds (over all of them "
    f"where fewer were evaluated). P is weighted by the clients' test samples; *P per "
    f"client*, *worst*, *bottom 10%*: at the last round that evaluated every client, the "
    f"unweighted mean of the clients' personal accuracies, the lowest one and the mean of "
    f"the lowest tenth. Percent."
)
RUN_DEGRADED_NOTE = (
    "In a degraded run's rounds with missing replies, P is over the clients that answered "
    "(as in the curves)."
)


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
    """What a run's status says, for the lines under its table; a degraded run's with
    what kind of fault degraded it."""
    status = run_status(run.document)
    if status in UNFINISHED:
        return run.state
    if status == FAILED:
        return f"failed: {first_line(run.document['run'].get('error') or '')}"
    if run.degraded and (kinds := fault_kinds(run.document)):
        return f"degraded: {kinds}"
    return status or "no status recorded"


def run_table(runs: Sequence[RunResult], personal: str = "all") -> str:
    """One line per run, whatever its status: its best, final and last-rounds mean of G
    and P, with its rounds done; under it, each run's file and what its status says."""
    p = "P" if personal == "all" else f"P {personal}"
    header = (
        ["run", "status", "rounds"]
        + [f"{m} {f}" for m in ("G", p) for f in ("best", "final", f"last {LAST_ROUNDS}")]
        + ["P per client", "worst", "bottom 10%"]
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in runs:
        g = run_figures(run, GLOBAL)
        p_values = [
            marked(text, run.degraded)
            for text in run_figures(run, personal_metric(personal), run.degraded)
        ]
        spread = client_figures(final_clients(run))
        tails = [_percent(spread[name]) for name in CLIENT_FIGURES]
        cells = [run.cell, run_status(run.document) or "–", run.progress, *g, *p_values, *tails]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [RUN_NOTE] + ([RUN_DEGRADED_NOTE] if any(r.degraded for r in runs) else [])
    if personal != "all":
        notes.append(personal_note(personal))
    where = [f"- {run.cell}: {run.folder / 'results.json'}; {run_state(run)}" for run in runs]
    return "\n\n".join([footnotes("\n".join(lines)), *notes, "\n".join(where)])
