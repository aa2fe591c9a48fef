"""The report's figures, drawn with matplotlib into PNG files: accuracy per round for
each cell (mean over seeds with a band of one standard deviation), the paper's Figure 7
(log10(g/p) against the number of clients) and its Figure 4 (each client's class counts,
original and rebalanced), with the numbers behind them. Apart from the tables so that
text reports never need matplotlib; it is imported only when a figure is drawn
(:func:`pyplot`), so that `fedreg-report --help` and a wrong argument answer at once.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedreg_tools.paper_cells import PaperCells
from fedreg_tools.report_tables import SHARED_KEYS
from fedreg_tools.round_tables import PERSONAL_FIGURES, personal_metric
from fedreg_tools.run_records import (
    CELL_SEPARATOR,
    DEGRADED_MARK,
    UNFINISHED_MARK,
    RunResult,
    by_key,
)


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
    personal_name = {"all": "personal models", "sampled": "personal models (trained clients)"}
    personal_name = personal_name.get(personal, f"personal models, {PERSONAL_FIGURES[personal][1]}")
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
