"""The attack table: for each algorithm, attack and share of liars, each aggregation
rule's final and best G and P beside the honest run of the same rule, from the records
of ``configs/attacks_fmnist_cpu*.toml`` (finished runs only; a cell not run yet is "–").

    python benchmarks/attack_table.py results/attacks_fmnist_cpu

Ends with one summary line: how many attacked runs, and under each rule the mean drop of
the final G from its honest run.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

from fedreg_app.core.robustness import AGGREGATIONS
from fedreg_app.core.robustness import ATTACKS as ATTACK_KEYS
from fedreg_tools.run_records import CELL_SEPARATOR, RunResult, collect

ATTACKS = tuple(attack for attack in ATTACK_KEYS if attack != "none")


def cell_settings(cell: str) -> dict[str, str]:
    """``fedreg__attack-fraction-0.2__aggregation-mean__variant-scale`` ->
    {algo, attack-fraction, aggregation, variant}."""
    algo, *parts = cell.split(CELL_SEPARATOR)
    settings = {"algo": algo, "variant": "honest"}
    for part in parts:
        for key in ("attack-fraction", "aggregation", "variant"):
            if part.startswith(key + "-"):
                settings[key] = part[len(key) + 1 :]
    return settings


def final_and_best(document: dict[str, Any], field: str) -> tuple[float, float] | None:
    values = [r[field] for r in document.get("rounds", []) if r.get(field) is not None]
    return (values[-1], max(values)) if values else None


def figure(run: RunResult | None, field: str) -> str:
    pair = None if run is None else final_and_best(run.document, field)
    return "–" if pair is None else f"{100 * pair[0]:.1f} / {100 * pair[1]:.1f}"


def main() -> None:
    root = Path(sys.argv[1])
    runs = {}
    for run in collect(root):
        s = cell_settings(run.cell)
        # an honest cell is one row whatever share its grid names (no one lies in it)
        fraction = None if s["variant"] == "honest" else s.get("attack-fraction")
        runs[(s["algo"], s["variant"], fraction, s.get("aggregation", "mean"))] = run
    algos = sorted({key[0] for key in runs}, key=lambda a: ("fedreg", "fedavg", "fedrod").index(a)
                   if a in ("fedreg", "fedavg", "fedrod") else 9)  # fmt: skip
    fractions = sorted({key[2] for key in runs if key[2] is not None})
    # a column per rule that has a run, in the key's order
    rules = [rule for rule in AGGREGATIONS if any(key[3] == rule for key in runs)]
    header = (
        ["algo", "attack", "liars"]
        + [f"{rule} G" for rule in rules]
        + [f"{rule} P" for rule in rules]
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    drops: dict[str, list[float]] = {rule: [] for rule in rules}
    attacked = 0
    for algo in algos:
        rows = [("honest", None)] + [(a, f) for f in fractions for a in ATTACKS]
        for attack, fraction in rows:
            chosen = [runs.get((algo, attack, fraction, rule)) for rule in rules]
            if not any(chosen):
                continue
            cells = [figure(r, "global_accuracy") for r in chosen]
            cells += [figure(r, "personal_accuracy") for r in chosen]
            share = "0 %" if fraction is None else f"{100 * float(fraction):.0f} %"
            print(f"| {algo} | {attack} | {share} | " + " | ".join(cells) + " |")
            for rule, run in zip(rules, chosen, strict=True):
                honest = runs.get((algo, "honest", None, rule))
                if attack == "honest" or run is None or honest is None:
                    continue
                attacked += 1
                ours = final_and_best(run.document, "global_accuracy")
                base = final_and_best(honest.document, "global_accuracy")
                if ours and base:
                    drops[rule].append(100 * (base[0] - ours[0]))
    print()
    print("Each cell: final / best accuracy over the 10 rounds, percent (G global, P personal).")
    summary = " ".join(
        f"drop_final_G_{rule}={statistics.fmean(values):.1f}"
        for rule, values in drops.items() if values
    )  # fmt: skip
    print(f"attack_table: attacked_runs={attacked} {summary}")


if __name__ == "__main__":
    main()
