"""``cells.md``: each cell's figures over seeds, its difference from a reference cell seed
by seed, and its worst clients, checked against figures worked out by hand."""

from __future__ import annotations

from fedreg_tools.cell_tables import best_and_last, cells_table, worst_and_bottom_decile
from fedreg_tools.run_records import RunResult


def run(cell: str, seed: int, globals_: list[float], personals: list[float],
        clients: dict[str, float] | None = None) -> RunResult:  # fmt: skip
    """A run whose last round records its clients' personal accuracies."""
    rounds = [{"round": k + 1, "global_accuracy": g, "personal_accuracy": p}
              for k, (g, p) in enumerate(zip(globals_, personals, strict=True))]  # fmt: skip
    if clients is not None:
        rounds[-1]["client_accuracies"] = clients
    return RunResult("e", cell, seed, {"config": {"algo": cell}, "run": {}, "rounds": rounds})


def test_best_and_the_mean_of_the_last_ten_rounds() -> None:
    values = [k / 100 for k in range(12)]  # 0.00 .. 0.11: the last ten are 0.02 .. 0.11
    assert best_and_last(run("a", 0, values, values), "global_accuracy") == (0.11, 0.065)


def test_worst_client_and_bottom_decile_at_the_last_round_that_has_them() -> None:
    clients = {str(k): (k + 1) / 100 for k in range(20)}  # 0.01 .. 0.20; a tenth: 2 clients
    worst, decile = worst_and_bottom_decile(run("a", 0, [0.5, 0.6], [0.5, 0.6], clients))
    assert (worst, decile) == (0.01, 0.015)
    assert worst_and_bottom_decile(run("a", 0, [0.5], [0.5])) is None  # none recorded


def test_the_table_gives_mean_std_over_seeds_and_paired_differences() -> None:
    few = {"0": 0.2, "1": 0.6, "2": 0.9}  # 3 clients: the bottom tenth is the worst one
    results = [
        run("ref", 0, [0.50, 0.60], [0.70, 0.80], few),
        run("ref", 1, [0.40, 0.50], [0.60, 0.70], few),
        run("new", 0, [0.55, 0.62], [0.75, 0.85], {"0": 0.4, "1": 0.6, "2": 0.9}),
        run("new", 1, [0.50, 0.46], [0.60, 0.74], {"0": 0.3, "1": 0.6, "2": 0.9}),
    ]
    lines = cells_table(results, "ref").splitlines()
    assert lines[0].startswith("| experiment | cell | seeds | G best | G last 10 | P best |")
    ref, new = lines[2], lines[3]
    # ref: G best 0.60, 0.50 -> 55.00 ± 7.07; its own differences are zero
    assert ref == ("| e | ref | 2 | 55.00 ± 7.07 | 50.00 ± 7.07 | 75.00 ± 7.07 | 70.00 ± 7.07 | "
                   "+0.00 ± 0.00 | +0.00 ± 0.00 | 20.00 ± 0.00 | 20.00 ± 0.00 |")  # fmt: skip
    # new: G best 0.62 and 0.50 (ΔG +2 and 0), P best 0.85 and 0.74 (ΔP +5 and +4),
    # G last 10 0.585 and 0.48, P last 10 0.80 and 0.67 (std of two: |a - b| / sqrt 2),
    # worst clients 0.4 and 0.3
    assert new == ("| e | new | 2 | 56.00 ± 8.49 | 53.25 ± 7.42 | 79.50 ± 7.78 | 73.50 ± 9.19 "
                   "| +1.00 ± 1.41 | +4.50 ± 0.71 | 35.00 ± 7.07 | 35.00 ± 7.07 |")  # fmt: skip


def test_without_the_reference_cell_the_differences_are_left_blank() -> None:
    lines = cells_table([run("a", 0, [0.5], [0.6])], "fedreg").splitlines()
    assert lines[2] == "| e | a | 1 | 50.00 | 50.00 | 60.00 | 60.00 | – | – | – | – |"


def test_runs_with_held_out_clients_add_their_last_ten_rounds_mean() -> None:
    held_out = run("a", 0, [0.5, 0.6], [0.6, 0.7])
    for record, (p, g) in zip(held_out.document["rounds"], [(0.8, 0.3), (0.9, 0.5)], strict=True):
        record["new_client_personal_accuracy"] = p
        record["new_client_global_accuracy"] = g
    lines = cells_table([held_out, run("b", 0, [0.5], [0.6])], "fedreg").splitlines()
    assert lines[0].endswith("| new clients P last 10 | new clients G last 10 |")
    assert lines[2].endswith("| – | – | 85.00 | 40.00 |")  # (0.8 + 0.9) / 2, (0.3 + 0.5) / 2
    assert lines[3].endswith("| – | – | – | – |")  # a run without them
    assert "*new clients*" in cells_table([held_out], "fedreg")
    assert "new clients" not in cells_table([run("b", 0, [0.5], [0.6])], "fedreg")
