"""Reports: the paper-layout table, the rebalancing counts of Figure 4, the plots, and
what a report does with degraded and failed runs."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fedreg_app
import fedreg_tools
from fedreg_app.core.config import ConfigError
from fedreg_app.core.persist import RUN_FOLDER_LOCK
from fedreg_tools.overrides import declared_run_config
from fedreg_tools.paper_cells import read_paper_cells
from fedreg_tools.report_plots import (
    _mean_band,
    log_ratio_lines,
    plot_accuracy_curves,
    rebalance_summary,
    rebalanced_counts,
)
from fedreg_tools.report_tables import (
    ANSWERED_NOTE,
    DEGRADED_NOTE,
    UNFINISHED_NOTE,
    cost_table,
    differing_settings,
    paper_comparison,
    paper_table,
    provenance_table,
)
from fedreg_tools.reports import (
    class_distribution_report,
    describe_setting,
    main,
    write_report,
    write_run_report,
)
from fedreg_tools.run_records import collect, scan
from fedreg_tools.runner_plan import Experiment, cell_id
from tests.holders import SERVERAPP, held_elsewhere


def fake_run(
    root: Path,
    experiment: str,
    cell: str,
    seed: int,
    *,
    clients: int = 20,
    globals_: tuple[float | None, ...] = (0.5, 0.6, 0.7),
    personals: tuple[float | None, ...] = (0.8, 0.85, 0.9),
    status: str = "completed",
    run: str = "run-1",
    answered: tuple[float | None, ...] | None = None,
    error: str | None = None,
    config: dict | None = None,
    sampled: list[list[int]] | None = None,
    digest: str | None = None,
) -> None:
    """A results.json in the runner's layout; ``answered`` gives a degraded run's
    per-round personal accuracy over the clients that answered; ``config`` changes the
    recorded config; ``sampled`` (clients drawn per round) and ``digest`` (the data's)
    are recorded where given."""
    folder = root / experiment / cell / f"seed{seed}" / run  # run="": the committed layout
    folder.mkdir(parents=True)
    answered = answered or personals
    rounds = [
        {
            "round": k + 1,
            "global_accuracy": g,
            "personal_accuracy": p,
            "personal_accuracy_answered": a,
            "train_seconds": 2.0,
            "eval_seconds": 1.0,
        }
        for k, (g, p, a) in enumerate(zip(globals_, personals, answered, strict=True))
    ]
    traffic = {
        "bytes_to_clients": 4_000_000,
        "bytes_from_clients": 1_000_000,
        "train_bytes_to_clients": 2_000_000,
        "train_bytes_from_clients": 1_000_000,
    }
    for record, drawn in zip(rounds, sampled or [], strict=False):
        record["sampled_clients"] = drawn
    for record in rounds[:1]:
        record.update(traffic)  # the totals are the rounds' sums, as the writer makes them
    if status == "degraded":  # as the writer decides it: some round had a failed reply
        for record in [r for r in rounds if r["personal_accuracy"] is None] or rounds[-1:]:
            record["train_failures"] = 1
    complete = [p for p in personals if p is not None]
    document = {
        "config": {"algo": cell.split("__")[0], "dataset": "zalando-datasets/fashion_mnist",
                   "num-server-rounds": len(rounds) if status in ("completed", "degraded")
                   else 5, "alpha": 0.1, "fraction-train": 0.25,
                   "local-epochs": 1, "batch-size": 10, "seed": seed,
                   # as of today
                   "dirichlet-balance": True, "drop-last": True, "optimizer-state": "persistent",
                   "flush-denormals": True,
                   **(config or {})},
        "run": {"status": status, "num_clients": clients, **({"error": error} if error else {}),
                **({"data_digest": digest} if digest else {})},
        "rounds": rounds,
        **{f"total_{key}": value if rounds else 0 for key, value in traffic.items()},
        "best_global_accuracy": max((g for g in globals_ if g is not None), default=None),
        "best_personal_accuracy": max(complete) if complete else None,
        "best_personal_accuracy_answered": max((a for a in answered if a), default=None),
    }  # fmt: skip
    (folder / "results.json").write_text(json.dumps(document))


def test_collect_keeps_completed_runs_and_the_newest_per_seed(tmp_path: Path) -> None:
    fake_run(tmp_path, "smoke", "fedreg", 0, status="failed", run="run-0")
    fake_run(tmp_path, "smoke", "fedreg", 1, status="running")
    fake_run(tmp_path, "smoke", "fedreg", 2, globals_=(0.1, 0.2, 0.3), run="run-a")
    fake_run(tmp_path, "smoke", "fedreg", 2, globals_=(0.4, 0.5, 0.6), run="run-b")
    results = collect(tmp_path)
    assert [(r.seed, r.best_global) for r in results] == [(2, 0.6)]
    assert results[0].algo == "fedreg" and results[0].clients == 20


def test_paper_table_has_g_and_p_per_experiment(tmp_path: Path) -> None:
    for seed, g in enumerate((0.80, 0.84)):
        fake_run(tmp_path, "clients30", "fedreg", seed, globals_=(0.5, g, 0.6), clients=30)
        fake_run(tmp_path, "clients50", "fedreg", seed, globals_=(0.5, 0.7, 0.6), clients=50)
    fake_run(tmp_path, "clients30", "fedavg__variant-a", 0, personals=(0.5, 0.6, 0.7))
    table = paper_table(collect(tmp_path)).splitlines()
    assert table[0] == ("| cell | clients30 G | clients30 P | clients50 G | clients50 P "
                        "| seeds (clients30/clients50) |")  # fmt: skip
    assert "| fedreg | 82.00 ± 2.83 | 90.00 ± 0.00 | 70.00 ± 0.00 | 90.00 ± 0.00 | 2/2 |" in table
    assert "| fedavg variant-a | 70.00 | 70.00 | – | – | 1/0 |" in table


def test_a_plot_title_names_which_fraction_it_gives() -> None:
    """A title said "fraction 0.2": of the clients a round trains, or of the data (the
    scaled configs use both)? Each is named by its key; a data-fraction of 1 is left out."""
    config = {"dataset": "zalando/fashion_mnist", "alpha": 0.1, "fraction-train": 0.2,
              "local-epochs": 5, "batch-size": 10, "num-server-rounds": 100}  # fmt: skip
    run = {"num_clients": 50}
    assert describe_setting({"config": config, "run": run}) == (
        "fashion_mnist, 50 clients, alpha 0.1, 100 rounds, fraction-train 0.2, E=5, B=10"
    )
    scaled = {"config": {**config, "data-fraction": 0.25}, "run": run}
    assert describe_setting(scaled).startswith("fashion_mnist, data-fraction 0.25, 50 clients")


def test_mean_band_uses_rounds_every_seed_evaluated(tmp_path: Path) -> None:
    fake_run(tmp_path, "e", "fedreg", 0, globals_=(None, 0.6, 0.8))
    fake_run(tmp_path, "e", "fedreg", 1, globals_=(0.1, 0.4, None))
    rounds, mean, std = _mean_band(collect(tmp_path), "global_accuracy")
    assert rounds.tolist() == [2] and mean.tolist() == pytest.approx([50.0])
    # the sample std, as the table's mean ± std (the band was the population std, 10.0)
    assert std.tolist() == pytest.approx([14.142135623730951])


def test_rebalanced_counts_bring_present_classes_to_the_threshold() -> None:
    original = np.array([[10, 0, 3, 7], [0, 5, 5, 0]])
    kept, added = rebalanced_counts(original, thresholds=[6, 5])
    assert kept.tolist() == [[6, 0, 3, 6], [0, 5, 5, 0]]
    assert added.tolist() == [[0, 0, 3, 0], [0, 0, 0, 0]]
    totals = kept + added
    assert (totals[original > 0] == np.repeat([6, 5], [3, 2])).all()  # every present class = t
    assert (totals[original == 0] == 0).all()  # absent classes stay absent


def test_rebalance_summary_gives_sizes_copies_and_the_largest_head_weight() -> None:
    """Per-client sizes before and after, the share of copies and the largest client's
    share of the effective samples, from counts worked by hand."""
    original = np.array([[10, 0, 3, 7], [0, 5, 5, 0], [1, 1, 0, 0]])
    # kept: [6, 0, 3, 6] = 15, [0, 5, 5, 0] = 10, [1, 1, 0, 0] = 2 (effective samples)
    # added: [0, 0, 3, 0] = 3, none, [3, 3, 0, 0] = 6; rebalanced 18, 10, 8 of 36
    line = rebalance_summary(original, thresholds=[6, 5, 4])
    assert line == (
        "rebalanced: clients=3 train=2/10/20 rebalanced=8/10/18 copies=0.250 "
        "head_g_weight_max=0.556"
    )  # 9 / 36 copies; 15 / 27 effective


def test_report_writes_table_curves_and_figure_7(tmp_path: Path) -> None:
    for clients in (30, 50):
        for cell in ("fedreg", "fedavg"):
            fake_run(tmp_path / "runs", f"c{clients}", cell, 0, clients=clients)
    written = write_report(tmp_path / "runs", tmp_path / "report")
    names = sorted(p.name for p in written)
    assert names == ["c30_accuracy.png", "c50_accuracy.png", "cells.md", "costs.md",
                     "log_ratio_vs_clients.png", "rounds.md", "runs.md", "table.md"]  # fmt: skip
    for path in written[5:]:
        with Image.open(path) as image:
            assert image.format == "PNG" and image.width > 400 and image.height > 300


def test_cost_table_averages_traffic_over_seeds(tmp_path: Path) -> None:
    fake_run(tmp_path, "smoke", "fedseq-vanilla", 0)
    fake_run(tmp_path, "smoke", "fedseq-vanilla", 1)
    for seed, processed in ((0, 1000), (1, 2000)):  # samples trained a round: 3 rounds
        path = next((tmp_path / "smoke" / "fedseq-vanilla" / f"seed{seed}").glob("*/results.json"))
        document = json.loads(path.read_text())
        for record in document["rounds"]:
            record["num_train_examples"] = processed
        path.write_text(json.dumps(document))
    table = cost_table(collect(tmp_path)).splitlines()
    assert "| trained params (M) | samples trained (k) | s/round (median) |" in table[0]
    # samples: 3 x 1000 and 3 x 2000 over the two seeds, 4.5 k on average
    assert table[2] == "| smoke | fedseq-vanilla | 4.0 | 1.0 | 2.0 / 1.0 | 0.0 | 4.5 | 3.0 | 2 |"


def test_provenance_names_every_attempt_machine_and_best_round(tmp_path: Path) -> None:
    """A run resumed on another machine, its clients on a GPU in some rounds: the line
    names both machines, the resume, the code of each attempt and the rounds of the best
    figures; a run from before records kept an environment says so."""
    fake_run(tmp_path, "smoke", "fedreg", 0, globals_=(0.5, 0.7, 0.7), personals=(0.9, 0.8, None),
             status="degraded")  # fmt: skip
    fake_run(tmp_path, "smoke", "fedreg", 1)
    path = tmp_path / "smoke" / "fedreg" / "seed0" / "run-1" / "results.json"
    document = json.loads(path.read_text())
    cpu = {"cpu": "AMD EPYC", "cpu_capability": "AVX512", "torch": "2.14.1", "flwr": "1.42.0",
           "code": "aaaa"}  # fmt: skip
    gpu = {**cpu, "cpu": "Xeon", "torch": "2.11.0", "code": "bbbb", "cuda_device": "H200"}
    resumes = [{"after_round": 1, "environment": gpu}, {"after_round": 2, "environment": gpu}]
    document["run"].update(environment=cpu, started="2026-11-25T10:00:00", resumed=resumes)
    document["rounds"][2]["train_failures"] = 2
    document["rounds"][2]["client_hosts"] = {"3": {"device": "NVIDIA H200"}, "4": {"device": "cpu"}}
    path.write_text(json.dumps(document))
    lines = provenance_table(collect(tmp_path)).splitlines()
    assert lines[2] == (
        "| smoke | fedreg | 0 | degraded | 3/3 | 3 (resumed after 1, 2) | AMD EPYC (AVX512) + "
        "Xeon (AVX512); clients on NVIDIA H200 | 2.14.1 / 1.42.0 + 2.11.0 / 1.42.0 | "
        "aaaa + bbbb | 3.0 | 2 | 70.00 (r2) | 90.00 (r1) | 2026-11-25 |"
    )
    assert lines[3] == (
        "| smoke | fedreg | 1 | completed | 3/3 | 1 | not recorded | – | – | 3.0 | 0 | "
        "70.00 (r3) | 90.00 (r3) | – |"
    )
    # a file is not trusted: malformed resumes and hosts are left out, not fatal
    document["run"]["resumed"] = ["x", 3, {"after_round": 2, "environment": "y"}]
    document["rounds"][1]["client_hosts"] = ["not", "a", "mapping"]
    path.write_text(json.dumps(document))
    line = provenance_table(collect(tmp_path)).splitlines()[2]
    assert "| 2 (resumed after 2) | AMD EPYC (AVX512); clients on NVIDIA H200 |" in line
    assert "| aaaa | 3.0 | 2 |" in line
    document["rounds"][2]["train_failures"] = "many"  # a count that is none: the file is
    path.write_text(json.dumps(document))  # refused, named, never half-read
    assert "round 3: train_failures is 'many'" in scan(tmp_path).skipped[0].error


def test_single_client_count_draws_no_figure_7(tmp_path: Path) -> None:
    fake_run(tmp_path, "smoke", "fedreg", 0)
    assert [p.name for p in write_report(tmp_path, tmp_path / "r")] == [
        "table.md",
        "costs.md",
        "runs.md",
        "rounds.md",
        "cells.md",
        "smoke_accuracy.png",
    ]


def test_report_cli_errors_on_an_empty_root(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main([str(tmp_path)])


def test_class_distribution_from_a_partition(grey_dataset: Path, tmp_path: Path) -> None:
    run_config = {**declared_run_config(), "dataset-path": str(grey_dataset), "alpha": 1.0}
    path, summary = class_distribution_report(run_config, 4, tmp_path / "fig4.png")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.height > 400
    assert summary.startswith("rebalanced: clients=4 train=")
    with pytest.raises(SystemExit):
        main(["classes", "--clients", "4", "--set", "alpha=-1", "--out", "x.png"])


# ------------------------------------------------------- degraded and failed runs
def test_collect_keeps_degraded_runs_and_says_which_seeds_it_skipped(tmp_path: Path) -> None:
    fake_run(tmp_path, "smoke", "fedreg", 0, status="failed", error="OOM\ntraceback")
    fake_run(tmp_path, "smoke", "fedreg", 1, status="degraded", personals=(None, None, None),
             answered=(0.7, 0.8, 0.9))  # fmt: skip
    fake_run(tmp_path, "smoke", "fedreg", 2, status="running")
    fake_run(tmp_path, "smoke", "fedreg", 3, status="failed", run="run-1")
    fake_run(tmp_path, "smoke", "fedreg", 3, status="degraded", run="run-2")  # the rerun
    collection = scan(tmp_path)
    assert [(r.seed, r.degraded) for r in collection.results] == [(1, True), (3, True)]
    assert collect(tmp_path) == collection.results
    note = collection.skipped_note(tmp_path).splitlines()
    assert note[0] == "Left out 2 run(s) or file(s) (1 failed, 1 running):"
    assert note[1:] == ["- smoke/fedreg/seed0: failed: OOM", "- smoke/fedreg/seed2: running"]


def test_an_experiment_or_cell_folder_linked_under_another_name_is_counted_once(
    tmp_path: Path,
) -> None:
    """A symlink to an experiment folder (``a_view -> smoke``) or a cell folder made the
    same records a second experiment or cell in the report, their seeds counted twice.
    Each file is counted once, under its path with no link, and the linked path named."""
    fake_run(tmp_path, "smoke", "fedreg", 0)
    fake_run(tmp_path, "smoke", "fedreg", 1, globals_=(0.2, 0.3, 0.4))
    (tmp_path / "a_view").symlink_to(tmp_path / "smoke")  # sorts before the real folder
    (tmp_path / "smoke" / "fedavg").symlink_to(tmp_path / "smoke" / "fedreg")
    collection = scan(tmp_path)
    assert [(r.experiment, r.cell, r.seed) for r in collection.results] == [
        ("smoke", "fedreg", 0), ("smoke", "fedreg", 1)
    ]  # fmt: skip
    note = collection.skipped_note(tmp_path)
    assert "- a_view/fedreg/seed0/run-1/results.json: linked: the same file as " in note
    assert f"{tmp_path / 'smoke/fedreg/seed0/run-1/results.json'}; counted once there" in note
    assert "- smoke/fedavg/seed1/run-1/results.json: linked" in note
    assert len(collection.skipped) == 6  # 2 seeds x (a_view/fedreg, a_view/fedavg, fedavg)
    assert note.startswith("Left out 6 run(s) or file(s) (6 linked):")


def test_a_seed_folder_linked_to_a_folder_of_another_name_counts_as_its_seed(
    tmp_path: Path,
) -> None:
    """``seed1 -> seed1-v2``: the file counts once, as seed 1 (the real path's folder name
    is no seed's); preferring the path with fewer links dropped seed 1 altogether."""
    fake_run(tmp_path, "smoke", "fedreg", 0)
    fake_run(tmp_path, "smoke", "fedreg", 1)
    cell = tmp_path / "smoke" / "fedreg"
    (cell / "seed1").rename(cell / "seed1-v2")
    (cell / "seed1").symlink_to(cell / "seed1-v2")
    collection = scan(tmp_path)
    assert [r.seed for r in collection.results] == [0, 1]
    assert "- smoke/fedreg/seed1-v2/run-1/results.json: linked" in collection.skipped_note(tmp_path)


def test_a_degraded_runs_personal_figure_is_marked_never_passed_off(tmp_path: Path) -> None:
    # seed 0: degraded with no complete round: P only over the clients that answered (‡).
    fake_run(tmp_path, "e", "fedreg", 0, status="degraded", personals=(None, None, None),
             answered=(0.7, 0.8, 0.9))  # fmt: skip
    fake_run(tmp_path, "e", "fedreg", 1)
    # fedavg: degraded, but its complete rounds give the all-client P, which is shown (†).
    fake_run(tmp_path, "e", "fedavg", 0, status="degraded", personals=(0.6, None, None),
             answered=(0.6, 0.95, 0.99))  # fmt: skip
    fake_run(tmp_path, "e", "ditto", 0)
    results = collect(tmp_path)
    assert [r.personal for r in results if r.cell == "fedreg"] == [(0.9, True), (0.9, False)]
    table = paper_table(results)
    assert "| fedreg | 70.00 ± 0.00† | 90.00 ± 0.00†‡ | 2 |" in table
    assert "| fedavg | 70.00† | 60.00† | 1 |" in table
    assert "| ditto | 70.00 | 90.00 | 1 |" in table
    assert table.endswith(f"{DEGRADED_NOTE}\n\n{ANSWERED_NOTE}")
    costs = cost_table(results)
    assert "| e | fedreg† |" in costs and "| e | ditto |" in costs
    assert costs.endswith(DEGRADED_NOTE) and ANSWERED_NOTE not in costs


def test_tables_of_complete_runs_carry_no_marks(tmp_path: Path) -> None:
    fake_run(tmp_path, "e", "fedreg", 0)
    results = collect(tmp_path)
    for table in (paper_table(results), cost_table(results)):
        assert "†" not in table and "‡" not in table


def test_curves_of_degraded_runs_use_the_answering_clients(tmp_path: Path) -> None:
    fake_run(tmp_path, "e", "fedreg", 0, status="degraded", personals=(0.8, None, 0.9),
             answered=(0.8, 0.5, 0.9))  # fmt: skip
    (result,) = collect(tmp_path)
    assert result.series("personal_accuracy") == ([1, 3], [0.8, 0.9])
    assert result.series("personal_accuracy", answered=True) == ([1, 2, 3], [0.8, 0.5, 0.9])
    rounds, mean, _ = _mean_band([result], "personal_accuracy", answered=True)
    assert rounds.tolist() == [1, 2, 3] and mean.tolist() == pytest.approx([80.0, 50.0, 90.0])
    written = write_report(tmp_path, tmp_path / "report")
    assert (tmp_path / "report" / "e_accuracy.png") in written


def test_a_record_in_another_cells_folder_is_refused_not_published_as_that_cell(
    tmp_path: Path,
) -> None:
    """FedAvg's record copied into FedReG's cell (or a grid cell's folder holding a run
    of another grid value) was averaged and published as that cell, beside the paper's
    figure for it. The folder names the algorithm and the grid values: the record must
    be of them. A grid's 1 is a config's 1.0, and a variant's label names no key."""
    fake_run(tmp_path, "e", "fedavg", 0, globals_=(0.5, 0.6, 0.9))
    fake_run(tmp_path, "e", "fedreg", 0)
    fake_run(tmp_path, "g", "fedreg__alpha-0.5", 0, config={"alpha": 0.1})
    fake_run(tmp_path, "g", "fedreg__alpha-1", 0, config={"alpha": 1.0})
    fake_run(tmp_path, "g", "fedreg__variant-fresh", 0, config={"optimizer-state": "fresh"})
    copied = tmp_path / "e" / "fedreg" / "seed1" / "run-1"
    copied.mkdir(parents=True)
    source = json.loads((tmp_path / "e/fedavg/seed0/run-1/results.json").read_text())
    source["config"]["seed"] = 1
    (copied / "results.json").write_text(json.dumps(source))
    collection = scan(tmp_path)
    kept = sorted((r.experiment, r.cell, r.seed) for r in collection.results)
    assert kept == [("e", "fedavg", 0), ("e", "fedreg", 0), ("g", "fedreg__alpha-1", 0),
                    ("g", "fedreg__variant-fresh", 0)]  # fmt: skip
    note = collection.skipped_note(tmp_path)
    assert (
        "e/fedreg/seed1: invalid: results.json: config.algo is 'fedavg' but the file "
        "lies in cell 'fedreg'" in note
    )
    assert (
        "g/fedreg__alpha-0.5/seed0: invalid: results.json: config alpha=0.1 but the file "
        "lies in cell 'fedreg__alpha-0.5'" in note
    )


def test_a_run_its_algorithm_ended_early_is_finished_with_fewer_rounds(tmp_path: Path) -> None:
    """Deviation tracking ends its run after its fine-tune rounds, short of
    num-server-rounds: the record says so (``run.ended_after_round``) and is finished;
    without it, a ``completed`` run short of its rounds is refused."""
    fake_run(tmp_path, "e", "fedbabu-deviation", 0, config={"num-server-rounds": 6})
    path = tmp_path / "e/fedbabu-deviation/seed0/run-1/results.json"
    assert "records 3 of the 6 rounds" in scan(tmp_path).skipped[0].error
    document = json.loads(path.read_text())
    document["run"]["ended_after_round"] = 3
    path.write_text(json.dumps(document))
    assert [r.best_global for r in scan(tmp_path).results] == [0.7]
    # a record from before that key: its fine-tune round R and F rounds say the same
    del document["run"]["ended_after_round"]
    document["run"]["fine_tune_round"] = 2
    document["config"]["deviation-finetune-rounds"] = 1
    path.write_text(json.dumps(document))
    assert [r.best_global for r in scan(tmp_path).results] == [0.7]


def test_report_writes_the_skipped_runs_under_its_table(tmp_path: Path) -> None:
    fake_run(tmp_path / "runs", "smoke", "fedreg", 0, status="degraded")
    fake_run(tmp_path / "runs", "smoke", "fedreg", 1, status="failed", error="boom")
    table = write_report(tmp_path / "runs", tmp_path / "report")[0].read_text()
    assert "Left out 1 run(s) or file(s) (1 failed):" in table
    assert "- smoke/fedreg/seed1: failed: boom" in table


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda d: d["rounds"][1].update(global_accuracy="0.9"), "round 2: global_accuracy is"),
        (lambda d: d["rounds"][2].update(personal_accuracy=7.5), "round 3: personal_accuracy is 7"),
        (lambda d: d["rounds"][0].update(global_accuracy=float("nan")), "round 1: global_accuracy"),
        (lambda d: d["rounds"][0].update(train_seconds=-1), "round 1: train_seconds is -1"),
        (lambda d: d["rounds"].pop(1), "rounds[1] is not the record of round 2"),
        (lambda d: d.update(best_global_accuracy=0.99), "best_global_accuracy is 0.99 but"),
        (lambda d: d["run"].update(num_clients="20"), "run.num_clients is '20'"),
        (lambda d: d["config"].pop("algo"), "config.algo is missing"),
        (lambda d: d["run"].update(algo="fedrod"), "run.algo is 'fedrod' but config.algo is"),
        (lambda d: d["run"].update(status=["completed"]), "run.status is ['completed']; expected"),
        (
            lambda d: d["config"].update({"num-server-rounds": 4}),
            "status 'completed' but it records 3 of the 4 rounds",
        ),
        (
            lambda d: d["config"].update({"num-server-rounds": 2}),
            "it records 3 rounds, more than the 2 the run plans",
        ),
        (
            lambda d: d["rounds"][1].update(train_failures=3),
            "status 'completed' but rounds [2] are degraded",
        ),
        (lambda d: d["run"].update(status="degraded"), "status 'degraded' but no round is"),
        (
            lambda d: d.pop("best_personal_accuracy"),
            "best_personal_accuracy is 'missing' but the rounds' best personal_accuracy is 0.9",
        ),
        (
            lambda d: d.pop("total_bytes_to_clients"),
            "total_bytes_to_clients is 'missing' but the rounds' bytes_to_clients sum to 4000000",
        ),
        (
            lambda d: d.update(total_bytes_from_clients=10**7),
            "total_bytes_from_clients is 10000000 but the rounds' bytes_from_clients sum to",
        ),
        (
            lambda d: d["rounds"][0].update(client_accuracies={"0": "0.5"}),
            "round 1: client_accuracies['0'] is '0.5'; expected a fraction",
        ),
        (
            lambda d: d["rounds"][0].update(client_accuracies={"20": 0.5}),
            "round 1: client_accuracies names client '20' below num_clients=20",
        ),
        (
            lambda d: d["rounds"][0].update(client_train_seconds={"3": -0.5}),
            "round 1: client_train_seconds['3'] is -0.5; expected a number >= 0",
        ),
        (
            lambda d: d["rounds"][0].update(client_train_seconds={"25": 4.0}),
            "round 1: client_train_seconds names client '25' below num_clients=20",
        ),
        (
            lambda d: d["rounds"][0].update(sampled_clients=[1, 1]),
            "round 1: sampled_clients is [1, 1]; expected distinct ids below num_clients=20",
        ),
        (
            lambda d: d["rounds"][0].update(personal_coverage={"clients": 20, "of_clients": 30}),
            "round 1: personal_coverage is {'clients': 20, 'of_clients': 30}; expected clients",
        ),
        (
            lambda d: d["rounds"][0].update(num_train_examples=-40),
            "round 1: num_train_examples is -40; expected an integer >= 0",
        ),
        (
            lambda d: d["rounds"][0].update(client_accuracies={"\u00b2": 0.5}),
            "round 1: client_accuracies names client '\u00b2'",
        ),
        (
            lambda d: d["rounds"][0].update(client_accuracies={"01": 0.5}),
            "round 1: client_accuracies names client '01'",
        ),
        (
            lambda d: d["rounds"][0].update(personal_coverage={"clients": 19, "of_clients": 20}),
            "round 1: personal_accuracy is 0.8 but personal_coverage is {'clients': 19",
        ),
        (
            lambda d: d["rounds"][0].update(
                personal_coverage={"clients": 20, "of_clients": 20}, client_accuracies={"0": 0.5}
            ),
            "round 1: 1 client_accuracies but personal_coverage is {'clients': 20",
        ),
    ],
)
def test_a_results_file_that_the_rounds_do_not_bear_out_is_refused_and_named(
    tmp_path: Path, edit, problem: str
) -> None:
    """A report publishes what the files say: an edited or damaged file is left out with
    the reason, even when an older finished run of the seed stands beside it (used
    instead, but the damaged one is named), and the report still gets written."""
    fake_run(tmp_path, "e", "fedreg", 0, run="run-1")
    fake_run(tmp_path, "e", "fedreg", 0, run="run-2", globals_=(0.5, 0.6, 0.75))
    fake_run(tmp_path, "e", "fedavg", 0)
    for cell in ("fedreg", "fedavg"):
        path = next((tmp_path / "e" / cell / "seed0").glob("run-*/results.json"))
        if cell == "fedreg":
            path = tmp_path / "e" / "fedreg" / "seed0" / "run-2" / "results.json"
        document = json.loads(path.read_text())
        edit(document)
        path.write_text(json.dumps(document))
    collection = scan(tmp_path)
    assert [(r.cell, r.best_global) for r in collection.results] == [("fedreg", 0.7)]
    note = collection.skipped_note(tmp_path)
    assert f"- e/fedreg/seed0/run-2/results.json: invalid: results.json: {problem}" in note
    assert f"- e/fedavg/seed0: invalid: results.json: {problem}" in note
    table = write_report(tmp_path, tmp_path / "report")[0].read_text()
    assert "| fedreg | 70.00 | 90.00 | 1 |" in table and "| fedavg |" not in table
    assert problem in table


def test_a_cells_mean_is_over_runs_of_one_setting_and_the_others_are_named(
    tmp_path: Path,
) -> None:
    """Seed 2 of FedReG ran after the config was edited (5 local epochs): its figures are
    not averaged with the others', and the report says which seed and which key. Where
    most seeds share a setting the odd one out is left out, even seed 0. Where a run was
    made (dataset path, device, folders) does not split a cell."""
    fake_run(tmp_path, "e", "fedreg", 0, globals_=(0.5, 0.6, 0.6))
    fake_run(
        tmp_path,
        "e",
        "fedreg",
        1,
        globals_=(0.5, 0.6, 0.8),
        config={"dataset-path": "/elsewhere", "device": "cuda", "results-dir": "/x"},
    )
    fake_run(tmp_path, "e", "fedreg", 2, globals_=(0.5, 0.9, 0.99), config={"local-epochs": 5})
    fake_run(tmp_path, "e", "fedavg", 0, globals_=(0.5, 0.6, 0.6), config={"local-epochs": 5})
    fake_run(tmp_path, "e", "fedavg", 1, globals_=(0.5, 0.6, 0.7))
    fake_run(tmp_path, "e", "fedavg", 2, globals_=(0.5, 0.6, 0.9))  # fmt: skip
    collection = scan(tmp_path)
    kept = sorted((r.cell, r.seed) for r in collection.results)
    assert kept == [("fedavg", 1), ("fedavg", 2), ("fedreg", 0), ("fedreg", 1)]
    note = collection.skipped_note(tmp_path)
    assert "Left out 2 run(s) or file(s) (2 other setting):" in note
    assert ("- e/fedreg/seed2/run-1: other setting: config differs from seed0's: "
            "local-epochs=5, not 1") in note  # fmt: skip
    assert ("- e/fedavg/seed0/run-1: other setting: config differs from seed1's: "
            "local-epochs=5, not 1") in note  # fmt: skip
    table = write_report(tmp_path, tmp_path / "report")[0].read_text()
    assert "| fedreg | 70.00 ± 14.14 |" in table and "| fedavg | 80.00 ± 14.14 |" in table


def test_cells_compared_with_another_budget_or_partition_are_named_under_the_table(
    tmp_path: Path,
) -> None:
    """FedAvg run with 2 rounds (a `--set` meant for a quick look) beside FedReG's 3: the
    table still sets them side by side, and says under it which key differs in which
    cells. A key the grid varies (named in the cells) is not listed."""
    fake_run(tmp_path, "e", "fedreg", 0)
    fake_run(tmp_path, "e", "fedrod", 0)
    fake_run(tmp_path, "e", "fedavg", 0, config={"num-server-rounds": 2, "alpha": 0.5},
             globals_=(0.5, 0.6), personals=(0.8, 0.85))  # fmt: skip
    fake_run(tmp_path, "g", "fedreg__alpha-0.5", 0, config={"alpha": 0.5})
    fake_run(tmp_path, "g", "fedreg__alpha-0.1", 0)
    table = write_report(tmp_path, tmp_path / "report")[0].read_text()
    assert (
        "Settings that differ between the cells of one experiment (compare with care):\n"
        "- e: `alpha` is 0.1 (fedreg, fedrod); 0.5 (fedavg)\n"
        "- e: `num-server-rounds` is 3 (fedreg, fedrod); 2 (fedavg)\n"
    ) in table
    assert "- g:" not in table
    fake_run(tmp_path / "same", "e", "fedreg", 0)
    fake_run(tmp_path / "same", "e", "fedavg", 0, config={"head-depth": 1})  # its own split
    same = write_report(tmp_path / "same", tmp_path / "r2")[0].read_text()
    assert "Settings that differ" not in same


def test_a_run_recorded_with_another_seed_than_its_folders_is_refused(tmp_path: Path) -> None:
    """A results.json copied into the wrong seed folder would be averaged as that seed
    (twice, beside its own): refused and named."""
    fake_run(tmp_path, "e", "fedreg", 0)
    fake_run(tmp_path, "e", "fedreg", 1, config={"seed": 0})
    collection = scan(tmp_path)
    assert [r.seed for r in collection.results] == [0]
    note = collection.skipped_note(tmp_path)
    assert "- e/fedreg/seed1: invalid: results.json: config.seed is 0 but the file lies in " \
           "seed1" in note  # fmt: skip


def test_a_root_of_failed_runs_only_is_an_error_that_says_why(tmp_path: Path, capsys) -> None:
    fake_run(tmp_path, "smoke", "fedreg", 0, status="failed", error="boom")
    with pytest.raises(FileNotFoundError, match="seed0: failed: boom"):
        write_report(tmp_path, tmp_path / "report")
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "1 failed" in capsys.readouterr().err


def test_the_report_and_the_runner_do_not_import_each_other() -> None:
    """overrides.py sits below both tools; the report's modules never import the runner."""
    package = Path(fedreg_tools.__file__).parent

    def imported(name: str) -> set[str]:
        modules = set()
        for node in ast.walk(ast.parse((package / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules.add(node.module)
            elif isinstance(node, ast.Import):
                modules.update(alias.name for alias in node.names)
        return modules

    report = ("reports", "run_records", "paper_cells", "report_tables", "report_plots")
    runner = {
        m
        for name in report
        for m in imported(name)
        if m == "fedreg_tools.experiments" or m.startswith("fedreg_tools.runner_")
    }
    assert not runner, runner
    ours = {m for m in imported("overrides") if m.split(".")[0] == "fedreg_app"}
    assert ours == {"fedreg_app.core.config"}


def test_report_classes_names_the_closest_key_of_an_unknown_one(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["classes", "--set", "pxor-mu=0.1", "--out", "x.png"])
    assert "did you mean 'prox-mu'" in capsys.readouterr().err


# ------------------------------------------------------------- unfinished runs
def test_committed_results_without_a_run_folder_are_read(tmp_path: Path) -> None:
    """``results/<experiment>/<cell>/seed<k>/results.json``, as results are committed."""
    fake_run(tmp_path, "table2", "fedreg", 0, run="")
    fake_run(tmp_path, "table2", "fedavg", 0, globals_=(0.2, 0.3, 0.4))
    assert [(r.cell, r.best_global) for r in collect(tmp_path)] == [
        ("fedavg", 0.4),
        ("fedreg", 0.7),
    ]


def test_unfinished_runs_are_skipped_unless_asked_then_marked_with_rounds_done(
    tmp_path: Path, capsys
) -> None:
    fake_run(tmp_path, "t", "fedreg", 0, run="", status="running", globals_=(0.5, 0.8, 0.6))
    fake_run(tmp_path, "t", "fedavg", 0)
    fake_run(tmp_path, "t", "fedavg", 1, status="running", run="run-1")  # finished rerun:
    fake_run(tmp_path, "t", "fedavg", 1, globals_=(0.1, 0.2, 0.3), run="run-2")  # it wins
    fake_run(tmp_path, "t", "fedrod", 0, status="running", globals_=(), personals=())
    assert [(r.cell, r.seed) for r in collect(tmp_path)] == [("fedavg", 0), ("fedavg", 1)]

    collection = scan(tmp_path, unfinished=True)
    kept = {(r.cell, r.seed): r for r in collection.results}
    assert sorted(kept) == [("fedavg", 0), ("fedavg", 1), ("fedreg", 0)]
    assert kept["fedreg", 0].unfinished and kept["fedreg", 0].progress == "3/5"
    assert not kept["fedavg", 1].unfinished and kept["fedavg", 1].best_global == 0.3
    assert [s.status for s in collection.skipped] == ["running"]  # fedrod: no round yet
    table = paper_table(collection.results)
    assert "| fedreg | 80.00§ | 90.00§ | 1 |" in table
    assert "| fedavg | 50.00 ± 28.28 | 90.00 ± 0.00 | 2 |" in table
    assert table.endswith(UNFINISHED_NOTE)
    assert "| t | fedreg§ |" in cost_table(collection.results)

    assert main([str(tmp_path), "--unfinished", "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "table.md").read_text()
    kept_note = "§ Unfinished runs kept (rounds done/configured):\n- t/fedreg/seed0: 3/5, running"
    assert kept_note in report
    assert "- t/fedrod/seed0: running" in report
    assert (tmp_path / "report" / "t_accuracy.png").exists()
    capsys.readouterr()
    assert (
        "fedreg"
        not in write_report(tmp_path, tmp_path / "plain")[0].read_text().split("Left out")[0]
    )


def test_a_running_run_says_whether_a_serverapp_still_holds_it(tmp_path: Path) -> None:
    """Status ``running`` is what the ServerApp wrote last; the report asks the run
    folder's lock who holds it now: a live ServerApp (a real process here), none (it was
    killed: resumable), or no lock file at all (a record from before locks: unknown)."""
    fake_run(tmp_path, "t", "fedreg", 0, status="running")
    [folder] = [p.parent for p in tmp_path.glob("t/fedreg/seed0/*/results.json")]
    with held_elsewhere(folder):
        [run] = scan(tmp_path, unfinished=True).results
        assert run.state.startswith(f"running now ({SERVERAPP} since ")
    [run] = scan(tmp_path, unfinished=True).results
    assert run.state == "killed: status `running` but no ServerApp holds it; resumable"
    (folder / RUN_FOLDER_LOCK).unlink()
    [run] = scan(tmp_path, unfinished=True).results
    assert run.state.startswith("running (in progress when written, or killed")


def test_a_run_the_runner_stopped_reads_as_stopped_not_running(tmp_path: Path) -> None:
    """``stopped`` (written by the runner once the ServerApp is gone) is unfinished, and
    the report says why it stopped and that it resumes; ``running`` says it may be dead."""
    fake_run(tmp_path, "t", "fedreg", 0, run="", status="stopped", globals_=(0.5, 0.8, 0.6))
    document_path = tmp_path / "t" / "fedreg" / "seed0" / "results.json"
    document = json.loads(document_path.read_text())
    document["run"]["stopped"] = {"reason": "stopped by --max-minutes", "after_round": 3}
    document_path.write_text(json.dumps(document))
    fake_run(tmp_path, "t", "fedavg", 0, run="", status="running")
    assert collect(tmp_path) == []
    collection = scan(tmp_path, unfinished=True)
    assert all(r.unfinished for r in collection.results)
    note = collection.unfinished_note()
    assert "- t/fedreg/seed0: 3/5, stopped (stopped by --max-minutes; resumable)" in note
    assert "- t/fedavg/seed0: 3/5, running (in progress when written, or killed" in note


# --------------------------------------------------------- the paper's cells
def paper_config(tmp_path: Path, paper: str, name: str = "t") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[experiment]\nname = "{name}"\n\n[experiment.paper]\n{paper}\n')
    return path


def test_our_figures_stand_beside_the_papers_with_the_difference_in_points(
    tmp_path: Path,
) -> None:
    """Two seeds averaged, minus the published figure; the paper's cells in its order
    (one not run shows –), then a cell the paper lacks; an unfinished run stays marked."""
    fake_run(tmp_path, "t", "fedreg", 0, globals_=(0.5, 0.80, 0.6), personals=(0.9, 0.95, 0.9))
    fake_run(tmp_path, "t", "fedreg", 1, globals_=(0.5, 0.84, 0.6), personals=(0.9, 0.97, 0.9))
    fake_run(tmp_path, "t", "fedavg", 0, run="", status="running", globals_=(0.5, 0.7, 0.6))
    fake_run(tmp_path, "t", "lgfedavg", 0)
    fake_run(tmp_path, "other", "fedreg", 0)
    paper = read_paper_cells(paper_config(tmp_path, (
        'source = "paper X, Table 2"\n'
        "fedavg = { G = 84.27, P = 84.27 }\nditto = { P = 96.53 }\n"
        "fedreg = { G = 88.35, P = 97.52 }"
    )))  # fmt: skip
    table = paper_comparison(scan(tmp_path, unfinished=True).results, paper).splitlines()
    assert table[0].startswith("t against paper X, Table 2 (percent; differences in points")
    assert table[2] == "| cell | G | paper G | G − paper | P | paper P | P − paper | seeds |"
    assert table[4:8] == [
        "| fedavg | 70.00§ | 84.27 | -14.27 | 90.00§ | 84.27 | +5.73 | 1 |",
        "| ditto | – | – | – | – | 96.53 | – | 0 |",
        "| fedreg | 82.00 ± 2.83 | 88.35 | -6.35 | 96.00 ± 1.41 | 97.52 | -1.52 | 2 |",
        "| lgfedavg | 70.00 | – | – | 90.00 | – | – | 1 |",
    ]
    assert table[-1] == UNFINISHED_NOTE


@pytest.mark.parametrize(
    ("paper", "named"),
    [
        ("fedavg = { G = 84.27 }", "source must name where the figures come from"),
        ('source = "x"\nfedavg = 84.27', "experiment.paper.fedavg must be a table like"),
        ('source = "x"\nfedavg = { G = 84.27, Q = 1.0 }', "fedavg: unknown figure(s) Q"),
        ('source = "x"\nfedavg = { P = 184.27 }', "fedavg.P=184.27: expected a percentage"),
        ('source = "x"\nfedavg = { P = "84" }', "fedavg.P='84': expected a percentage"),
    ],
)
def test_a_bad_paper_table_is_refused_naming_file_and_key(
    tmp_path: Path, paper: str, named: str
) -> None:
    path = paper_config(tmp_path, paper)
    with pytest.raises(ConfigError) as refused:
        read_paper_cells(path)
    assert str(path) in str(refused.value) and named in str(refused.value)


def test_report_cli_adds_the_paper_and_refuses_a_config_without_one(tmp_path: Path, capsys) -> None:
    fake_run(tmp_path / "runs", "t", "fedreg", 0)
    good = paper_config(tmp_path, 'source = "paper X"\nfedreg = { G = 60.0, P = 80.0 }')
    out = tmp_path / "report"
    assert main([str(tmp_path / "runs"), "--paper", str(good), "--out", str(out)]) == 0
    table = (out / "table.md").read_text()
    assert "| fedreg | 70.00 | 60.00 | +10.00 | 90.00 | 80.00 | +10.00 | 1 |" in table
    (tmp_path / "none.toml").write_text('[experiment]\nname = "t"\n')
    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path / "runs"), "--paper", str(tmp_path / "none.toml")])
    assert exited.value.code == 2
    assert "none.toml: has no [experiment.paper] table" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "named"),
    [(b"\xff\xfe[experiment]", "is not TOML"), (b"experiment = 3\n", "'experiment' is 3")],
)
def test_a_paper_file_that_is_not_text_or_has_no_table_is_named(
    tmp_path: Path, content: bytes, named: str
) -> None:
    """A `--paper` file that is not UTF-8, or whose top level says `experiment = 3`, is
    refused naming the file (not a raw UnicodeDecodeError or TypeError)."""
    path = tmp_path / "paper.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=named) as refused:
        read_paper_cells(path)
    assert str(path) in str(refused.value)


def test_a_paper_file_of_another_setting_is_said_to_be_so(tmp_path: Path) -> None:
    """Runs of 20 clients and 3 rounds set beside a paper file that says 50 clients and
    100 rounds must not have the differences in points shown without a word. The keys
    the file sets are compared with the runs'; where it sets the runs' own setting,
    nothing is said."""
    fake_run(tmp_path / "runs", "t", "fedreg", 0)
    runs = scan(tmp_path / "runs").results
    other = tmp_path / "other.toml"
    other.write_text('num-server-rounds = 100\ndataset-path = "/elsewhere"\n[experiment]\n'
                     'name = "t"\nclients = 50\n[experiment.paper]\nsource = "X"\n'
                     "fedreg = { G = 60.0, P = 80.0 }\n")  # fmt: skip
    table = paper_comparison(runs, read_paper_cells(other))
    assert "not of the setting the paper's file gives" in table
    assert "num-server-rounds=3, not 100" in table and "clients=20, not 50" in table
    assert "dataset-path" not in table  # where the runs happened does not count
    rounds = runs[0].document["config"]["num-server-rounds"]
    same = tmp_path / "same.toml"
    same.write_text(other.read_text().replace("100", str(rounds)).replace("50", "20"))
    assert "not of the setting" not in paper_comparison(runs, read_paper_cells(same))


def test_every_papers_table_has_its_published_cells_in_its_config() -> None:
    """Each config of a paper table (1 to 6, thesis 5.3) holds that table's cells, keyed
    by the cells it runs (so every published figure meets one of ours), spot-checked
    against the source; a Table 2 file holds exactly its ten algorithms."""
    declared = declared_run_config()
    configs = Path(fedreg_app.__file__).parent.parent / "configs"
    spot = {
        "table1_augment_threshold": ("fedreg__augment-simple__threshold-mean", 60.40, 90.25),
        "table2_fmnist": ("fedreg", 88.35, 97.52),
        "table2_fmnist_cpu": ("fedreg", 88.35, 97.52),
        "table2_cifar10": ("fedreg", 58.12, 87.59),
        "table2_cifar100": ("fedreg", 24.73, 50.26),
        "table2_emnist": ("fedreg", 84.99, 95.84),
        **{f"table3_clients{n}": ("fedreg", g, p) for n, g, p in [
            (30, 60.50, 88.45), (50, 58.12, 87.59), (100, 57.70, 89.20),
            (200, 55.91, 88.90), (500, 54.42, 87.77)]},
        "table4_cifar10": ("fedreg__alpha-0.5", 62.15, 74.06),
        "table4_fmnist": ("fedreg__alpha-0.1", 88.21, 97.58),
        "table5_ablation": ("fedreg__variant-d", 55.04, None),
        "table6_testbed": ("fedreg", 86.12, 98.25),
        "thesis_table5_3_head_depth": (
            "fedreg__head-depth-2__fedreg-head-weight-original", 57.68, 89.76),
    }  # fmt: skip
    for name, (cell, g, p) in spot.items():
        experiment = Experiment.load(configs / f"{name}.toml", declared)
        assert experiment.paper is not None, name
        assert experiment.paper.experiment == experiment.name
        run = [cell_id(c) for c in experiment.cells()]
        assert set(experiment.paper.cells) <= set(run), name
        assert experiment.paper.cells[cell] == {"G": g, **({"P": p} if p else {})}, name
        if name.startswith("table2"):
            assert list(experiment.paper.cells) == list(experiment.algos) == run


def test_the_curves_draw_each_published_figure_as_a_line_at_its_value(
    tmp_path: Path, monkeypatch
) -> None:
    from matplotlib.axes import Axes

    drawn: list[float] = []
    monkeypatch.setattr(Axes, "axhline", lambda axis, y, **_: drawn.append(y))
    fake_run(tmp_path, "t", "fedreg", 0)
    fake_run(tmp_path, "t", "fedavg", 0)
    paper = read_paper_cells(
        paper_config(tmp_path, 'source = "X"\nfedreg = { G = 61.5, P = 82.0 }')
    )
    plot_accuracy_curves(collect(tmp_path), "t", tmp_path / "t.png", paper=paper)
    assert sorted(drawn) == [61.5, 82.0]  # fedavg has no published figure
    assert (tmp_path / "t.png").stat().st_size > 0


# ------------------------------------------------ what a published table may not mix
def test_figure_7_never_averages_runs_of_another_dataset_or_budget_into_one_point(
    tmp_path: Path,
) -> None:
    """fedreg at 50 clients on FMNIST and on CIFAR-10 (and on FMNIST with another budget)
    are not one point, the mean of the three: each setting is its own line. Table 3's
    batch size and partition, which the paper changes with the client count, stay one
    line."""
    cifar = {"dataset": "uoft-cs/cifar10"}
    fake_run(tmp_path, "f7_clients20", "fedreg", 0, clients=20, personals=(0.8, 0.8, 0.7))
    fake_run(tmp_path, "f7_clients50", "fedreg", 0, clients=50, personals=(0.7, 0.7, 0.7))
    fake_run(tmp_path, "t3_clients50", "fedreg", 0, clients=50, config=cifar,
             globals_=(0.1, 0.2, 0.07), personals=(0.7, 0.7, 0.7))  # fmt: skip
    fake_run(tmp_path, "t3_clients500", "fedreg", 0, clients=500,
             config={**cifar, "batch-size": 1, "partition": "dirichlet-topup"})  # fmt: skip
    fake_run(tmp_path, "long50", "fedreg", 0, clients=50, config={"local-epochs": 5},
             personals=(0.7, 0.7, 0.7))  # fmt: skip
    lines = log_ratio_lines(collect(tmp_path))
    assert lines == {
        "fedreg (f7_clients)": [(20, pytest.approx(np.log10(0.7 / 0.8))), (50, 0.0)],
        "fedreg (t3_clients)": [(50, pytest.approx(np.log10(0.2 / 0.7))),
                                (500, pytest.approx(np.log10(0.7 / 0.9)))],
        "fedreg (long50)": [(50, 0.0)],
    }  # fmt: skip


def test_seeds_run_with_another_number_of_clients_are_not_averaged(tmp_path: Path) -> None:
    """The client count is recorded under ``run``, not in the config: seeds of 50 and
    of 30 clients were averaged in one cell, with nothing said."""
    fake_run(tmp_path, "e", "fedreg", 0, clients=50, globals_=(0.5, 0.9, 0.6))
    fake_run(tmp_path, "e", "fedreg", 1, clients=50, globals_=(0.5, 0.8, 0.6))
    fake_run(tmp_path, "e", "fedreg", 2, clients=30, globals_=(0.5, 0.7, 0.6))
    fake_run(tmp_path, "e", "fedavg", 0, clients=30)
    collection = scan(tmp_path)
    assert [(r.cell, r.seed) for r in collection.results] == [("fedavg", 0), ("fedreg", 0),
                                                               ("fedreg", 1)]  # fmt: skip
    [other] = collection.skipped
    assert other.status == "other setting" and "clients=30, not 50" in other.error
    assert "`clients` is 30 (fedavg); 50 (fedreg)" in differing_settings(collection.results)


def test_a_figure_fewer_seeds_give_than_the_cell_has_says_how_many(tmp_path: Path) -> None:
    """The seeds column counts runs; a degraded seed with no complete round gives no G
    when the clients evaluate the global model. ``80.00 ± 14.14`` over 2 of 3 seeds was
    shown under ``seeds 3``."""
    fake_run(tmp_path, "e", "fedreg", 0, globals_=(0.5, 0.9, 0.6))
    fake_run(tmp_path, "e", "fedreg", 1, globals_=(0.5, 0.7, 0.6))
    fake_run(tmp_path, "e", "fedreg", 2, status="degraded", globals_=(None, None, None),
             personals=(None, None, None), answered=(0.3, 0.3, 0.3))  # fmt: skip
    table = paper_table(collect(tmp_path))
    assert "| fedreg | 80.00 ± 14.14† (2 of 3 seeds) | 70.00 ± 34.64†‡ | 3 |" in table
    assert ANSWERED_NOTE.startswith("‡ P over the clients that answered, for the seeds where")


@pytest.mark.parametrize("name", ["seed1-old", "seed01", "seed-1", "seedx"])
def test_a_folder_not_named_seed_k_is_named_and_counted_as_no_seed(
    tmp_path: Path, name: str
) -> None:
    """``seed1-old`` crashed the report (ValueError); ``seed01`` was read as seed 1 beside
    ``seed1``, so seed 1 was averaged twice."""
    fake_run(tmp_path, "e", "fedreg", 0, globals_=(0.5, 0.9, 0.6))
    fake_run(tmp_path, "e", "fedreg", 1, globals_=(0.5, 0.7, 0.6))
    copy = tmp_path / "e" / "fedreg" / name
    (tmp_path / "e" / "fedreg" / "seed1").rename(copy)
    fake_run(tmp_path, "e", "fedreg", 1, globals_=(0.5, 0.7, 0.6))
    collection = scan(tmp_path)
    assert [r.seed for r in collection.results] == [0, 1]
    [skipped] = collection.skipped
    assert skipped.seed_folder == copy and skipped.status == "invalid"
    assert "80.00 ± 14.14" in paper_table(collection.results)
    assert main([str(tmp_path), "--out", str(tmp_path / "report")]) == 0


def test_the_newest_run_of_a_seed_is_the_last_started_not_the_last_named(
    tmp_path: Path,
) -> None:
    """A copy in ``seed0/committed/`` sorted after the time-stamped run folders, so its
    older figures were reported over a newer run's."""
    fake_run(tmp_path, "e", "fedreg", 0, run="committed", globals_=(0.1, 0.3, 0.2))
    fake_run(tmp_path, "e", "fedreg", 0, run="20261125-101010_run", globals_=(0.1, 0.6, 0.2))
    for run, started in (("committed", "2026-11-20T10:00:00"),
                         ("20261125-101010_run", "2026-11-25T10:10:10")):  # fmt: skip
        path = tmp_path / "e" / "fedreg" / "seed0" / run / "results.json"
        document = json.loads(path.read_text())
        document["run"]["started"] = started
        path.write_text(json.dumps(document))
    [result] = collect(tmp_path)
    assert result.best_global == 0.6 and result.folder.name == "20261125-101010_run"


def test_a_sampled_p_is_not_set_against_the_papers_all_client_p(tmp_path: Path) -> None:
    fake_run(tmp_path, "t", "fedreg", 0, globals_=(0.5, 0.80, 0.6))
    paper = read_paper_cells(paper_config(tmp_path, (
        'source = "paper X"\nfedreg = { G = 88.35, P = 97.52 }'
    )))  # fmt: skip
    table = paper_comparison(collect(tmp_path), paper, personal="sampled")
    row = next(line for line in table.splitlines() if line.startswith("| fedreg |"))
    assert row.split(" | ")[5:7] == ["–", "–"]  # paper P, P − paper
    assert "-8.35" in row  # G against G stays
    assert "Paper P is left out" in table


def test_a_paper_of_an_experiment_not_under_the_root_says_so(tmp_path: Path) -> None:
    """``--paper configs/table2_fmnist.toml`` on a root of ``table2_fmnist_cpu`` runs
    printed a table of dashes with 0 seeds, as if nothing had run yet."""
    fake_run(tmp_path, "t_cpu", "fedreg", 0)
    paper = read_paper_cells(paper_config(tmp_path, 'source = "paper X"\nfedreg = { G = 88.35 }'))
    text = paper_comparison(collect(tmp_path), paper)
    assert text == ("t against paper X: no runs of the experiment 't' under this root "
                    "(experiments found: t_cpu)")  # fmt: skip


def test_a_folder_linked_to_another_cells_or_seeds_records_outside_the_root_is_refused(
    tmp_path: Path,
) -> None:
    """A cell folder `fedreg -> <elsewhere>/fedavg` checked where the link leads (FedAvg's
    records in FedAvg's folder: fine) but counted under the link's name would publish
    FedAvg's figures as FedReG's; a `seed2 -> seed0` elsewhere would count seed 0 twice.
    The records are checked where they are counted."""
    elsewhere, root = tmp_path / "elsewhere", tmp_path / "root"
    fake_run(elsewhere, "smoke", "fedavg", 0)
    fake_run(root, "smoke", "fedreg", 0)
    (root / "smoke" / "fedavg").mkdir()
    (root / "smoke" / "fedavg" / "seed1").symlink_to(elsewhere / "smoke" / "fedavg" / "seed0")
    (root / "smoke" / "gpfl").symlink_to(elsewhere / "smoke" / "fedavg")
    collection = scan(root)
    assert [(r.cell, r.seed) for r in collection.results] == [("fedreg", 0)]
    note = collection.skipped_note(root)
    assert "config.seed is 0 but the file lies in seed1" in note
    assert "gpfl" in note and "fedavg" in note


def test_a_failed_record_without_a_config_is_skipped_not_a_crash(tmp_path: Path) -> None:
    """Reading an earlier version's config (as_ran) must not index a failed record's
    config, which nothing checks: `{"run": {"status": "failed"}}` is skipped and named,
    not a KeyError in the report or the runner."""
    fake_run(tmp_path, "smoke", "fedreg", 0)
    fake_run(tmp_path, "smoke", "fedreg", 1)
    path = next((tmp_path / "smoke" / "fedreg" / "seed1").glob("*/results.json"))
    path.write_text(json.dumps({"run": {"status": "failed", "error": "x"}}))
    collection = scan(tmp_path)
    assert [r.seed for r in collection.results] == [0]
    assert "failed" in collection.skipped_note(tmp_path)


def test_the_keys_a_paper_file_varies_are_not_its_setting(tmp_path: Path) -> None:
    """A paper file's grid (alpha 0.1 and 0.5 over a top-level 0.1), its variants and
    algorithms are not its setting: its own alpha-0.5 cells are not said to be of another
    setting."""
    fake_run(tmp_path / "runs", "t", "fedreg__alpha-0.5", 0, config={"alpha": 0.5})
    runs = scan(tmp_path / "runs").results
    paper = tmp_path / "t.toml"
    paper.write_text('alpha = 0.1\nalgo = "fedavg"\nhead-depth = "auto"\n[experiment]\n'
                     'name = "t"\ngrid = { alpha = [0.1, 0.5] }\n[experiment.paper]\n'
                     'source = "X"\nfedreg = { G = 60.0, P = 80.0 }\n')  # fmt: skip
    assert "not of the setting" not in paper_comparison(runs, read_paper_cells(paper))


# ------------------------------------------------------------ several roots, one report
def test_several_roots_make_one_report_and_a_seed_under_two_is_refused(
    tmp_path: Path, capsys
) -> None:
    """Runners side by side, one ``--out`` each (e.g. four cells at once on one GPU):
    ``fedreg-report A B --out R`` gives one table of every cell, and a left-out
    seed is named under its root. The same seed of a cell under two roots is refused,
    naming both files' folders, not counted twice nor one picked in silence."""
    gpu, cpu = tmp_path / "gpu_fedrep", tmp_path / "cpu"
    fake_run(gpu, "table2", "fedrep", 0, globals_=(0.5, 0.6, 0.61))
    fake_run(cpu, "table2", "fedreg", 0, globals_=(0.5, 0.6, 0.72))
    fake_run(cpu, "table2", "fedavg", 0, status="failed", error="OOM\ntraceback")
    assert main([str(gpu), str(cpu), "--out", str(tmp_path / "report")]) == 0
    table = (tmp_path / "report" / "table.md").read_text()
    assert "| fedrep | 61.00 | 90.00 | 1 |" in table
    assert "| fedreg | 72.00 | 90.00 | 1 |" in table
    assert "- cpu/table2/fedavg/seed0: failed: OOM" in table
    assert (tmp_path / "report" / "table2_accuracy.png").is_file()
    # one root alone is reported as before, relative to itself
    assert main([str(cpu), "--out", str(tmp_path / "alone")]) == 0
    assert "- table2/fedavg/seed0: failed: OOM" in (tmp_path / "alone" / "table.md").read_text()
    capsys.readouterr()
    with pytest.raises(SystemExit):  # two roots and no --out: where would it go?
        main([str(gpu), str(cpu)])
    assert "--out is needed with 2 roots" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one root twice (here through a link)
        (tmp_path / "link").symlink_to(cpu)
        main([str(cpu), str(tmp_path / "link"), "--out", str(tmp_path / "twice")])
    assert f"the results root {tmp_path / 'link'} is given twice (as {cpu} too)" in (
        capsys.readouterr().err
    )
    fake_run(cpu, "table2", "fedrep", 0)  # the same seed run on the CPU too
    with pytest.raises(SystemExit):
        main([str(gpu), str(cpu), "--out", str(tmp_path / "both")])
    err = capsys.readouterr().err
    assert "table2/fedrep/seed0 has a run under two roots: " in err
    assert str(gpu / "table2" / "fedrep" / "seed0") in err
    assert str(cpu / "table2" / "fedrep" / "seed0") in err
    assert not (tmp_path / "both").exists()


def rounds_rows(report: Path, heading: str) -> dict[str, list[str]]:
    """The rows of one table of rounds.md, by cell: their cells after the cell column."""
    table = report.read_text().split(f"### {heading}")[1].split("###")[0]
    rows = [line.strip("|").split("|") for line in table.splitlines() if line.startswith("| t ")]
    return {row[2].strip(): [c.strip() for c in row[3:]] for row in rows}


def test_rounds_md_pairs_each_cell_with_fedreg_round_by_round(tmp_path: Path) -> None:
    """FedReG's G is above FedAvg's in 3 of 4 rounds (by +10, −10, +20, +10 points: +7.50
    on average; +0.00 over rounds 1-2, +15.00 over 3-4), its P in 3 (+30, +20, +10, −10:
    +12.50; +25.00 then +0.00); the same clients and data, so the pairing holds. A cell
    drawn on other clients, or other data, is paired but says it does not hold."""
    drawn = [[0, 1], [2, 3], [1, 4], [0, 3]]
    fake_run(tmp_path / "runs", "t", "fedreg", 0, globals_=(0.6, 0.5, 0.9, 0.8),
             personals=(0.8, 0.8, 0.8, 0.8), sampled=drawn, digest="d1")  # fmt: skip
    fake_run(tmp_path / "runs", "t", "fedavg", 0, globals_=(0.5, 0.6, 0.7, 0.7),
             personals=(0.5, 0.6, 0.7, 0.9), sampled=drawn, digest="d1")  # fmt: skip
    fake_run(tmp_path / "runs", "t", "fedprox", 0, globals_=(0.5, 0.6, 0.7, 0.7),
             personals=(0.5, 0.6, 0.7, 0.9), sampled=[[0, 1], [2, 3], [1, 2], [0, 4]],
             digest="d1")  # fmt: skip
    fake_run(tmp_path / "runs", "t", "fedrod", 0, globals_=(0.5, 0.6, 0.7, 0.7),
             personals=(0.5, 0.6, 0.7, 0.9), sampled=drawn, digest="d2")  # fmt: skip
    written = write_report(tmp_path / "runs", tmp_path / "report")
    rows = rounds_rows(tmp_path / "report" / "rounds.md", "Round by round against fedreg")
    assert set(rows) == {"fedavg", "fedprox", "fedrod"}  # not fedreg against itself
    assert rows["fedavg"][:7] == ["yes", "3/4", "+7.50", "+0.00 / +15.00", "3/4", "+12.50",
                                  "+25.00 / +0.00"]  # fmt: skip
    assert rows["fedprox"][0] == "no: other clients in 2 of 4 rounds"
    assert rows["fedrod"][0] == "no: other data"
    fake_run(tmp_path / "old", "t", "fedreg", 0, sampled=drawn[:3])
    fake_run(tmp_path / "old", "t", "fedavg", 0, sampled=drawn[:3])
    fake_run(tmp_path / "old", "t", "fedper", 0)
    write_report(tmp_path / "old", tmp_path / "old_report")
    old = rounds_rows(tmp_path / "old_report" / "rounds.md", "Round by round against fedreg")
    assert old["fedavg"][0] == "same clients; data not recorded"  # a record before digests
    assert old["fedper"][0] == "not recorded"
    assert tmp_path / "report" / "rounds.md" in written


def test_rounds_md_says_how_much_each_run_swings_after_half_its_rounds(tmp_path: Path) -> None:
    """Rounds 3-4 of 4: G 0.7 and 0.9 give median 80.00, lowest 70.00, std 14.14 (one
    change of G and P in those rounds: too few to correlate). Over rounds 5-8 of 8, a P
    that moves with G follows it at 1.00, one that moves against it at -1.00."""
    fake_run(tmp_path / "runs", "t", "fedreg", 0, globals_=(0.1, 0.2, 0.7, 0.9),
             personals=(0.5, 0.5, 0.6, 0.6))  # fmt: skip
    write_report(tmp_path / "runs", tmp_path / "report")
    rows = rounds_rows(tmp_path / "report" / "rounds.md", "The second half of the rounds")
    assert rows["fedreg"] == ["3-4", "80.00 / 70.00 / 14.14", "60.00 / 60.00 / 0.00", "–"]
    globals_ = (0.1, 0.2, 0.3, 0.4, 0.8, 0.6, 0.9, 0.5)
    fake_run(tmp_path / "long", "t", "fedreg", 0, globals_=globals_,
             personals=tuple(0.1 + g / 2 for g in globals_))  # fmt: skip
    fake_run(tmp_path / "long", "t", "fedrod", 0, globals_=globals_,
             personals=tuple(0.9 - g / 4 for g in globals_))  # fmt: skip
    write_report(tmp_path / "long", tmp_path / "long_report")
    rows = rounds_rows(tmp_path / "long_report" / "rounds.md", "The second half of the rounds")
    assert (rows["fedreg"][0], rows["fedreg"][3]) == ("5-8", "1.00")
    assert rows["fedrod"][3] == "-1.00"
    rounds = (tmp_path / "report" / "rounds.md").read_text()
    assert "No other cell ran on a seed of fedreg's" in rounds


def test_rounds_md_correlates_the_round_to_round_changes() -> None:
    """Two runs that rise and fall in the same rounds correlate at 1, opposite ones at −1."""
    from fedreg_tools.round_tables import changes_correlation

    together = [(1, 0.5, 0.4), (2, 0.7, 0.5), (3, 0.6, 0.45), (4, 0.9, 0.6)]
    opposite = [(k, a, -b) for k, a, b in together]
    assert changes_correlation(together) == "1.00"
    assert changes_correlation(opposite) == "-1.00"
    assert changes_correlation(together[:3]) == "–"  # two changes say nothing


def test_report_versus_names_its_cell_and_refuses_one_that_did_not_run(
    tmp_path: Path, capsys
) -> None:
    fake_run(tmp_path / "runs", "t", "fedreg", 0)
    fake_run(tmp_path / "runs", "t", "fedrod", 0)
    assert main([str(tmp_path / "runs"), "--versus", "fedrod"]) == 0
    rounds = (tmp_path / "runs" / "report" / "rounds.md").read_text()
    assert "### Round by round against fedrod" in rounds and "| fedreg |" in rounds
    with pytest.raises(SystemExit):
        main([str(tmp_path / "runs"), "--versus", "fedrep", "--out", str(tmp_path / "r2")])
    err = capsys.readouterr().err
    assert "--versus='fedrep' is not a cell of these runs: expected one of fedreg, fedrod" in err
    assert not (tmp_path / "r2").exists()  # refused before anything is written


def test_a_variant_run_apart_pairs_with_fedreg_only_where_the_pairing_holds(
    tmp_path: Path,
) -> None:
    """Options run as their own experiment (configs/table2_fmnist_fedreg_options.toml) are
    compared with the defaults' FedReG of the same seed when they drew the same data and
    clients, and named so; one on other clients is not paired with it."""
    drawn = [[0, 1], [2, 3], [1, 4]]
    fake_run(tmp_path / "defaults", "t", "fedreg", 0, sampled=drawn, digest="d1")
    fake_run(tmp_path / "options", "t_options", "fedreg__variant-fresh", 0,
             globals_=(0.4, 0.5, 0.6), sampled=drawn, digest="d1")  # fmt: skip
    fake_run(tmp_path / "options", "t_options", "fedreg__variant-other", 0,
             sampled=[[0, 1], [2, 3], [1, 2]], digest="d1")  # fmt: skip
    write_report([tmp_path / "defaults", tmp_path / "options"], tmp_path / "report")
    text = (tmp_path / "report" / "rounds.md").read_text()
    table = text.split("### Round by round against fedreg")[1].split("###")[0]
    rows = [line for line in table.splitlines() if line.startswith("| t")]
    assert rows == [
        "| t_options | 0 | fedreg variant-fresh (against t's) | yes | 3/3 | +10.00 | "
        "+10.00 / +10.00 | 0/3 | +0.00 | +0.00 / +0.00 | – |"
    ]  # three rounds give two changes: too few to correlate


def test_report_cells_keeps_only_the_cells_named_and_refuses_an_unknown_one(
    tmp_path: Path, capsys
) -> None:
    """Seeds 0-1 of two cells beside seed 0 of a third: ``--cells`` reports the two alone
    (table, rounds and left-out folders), a variant named as the table prints it; a name
    that is no cell is refused before anything is written, naming the cells there are."""
    for seed in (0, 1):
        fake_run(tmp_path / "runs", "t", "fedreg", seed)
        fake_run(tmp_path / "runs", "t", "fedreg__variant-a", seed)
    fake_run(tmp_path / "runs", "t", "fedavg", 0)
    fake_run(tmp_path / "runs", "t", "fedavg", 1, status="failed", error="boom")
    out = tmp_path / "r"
    assert main([str(tmp_path / "runs"), "--cells", "fedreg, fedreg variant-a",
                 "--out", str(out)]) == 0  # fmt: skip
    table = (out / "table.md").read_text()
    rows = [line.split(" | ")[0].strip("| ") for line in table.splitlines()[2:] if "|" in line]
    assert rows == ["fedreg", "fedreg variant-a"]
    assert "fedavg" not in table  # neither its row nor its failed seed among the left out
    assert "fedavg" not in (out / "rounds.md").read_text()
    paper = tmp_path / "paper.toml"
    paper.write_text('[experiment]\nname = "t"\n[experiment.paper]\nsource = "000"\n'
                     "fedavg = { G = 80.0, P = 80.0 }\n"
                     "fedreg = { G = 60.0, P = 90.0 }\n")  # fmt: skip
    assert main([str(tmp_path / "runs"), "--cells", "fedreg", "--paper", str(paper),
                 "--out", str(tmp_path / "p")]) == 0  # fmt: skip
    compared = (tmp_path / "p" / "table.md").read_text().split("against 000")[1]
    assert "| fedreg | 70.00 ± 0.00 | 60.00 | +10.00 |" in compared  # best G 0.7, two seeds
    assert "fedavg" not in compared  # a published cell left out is not a row of dashes
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "all")]) == 0
    assert "fedavg/seed1: failed: boom" in (tmp_path / "all" / "table.md").read_text()
    for bad, says in [("fedreg,fedrep", "--cells: 'fedrep' not a cell of these runs: "
                       "expected some of fedavg, fedreg, fedreg__variant-a"),
                      ("fedreg,,fedavg", "comma-separated cells, each once"),
                      ("fedreg,fedreg", "comma-separated cells, each once")]:  # fmt: skip
        with pytest.raises(SystemExit):
            main([str(tmp_path / "runs"), "--cells", bad, "--out", str(tmp_path / "bad")])
        assert says in capsys.readouterr().err
        assert not (tmp_path / "bad").exists()
    with pytest.raises(SystemExit):  # a --versus the named cells leave out
        main([str(tmp_path / "runs"), "--cells", "fedreg", "--versus", "fedavg",
              "--out", str(tmp_path / "bad")])  # fmt: skip
    assert "--versus='fedavg' is not a cell of these runs: expected one of fedreg" in (
        capsys.readouterr().err
    )


# ---------------------------------------------------------- one run on its own
def run_folder(tmp_path: Path, name: str, cell: str = "fedreg", seed: int = 0, **kwargs) -> Path:
    """A run folder as ``flwr run`` writes it, ``<results-dir>/<time>_..._run<id>/``: not
    the runner's layout (no experiment, cell or seed folders)."""
    fake_run(tmp_path / "made", "e", cell, seed, run="r", **kwargs)
    folder = tmp_path / "results" / name
    folder.parent.mkdir(exist_ok=True)
    (tmp_path / "made" / "e" / cell / f"seed{seed}" / "r").rename(folder)
    return folder


def test_a_run_folder_is_reported_on_its_own(tmp_path: Path, capsys) -> None:
    """The best (with its round), final and last-10 mean of G and P, status and rounds;
    costs and curves, in the run folder's report/ by default; the files named."""
    name = "20261203-210922_fedreg_fashion_mnist_a0.1_s0_run7"
    folder = run_folder(tmp_path, name, globals_=tuple(k / 100 for k in range(1, 13)),
                        personals=tuple((90 - k) / 100 for k in range(12)))  # fmt: skip
    document = json.loads((folder / "results.json").read_text())
    clients = {str(k): (k + 1) / 20 for k in range(20)}  # 5 %, 10 %, ... 100 %
    document["rounds"][-1]["client_accuracies"] = clients
    (folder / "results.json").write_text(json.dumps(document))
    assert main([str(folder)]) == 0
    out = folder / "report"
    table = (out / "table.md").read_text().splitlines()
    assert table[0] == ("| run | status | rounds | G best | G final | G last 10 | P best | "
                        "P final | P last 10 | P per client | worst | bottom 10% |")  # fmt: skip
    # G 1..12 %: the last 10 are 3..12; P 90..79 %: the last 10 are 88..79; the clients'
    # unweighted mean 52.5 %, the lowest 5 %, the lowest two (a tenth of 20) 7.5 %
    assert table[2] == ("| fedreg seed0 | completed | 12/12 | 12.00 (r12) | 12.00 (r12) | 7.50 "
                        "| 90.00 (r1) | 79.00 (r12) | 83.50 | 52.50 | 5.00 | 7.50 |")  # fmt: skip
    assert f"- fedreg seed0: {folder / 'results.json'}; completed" in table
    costs = (out / "costs.md").read_text().splitlines()
    assert costs[0].startswith("| run folder | run | MB to clients |")
    assert costs[2] == f"| {name} | fedreg seed0 | 4.0 | 1.0 | 2.0 / 1.0 | 0.0 | 0.0 | 3.0 | 1 |"
    assert (
        (out / "runs.md")
        .read_text()
        .splitlines()[2]
        .startswith(f"| {name} | fedreg seed0 | 0 | completed | 12/12 |")
    )
    with Image.open(out / "accuracy.png") as image:
        assert image.format == "PNG" and image.width > 400 and image.height > 300
    printed = capsys.readouterr().out
    for file in ("table.md", "costs.md", "runs.md", "accuracy.png"):
        assert f"wrote {out / file}\n" in printed
    # its results.json names the same run; --out puts the report elsewhere
    assert main([str(folder / "results.json"), "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "table.md").read_text().splitlines()[2] == table[2]


def test_running_and_failed_runs_are_reported_as_far_as_they_got(tmp_path: Path) -> None:
    """A newcomer plots what a run has: a running run (given by its results.json) and a
    failed one side by side, each with its status, rounds done and what its status says."""
    running = run_folder(tmp_path, "a_run1", status="running")
    failed = run_folder(tmp_path, "b_run2", seed=1, status="failed", error="boom\nmore",
                        globals_=(0.4, 0.5, None), personals=(0.6, 0.7, None))  # fmt: skip
    out = tmp_path / "report"
    written = write_run_report([running / "results.json", failed], out)
    assert [p.name for p in written] == ["table.md", "costs.md", "runs.md", "accuracy.png"]
    table = (out / "table.md").read_text()
    assert ("| fedreg seed0 | running | 3/5 | 70.00 (r3) | 70.00 (r3) | 60.00 | 90.00 (r3) "
            "| 90.00 (r3) | 85.00 |") in table  # fmt: skip
    assert ("| fedreg seed1 | failed | 3/5 | 50.00 (r2) | 50.00 (r2) | 45.00 | 70.00 (r2) "
            "| 70.00 (r2) | 65.00 |") in table  # fmt: skip
    assert f"- fedreg seed0: {running / 'results.json'}; running (in progress" in table
    assert f"- fedreg seed1: {failed / 'results.json'}; failed: boom\n" in table


def test_runs_given_one_by_one_are_named_checked_and_not_mixed_with_roots(
    tmp_path: Path, capsys
) -> None:
    """Two runs of one algorithm and seed are numbered; a run given twice, a root beside a
    run, a root's options with runs and several runs without --out are refused; a run
    with no round yet gives its table and says why there are no curves."""
    first = run_folder(tmp_path, "a_run1")
    second = run_folder(tmp_path, "b_run2", globals_=(), personals=(), status="running")
    written = write_run_report([first, second], tmp_path / "two")
    rows = [line.split(" | ")[0] for line in (tmp_path / "two" / "table.md").read_text()
            .splitlines()[2:4]]  # fmt: skip
    assert rows == ["| fedreg seed0 (1)", "| fedreg seed0 (2)"]
    assert written[-1].name == "accuracy.png"
    written = write_run_report([second], tmp_path / "empty")
    assert [p.name for p in written] == ["table.md", "costs.md", "runs.md"]
    assert "No evaluated round yet" in written[0].read_text()
    fake_run(tmp_path / "root", "e", "fedreg", 0)
    for argv, says in [
        ([first, first / "results.json", "--out", tmp_path / "x"], "given twice"),
        ([first, tmp_path / "root", "--out", tmp_path / "x"], "not both"),
        ([first, "--cells", "fedreg"], "read the cells of a results root"),
        ([first, second], "--out is needed with 2 runs"),
        ([tmp_path / "nowhere"], "no such file or folder"),
    ]:
        with pytest.raises(SystemExit):
            main([str(arg) for arg in argv])
        assert says in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_degraded_runs_line_says_which_kind_of_fault_degraded_it(tmp_path: Path) -> None:
    """Under a run's table: not only "degraded" but what did it (replies refused, with
    the gist of the reason; private state reset, with the records), rounds, partitions."""
    from fedreg_tools.report_tables import run_table

    fake_run(tmp_path, "smoke", "fedreg", 0, status="degraded")
    [path] = list(tmp_path.rglob("results.json"))
    document = json.loads(path.read_text())
    last = document["rounds"][-1]
    last["errors"] = [{"phase": "train", "error": "its update of base has L2 norm 1.9e+30, "
                       "more than update-norm-factor=100 times 2.1, the median of the round's "
                       "other replies", "nodes": [7], "partitions": [4]}]  # fmt: skip
    last["state_resets"] = 1
    last["state_reset_records"] = [{"partition": 2, "phase": "train", "records": ["head_p"]}]
    path.write_text(json.dumps(document))
    table = run_table(collect(tmp_path))
    assert ("degraded: train replies failed or refused (its update of base has L2 norm "
            "1.9e+30, more than update-norm-factor=100 times …): rounds 3, partitions 4; "
            "private state started afresh (head_p): rounds 3, partitions 2") in table  # fmt: skip
