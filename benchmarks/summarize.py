"""Print a Markdown table of best global / best personal accuracy and seconds per round
from run folders (``results.json``), one row per run, in the order given.

    python benchmarks/summarize.py RESULTS_DIR [RESULTS_DIR ...]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def row(results: dict) -> str:
    rounds = results["rounds"]
    # round 1 also pays the one-time data loading; report the steady state beside it
    per_round = [r["train_seconds"] + r["eval_seconds"] for r in rounds]
    steady = statistics.median(per_round[1:]) if len(per_round) > 1 else per_round[0]
    return (
        f"| {results['config']['algo']} | {100 * results['best_global_accuracy']:.2f} "
        f"| {100 * results['best_personal_accuracy']:.2f} | {steady:.1f} "
        f"| {statistics.median(r['train_seconds'] for r in rounds[1:] or rounds):.1f} "
        f"| {results['run']['status']} |"
    )


def main() -> None:
    print("| algo | best global % | best personal % | s/round (median, r>1) | train s | status |")
    print("|---|---|---|---|---|---|")
    pairs = []
    for folder in sys.argv[1:]:
        for path in sorted(Path(folder).glob("*/results.json")):
            results = json.loads(path.read_text())
            print(row(results))
            pairs.append(summary_pair(results))
    print(f"summarize: runs={len(pairs)} {' '.join(pairs)}")


def summary_pair(results: dict) -> str:
    """``algo=global/personal`` best accuracies in percent, for the one summary line."""

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.2f}"

    return (f"{results['config']['algo']}={pct(results.get('best_global_accuracy'))}"
            f"/{pct(results.get('best_personal_accuracy'))}")  # fmt: skip


if __name__ == "__main__":
    main()
