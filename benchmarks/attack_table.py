"""The attack table: for each algorithm, attack and share of liars, each aggregation
rule's final and best G and P beside the honest run of the same rule, from the records
of ``configs/attacks_fmnist_cpu*.toml`` (finished runs only; a cell not run yet is "–").

    python benchmarks/attack_table.py results/attacks_fmnist_cpu --dataset-path PATH

G is the global model on every client's test split (a liar's test split is honest data).
P is over the clients that do not lie: a liar's own model is of its lie (a label flipper's
scores near 0 on its true labels), and counting it would charge the defences with what
no server can prevent. Records that predate ``personal_accuracy_honest`` get it from
their ``client_accuracies`` weighted by the clients' test samples, which
``--dataset-path`` (the records' data) gives; without it those cells are "–".

A second table sets the final figures against the honest run of the default rule (the
plain average) over the same clients; a third, for the cells run on more than one seed,
gives mean ± std over the seeds. The first two show one seed (``--seed``, 0). Ends with
one summary line (of the seed shown): how many attacked
runs, and under each rule the mean drop of the final G and honest-client P from the
rule's own honest run.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from pathlib import Path
from typing import Any

from fedreg_app.core.robustness import AGGREGATIONS, attackers
from fedreg_app.core.robustness import ATTACKS as ATTACK_KEYS
from fedreg_tools.run_records import CELL_SEPARATOR, RunResult, collect

ATTACKS = tuple(attack for attack in ATTACK_KEYS if attack != "none")
ORDER = ("fedreg", "fedavg", "fedrod")
DEFAULT_RULE = "mean"


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


def final_and_best(values: list[float | None]) -> tuple[float, float] | None:
    present = [v for v in values if v is not None]
    return (present[-1], max(present)) if present else None


def test_sizes(document: dict[str, Any], dataset_path: str) -> dict[int, int]:
    """Each partition's test samples, from the seeded partitioning the run used."""
    from fedreg_app.core.data import PartitionKey  # the data bring torch
    from fedreg_app.registry import load_config

    config = load_config({**document["config"], "dataset-path": dataset_path})
    return partition_test_sizes(
        PartitionKey.from_config(config, int(document["run"]["num_clients"]))
    )


@functools.cache
def partition_test_sizes(key: Any) -> dict[int, int]:
    from fedreg_app.core.data import split_sizes

    return {p: test for p, (_, test) in split_sizes(key).items()}


def liars_of(run: RunResult) -> frozenset[int]:
    """The partitions that lied in ``run`` (its config read once per distinct config)."""
    config = json.dumps(run.document["config"], sort_keys=True)
    return liars_of_config(config, int(run.document["run"]["num_clients"]))


@functools.cache
def liars_of_config(config: str, num_clients: int) -> frozenset[int]:
    from fedreg_app.registry import load_config

    return attackers(load_config(json.loads(config)), num_clients)


def honest_personal(
    run: RunResult, liars: frozenset[int], dataset_path: str | None
) -> list[float | None]:
    """Per round, P over the clients not in ``liars``: recorded by the run where the
    liars are its own, else from its client accuracies and test sizes (None without)."""
    document = run.document
    if (
        liars == liars_of(run)
        and liars
        and any("personal_accuracy_honest" in r for r in document["rounds"])
    ):
        return [r.get("personal_accuracy_honest") for r in document["rounds"]]
    if not liars:
        return [r.get("personal_accuracy") for r in document["rounds"]]
    if dataset_path is None:
        return [None for _ in document["rounds"]]
    sizes = test_sizes(document, dataset_path)
    figures: list[float | None] = []
    for record in document["rounds"]:
        accuracies = record.get("client_accuracies")
        if record.get("personal_accuracy") is None or not accuracies:
            figures.append(None)
            continue
        honest = {int(p): a for p, a in accuracies.items() if int(p) not in liars}
        total = sum(sizes[p] for p in honest)
        figures.append(sum(a * sizes[p] for p, a in honest.items()) / total if total else None)
    return figures


def cell(pair: tuple[float, float] | None) -> str:
    return "–" if pair is None else f"{100 * pair[0]:.1f} / {100 * pair[1]:.1f}"


def global_figures(run: RunResult | None) -> tuple[float, float] | None:
    if run is None:
        return None
    return final_and_best([r.get("global_accuracy") for r in run.document["rounds"]])


def delta(ours: tuple[float, float] | None, base: tuple[float, float] | None) -> float | None:
    return None if ours is None or base is None else 100 * (ours[0] - base[0])


def signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1f}"


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="the records' folder (fedreg-experiment --out)")
    parser.add_argument("--dataset-path", help="the records' data, for their clients' test sizes")
    parser.add_argument("--seed", type=int, default=0, help="the seed the tables show (default 0)")
    return parser.parse_args()


Key = tuple[str, str, str | None, str]


def over_seeds(by_seed: dict[int, dict[Key, RunResult]], dataset_path: str | None) -> None:
    """Cells run on more than one seed: final G and the honest clients' P, and their
    change from the default's honest run of the same seed (over the same clients), as
    mean ± std over the seeds."""
    seeds = sorted(by_seed)
    cells = sorted({key for runs in by_seed.values() for key in runs},
                   key=lambda k: (k[0], k[1] != "honest", k[1], k[2] or "", k[3]))  # fmt: skip
    lines = []
    for key in cells:
        algo, attack, _, rule = key
        rows = []
        for seed in seeds:
            runs = by_seed[seed]
            run, default = runs.get(key), runs.get((algo, "honest", None, DEFAULT_RULE))
            if run is None or default is None:
                continue
            liars = liars_of(run) if attack != "honest" else frozenset()
            g, base_g = global_figures(run), global_figures(default)
            p = final_and_best(honest_personal(run, liars, dataset_path))
            base_p = final_and_best(honest_personal(default, liars, dataset_path))
            rows.append((seed, g, delta(g, base_g), p, delta(p, base_p)))
        if len(rows) < 2 or any(r[1] is None or r[3] is None for r in rows):
            continue

        def spread(values: list[float]) -> str:
            return f"{statistics.fmean(values):+.1f} ± {statistics.stdev(values):.1f}"

        def level(values: list[float]) -> str:
            return f"{statistics.fmean(values):.1f} ± {statistics.stdev(values):.1f}"

        lines.append(
            f"| {algo} | {attack} | {rule} | {','.join(str(r[0]) for r in rows)} "
            f"| {level([100 * r[1][0] for r in rows])} | {spread([r[2] for r in rows])} "
            f"| {level([100 * r[3][0] for r in rows])} | {spread([r[4] for r in rows])} |"
        )
    if not lines:
        return
    print()
    header = "| algo | attack | rule | seeds | G final | ΔG final | P final (honest) | ΔP final |"
    print(header)
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(lines))
    print()
    print(f"Mean ± std over the seeds; Δ against the same seed's honest run of "
          f"`aggregation = \"{DEFAULT_RULE}\"`, P over the same honest clients.")  # fmt: skip


def main() -> None:
    args = arguments()
    by_seed: dict[int, dict[Key, RunResult]] = {}
    for run in collect(args.root):
        s = cell_settings(run.cell)
        # an honest cell is one row whatever share its grid names (no one lies in it)
        fraction = None if s["variant"] == "honest" else s.get("attack-fraction")
        key = (s["algo"], s["variant"], fraction, s.get("aggregation", DEFAULT_RULE))
        by_seed.setdefault(run.seed, {})[key] = run
    runs = by_seed.get(args.seed, {})
    algos = sorted({key[0] for key in runs},
                   key=lambda a: ORDER.index(a) if a in ORDER else len(ORDER))  # fmt: skip
    fractions = sorted({key[2] for key in runs if key[2] is not None})
    # a column per rule that has a run, in the key's order
    rules = [rule for rule in AGGREGATIONS if any(key[3] == rule for key in runs)]
    header = ["algo", "attack", "liars", *(f"{r} G" for r in rules), *(f"{r} P" for r in rules)]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    drops: dict[str, dict[str, list[float]]] = {"G": {r: [] for r in rules},
                                                 "P": {r: [] for r in rules}}  # fmt: skip
    against_default: list[str] = []
    attacked = 0
    for algo in algos:
        rows = [("honest", None)] + [(a, f) for f in fractions for a in ATTACKS]
        for attack, fraction in rows:
            chosen = [runs.get((algo, attack, fraction, rule)) for rule in rules]
            if not any(chosen):
                continue
            liars = next((liars_of(r) for r in chosen if r is not None), frozenset())
            g = [global_figures(r) for r in chosen]
            p = [None if r is None else final_and_best(honest_personal(r, liars, args.dataset_path))
                 for r in chosen]  # fmt: skip
            share = "0 %" if fraction is None else f"{100 * float(fraction):.0f} %"
            print(f"| {algo} | {attack} | {share} | " + " | ".join(map(cell, g + p)) + " |")
            if attack == "honest":
                continue
            default = runs.get((algo, "honest", None, DEFAULT_RULE))
            base_g = global_figures(default)
            base_p = None if default is None else final_and_best(
                honest_personal(default, liars, args.dataset_path))  # fmt: skip
            for rule, run, ours_g, ours_p in zip(rules, chosen, g, p, strict=True):
                honest = runs.get((algo, "honest", None, rule))
                if run is None:
                    continue
                against_default.append(
                    f"| {algo} | {attack} | {share} | {rule} | {signed(delta(ours_g, base_g))} "
                    f"| {signed(delta(ours_p, base_p))} |")  # fmt: skip
                if honest is None:
                    continue
                attacked += 1
                own_p = final_and_best(honest_personal(honest, liars, args.dataset_path))
                for name, value in (("G", delta(ours_g, global_figures(honest))),
                                    ("P", delta(ours_p, own_p))):  # fmt: skip
                    if value is not None:
                        drops[name][rule].append(-value)
    print()
    print("Each cell: final / best accuracy over the rounds, percent: G, the global model on "
          "every client's test split; P, personal, over the clients that do not lie "
          "(all clients in the honest rows).")  # fmt: skip
    print()
    print("| algo | attack | liars | rule | ΔG final | ΔP final (honest clients) |")
    print("|---|---|---|---|---|---|")
    print("\n".join(against_default))
    print()
    print(f"Δ: against the honest run of `aggregation = \"{DEFAULT_RULE}\"`, P over the same "
          "honest clients, percentage points.")  # fmt: skip
    summary = " ".join(
        f"drop_final_{name}_{rule}={statistics.fmean(values):.1f}"
        for name in ("G", "P") for rule, values in drops[name].items() if values
    )  # fmt: skip
    over_seeds(by_seed, args.dataset_path)
    print(f"attack_table: attacked_runs={attacked} {summary}")


if __name__ == "__main__":
    main()
