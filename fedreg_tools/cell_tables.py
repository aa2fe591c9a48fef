"""Each cell over its seeds (``cells.md`` of a report): best and last-rounds mean of G and
P, the difference from a reference cell seed by seed, how the worst clients fare, and,
where runs held clients out (``new-client-fraction``), how the new clients fare.

Why: a cell's best figure alone hides two things a comparison of methods needs. A best
that one lucky round made says less than the mean of the last rounds; and a mean personal
accuracy can rise while the clients at the bottom fall. The difference from the reference
is paired by seed (the same partition and sampled clients), so its spread is that of the
effect, not of the partitions.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from fedreg_app.core.figures import LAST_ROUNDS, NEW_CLIENT_FIGURES, client_figures
from fedreg_tools.round_tables import GLOBAL, RunResult, personal_metric


def mean_std(values: Sequence[float], signed: bool = False) -> str:
    """Percent points, ``mean ± std`` over seeds (sample std; none with one seed)."""
    if not values:
        return "–"
    mean = 100 * statistics.fmean(values)
    text = f"{mean:+.2f}" if signed else f"{mean:.2f}"
    return text if len(values) == 1 else f"{text} ± {100 * statistics.stdev(values):.2f}"


def best_and_last(run: RunResult, metric: str) -> tuple[float, float] | None:
    """A run's best per-round value and the mean of its last :data:`LAST_ROUNDS` values."""
    _, values = run.series(metric)
    if not values:
        return None
    return max(values), statistics.fmean(values[-LAST_ROUNDS:])


def final_clients(run: RunResult) -> list[float]:
    """The clients' personal accuracies at the last round that recorded them all."""
    for record in reversed(run.document.get("rounds", [])):
        accuracies = record.get("client_accuracies")
        if accuracies and record.get("personal_accuracy") is not None:
            return sorted(float(v) for v in accuracies.values())
    return []


def worst_and_bottom_decile(run: RunResult) -> tuple[float, float] | None:
    """The lowest client's personal accuracy and the bottom decile's mean (final round)."""
    clients = final_clients(run)
    if not clients:
        return None
    figures = client_figures(clients)
    return figures["personal_accuracy_worst"], figures["personal_accuracy_bottom_decile"]


def has_new_clients(results: Sequence[RunResult]) -> bool:
    """Whether some run reports held-out new clients."""
    return any(run.series(NEW_CLIENT_FIGURES[0])[1] for run in results)


def last_rounds_mean(run: RunResult, metric: str) -> float | None:
    """The mean of a per-round figure over the last :data:`LAST_ROUNDS` evaluated rounds."""
    _, values = run.series(metric)
    return statistics.fmean(values[-LAST_ROUNDS:]) if values else None


def _column(runs: Sequence[RunResult], figure) -> list[float]:
    return [value for value in map(figure, runs) if value is not None]


def cells_table(results: Sequence[RunResult], reference: str, personal: str = "all") -> str:
    """One row per experiment and cell: best and last-10 mean of G and P, Δ from the
    ``reference`` cell's best G and P seed by seed (seeds both ran), and the final
    round's worst client and bottom decile; all mean ± std over seeds."""
    p_metric = personal_metric(personal)
    header = ["experiment", "cell", "seeds", "G best", "G last 10", "P best", "P last 10",
              f"ΔG best vs {reference}", f"ΔP best vs {reference}", "P worst client",
              "P bottom 10%"]  # fmt: skip
    new_clients = has_new_clients(results)
    if new_clients:
        header += ["new clients P last 10", "new clients G last 10"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    experiments: dict[str, list[RunResult]] = {}
    for run in results:
        experiments.setdefault(run.experiment, []).append(run)
    for experiment, runs in experiments.items():
        cells: dict[str, list[RunResult]] = {}
        for run in runs:
            cells.setdefault(run.cell, []).append(run)
        by_seed = {r.seed: r for r in cells.get(reference, [])}
        for cell, group in cells.items():
            row = [experiment, cell.replace("__", " "), str(len(group))]
            for metric in (GLOBAL, p_metric):
                figures = _column(group, lambda r, m=metric: best_and_last(r, m))
                row += [mean_std([b for b, _ in figures]), mean_std([last for _, last in figures])]
            for metric in (GLOBAL, p_metric):
                deltas = []
                for run in group:
                    other = by_seed.get(run.seed)
                    ours = best_and_last(run, metric)
                    theirs = best_and_last(other, metric) if other is not None else None
                    if ours is not None and theirs is not None:
                        deltas.append(ours[0] - theirs[0])
                row.append(mean_std(deltas, signed=True))
            tails = _column(group, worst_and_bottom_decile)
            row += [mean_std([w for w, _ in tails]), mean_std([d for _, d in tails])]
            if new_clients:
                row += [mean_std(_column(group, lambda r, m=metric: last_rounds_mean(r, m)))
                        for metric in NEW_CLIENT_FIGURES]  # fmt: skip
            lines.append("| " + " | ".join(row) + " |")
    note = (
        f"Percent, mean ± std over seeds. *best*: the highest round; *last {LAST_ROUNDS}*: the "
        f"mean of the last {LAST_ROUNDS} evaluated rounds; *Δ … vs {reference}*: the cell's "
        f"best minus {reference}'s on the same seed; *worst client*, *bottom 10%*: the lowest "
        "client's personal accuracy and the mean of the lowest tenth of the clients at the "
        "last round that evaluated every client."
    )
    if new_clients:
        note += (
            f" *new clients*: the clients held out of training (`new-client-fraction`), "
            f"the mean over the last {LAST_ROUNDS} evaluated rounds of their personal "
            "accuracy after one local round from the global model, and of the global "
            "model's on their test splits."
        )
    return "\n".join(lines) + "\n\n" + note + "\n"
