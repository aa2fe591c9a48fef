"""The runner's account at the end: each finished run's line, the failed and refused
runs by name and why, and the summary table of mean ± std over seeds per cell (figures with
degraded runs marked), written with the report under ``--out`` (:func:`finish`). Kept
apart from running so that a summary is computed from run specs and their results alone."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedreg_tools.paper_cells import PaperCells
from fedreg_tools.report_tables import footnotes, marked, mean_std, of_seeds
from fedreg_tools.reports import write_report
from fedreg_tools.run_records import DEGRADED, personal_figure, run_status
from fedreg_tools.runner_plan import RunSpec, cell_id

EXIT_FAILED = 1  # some run failed, or its checkpoint cannot be trusted


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
