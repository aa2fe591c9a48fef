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
or not); ``--personal client-mean``, ``worst`` and ``bottom-decile`` show the clients'
unweighted mean, the lowest client and the lowest tenth instead (records that predate
these fields give them from their ``client_accuracies``). Plots:

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
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedreg_app.core.config import ConfigError
from fedreg_tools.cell_tables import cells_table
from fedreg_tools.overrides import declared_overrides, declared_run_config
from fedreg_tools.paper_cells import PaperCells, read_paper_cells
from fedreg_tools.report_plots import (
    plot_accuracy_curves,
    plot_class_distribution,
    plot_log_ratio_vs_clients,
    rebalance_summary,
)
from fedreg_tools.report_tables import (
    cost_table,
    differing_settings,
    paper_comparison,
    paper_table,
    provenance_table,
    run_table,
)
from fedreg_tools.round_tables import GLOBAL, PERSONAL_FIGURES, personal_metric, rounds_report
from fedreg_tools.run_records import CELL_SEPARATOR, by_key, is_run, read_runs, scan_roots

# torch, the data and the algorithms (fedreg_app.registry), and matplotlib are imported
# where they are used: `fedreg-report --help` and a wrong argument answer at once.

#: The personal figures a report can show: every client's (the sources'), or only those
#: of the clients that had trained at least once.
DEFAULT_VERSUS = "fedreg"  # rounds.md's reference cell: the product's method


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
        "--personal", choices=list(PERSONAL_FIGURES), default="all",
        help="personal figure shown: over all clients (default, as the sources), over the "
        "clients that had trained at least once (sampled), or the per-client mean, the "
        "worst client or the bottom decile",
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
