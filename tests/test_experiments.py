"""The experiment runner: planning, resuming, mean ± std over seeds, and what it does with
degraded and failed runs."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fedreg_app import experiments
from fedreg_app.config import ConfigError
from fedreg_app.experiments import (
    Experiment,
    RunSpec,
    cell_id,
    main,
    markdown_table,
    plan,
    summarize,
    write_run_config,
)
from fedreg_app.overrides import declared_overrides, declared_run_config, parse_overrides
from fedreg_app.reports import ANSWERED_NOTE, DEGRADED_NOTE, mean_std

DECLARED = declared_run_config()


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def grid_experiment(tmp_path: Path) -> Experiment:
    config = write(
        tmp_path / "t1.toml",
        """
num-server-rounds = 3
[experiment]
name = "t1"
clients = 7
algos = ["fedreg", "fedavg"]
seeds = 2
grid = { augment = ["auto", "simple"], threshold = ["mean", "max"] }
""",
    )
    return Experiment.load(config, DECLARED)


def test_grid_times_algorithms_times_seeds(tmp_path: Path) -> None:
    specs = plan([grid_experiment(tmp_path)], tmp_path / "out", DECLARED, {})
    assert len(specs) == 2 * 2 * 2 * 2
    assert [s.seed for s in specs[:8]] == [0] * 8  # seed-major
    cells = {cell_id(s.cell) for s in specs}
    assert "fedreg__augment-simple__threshold-mean" in cells and len(cells) == 8
    spec = specs[0]
    assert spec.clients == 7 and spec.run_config["num-server-rounds"] == 3
    assert spec.run_config["results-dir"] == str(spec.folder.resolve())
    assert spec.folder == tmp_path / "out" / "t1" / cell_id(spec.cell) / "seed0"


def test_overrides_and_cli_choices_win(tmp_path: Path) -> None:
    for name in ("train.parquet", "test.parquet"):
        (tmp_path / name).touch()
    specs = plan(
        [grid_experiment(tmp_path)],
        tmp_path,
        DECLARED,
        {"local-epochs": 2, "dataset-path": str(tmp_path)},
        seeds=1,
        algos=("ditto",),
    )
    assert len(specs) == 4 and {s.cell["algo"] for s in specs} == {"ditto"}
    assert all(s.run_config["local-epochs"] == 2 for s in specs)
    assert all(Path(s.run_config["dataset-path"]).is_absolute() for s in specs)


def test_a_bad_cell_fails_the_plan_before_any_run(tmp_path: Path) -> None:
    config = write(tmp_path / "bad.toml", "[experiment]\ngrid = { alpha = [0.5, 0.0] }\n")
    with pytest.raises(ConfigError, match="alpha=0.0"):
        plan([Experiment.load(config, DECLARED)], tmp_path, DECLARED, {})
    typo = write(tmp_path / "typo.toml", "num-rounds = 3\n")
    with pytest.raises(ConfigError, match="num-rounds"):
        Experiment.load(typo, DECLARED)


def test_written_run_config_is_flat_toml(tmp_path: Path) -> None:
    values = {"algo": "fedreg", "alpha": 0.5, "seed": 3, "fedreg-rebalance": False}
    path = write_run_config({**values, "results-dir": "/tmp/x y"}, tmp_path)
    assert tomllib.loads(path.read_text()) == {**values, "results-dir": "/tmp/x y"}


def test_parse_overrides() -> None:
    assert parse_overrides(["alpha=0.5", "algo=fedavg", "dataset-path=../data", "x=true"]) == {
        "alpha": 0.5,
        "algo": "fedavg",
        "dataset-path": "../data",
        "x": True,
    }
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["alpha"])


def fake_result(folder: Path, status: str, g: float, p: float) -> None:
    run = folder / f"run-{status}"
    run.mkdir(parents=True)
    document = {"run": {"status": status}, "rounds": [{}, {}],
                "best_global_accuracy": g, "best_personal_accuracy": p}  # fmt: skip
    (run / "results.json").write_text(json.dumps(document))


def test_completed_runs_are_found_and_summarised(tmp_path: Path) -> None:
    specs = plan([grid_experiment(tmp_path)], tmp_path / "out", DECLARED, {}, algos=("fedreg",))
    first_cell = [s for s in specs if s.cell == specs[0].cell]
    fake_result(first_cell[0].folder, "completed", 0.80, 0.90)
    fake_result(first_cell[1].folder, "failed", 0.10, 0.10)  # interrupted: to be rerun
    fake_result(first_cell[1].folder, "completed", 0.84, 0.92)
    for spec in specs:
        spec.result = spec.finished_results()
    assert first_cell[1].result["best_global_accuracy"] == 0.84
    assert first_cell[1].rounds_done() == 2
    summary = summarize(specs)
    assert len(summary) == 4 and summary[0].complete and not summary[1].complete
    table = markdown_table(summary)
    assert "| t1 | fedreg | auto | mean | 82.00 ± 2.83 | 91.00 ± 1.41 | 2/2 |" in table
    assert "| – | – | 0/2 |" in table


def test_mean_std() -> None:
    assert mean_std((0.5,)) == "50.00"
    assert mean_std(()) == "–"
    assert mean_std((0.8, 0.84)) == "82.00 ± 2.83"


def test_cli_dry_run_and_errors(tmp_path: Path, capsys) -> None:
    config = grid_experiment(tmp_path)
    path = tmp_path / "t1.toml"
    assert config.name == "t1"
    assert main([str(path), "--dry-run", "--seeds", "1", "--out", str(tmp_path / "o")]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 8
    with pytest.raises(SystemExit):
        main([str(path), "--set", "nonsense-key=1"])
    assert "nonsense-key" in capsys.readouterr().err


def test_an_unknown_set_key_names_the_closest_declared_key(tmp_path: Path, capsys) -> None:
    with pytest.raises(ConfigError, match=r"'pxor-mu' .*did you mean 'prox-mu'"):
        declared_overrides(["pxor-mu=0.1"], DECLARED)
    grid_experiment(tmp_path)
    with pytest.raises(SystemExit):
        main([str(tmp_path / "t1.toml"), "--set", "pxor-mu=0.1", "--dry-run"])
    err = capsys.readouterr().err
    assert "'pxor-mu'" in err and "did you mean 'prox-mu'" in err


def test_an_unknown_key_in_a_config_file_names_the_file_and_the_closest_key(
    tmp_path: Path,
) -> None:
    typo = write(tmp_path / "typo.toml", "[experiment]\ngrid = { num-rounds = [3] }\n")
    with pytest.raises(ConfigError, match=r"'num-rounds' .*typo.toml.*'num-server-rounds'"):
        Experiment.load(typo, DECLARED)


# ------------------------------------------------------- degraded and failed runs
def results_document(status: str, **summary: Any) -> dict[str, Any]:
    """A results.json as the ServerApp writes it (the fields the runner and report read)."""
    partial = status == "degraded"
    rounds = [] if status == "failed" else [
        {"round": 1, "global_accuracy": 0.5, "personal_accuracy": None if partial else 0.7,
         "personal_accuracy_answered": 0.7, "train_seconds": 1.0, "eval_seconds": 1.0,
         "train_replies": 2 if partial else 3, "train_failures": 1 if partial else 0,
         "eval_replies": 2 if partial else 3, "eval_failures": 1 if partial else 0,
         "errors": [{"phase": "train", "error": "client crashed", "nodes": [7],
                     "partitions": [2]}] if partial else [],
         "personal_coverage": {"clients": 2 if partial else 3, "of_clients": 3,
                               "test_samples": 20 if partial else 30, "of_test_samples": 30}},
    ]  # fmt: skip
    return {
        "config": {"algo": "fedreg", "dataset": "zalando-datasets/fashion_mnist", "alpha": 0.1,
                   "fraction-train": 0.25, "local-epochs": 1, "batch-size": 10},
        "run": {"status": status, "num_clients": 3,
                **({"error": "RuntimeError: CUDA out of memory\nsecond line"}
                   if status == "failed" else {})},
        "rounds": rounds,
        "best_global_accuracy": 0.5 if rounds else None,
        "best_personal_accuracy": None if partial or not rounds else 0.7,
        "best_personal_accuracy_answered": 0.7 if rounds else None,
        **summary,
    }  # fmt: skip


def write_results(
    spec: RunSpec, status: str, run: str = "20250101-000000_run1", **summary: Any
) -> None:
    """Lay a run out as the runner does: <out>/<experiment>/<cell>/seed<k>/<run>/."""
    folder = spec.folder / run
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(results_document(status, **summary)))


def one_cell_specs(tmp_path: Path, seeds: int) -> list[RunSpec]:
    config = write(tmp_path / "t2.toml", f"[experiment]\nname = 't2'\nseeds = {seeds}\n")
    return plan([Experiment.load(config, DECLARED)], tmp_path / "out", DECLARED, {})


def test_degraded_runs_count_as_finished_and_failed_ones_do_not(tmp_path: Path) -> None:
    completed, degraded, failed, missing, retried = one_cell_specs(tmp_path, 5)
    write_results(completed, "completed")
    write_results(degraded, "degraded")
    write_results(failed, "failed")
    write_results(retried, "failed", run="20250101-000000_run1")
    write_results(retried, "running", run="20250102-000000_run2")  # killed on the rerun
    assert completed.finished_results()["run"]["status"] == "completed"
    assert degraded.finished_results()["run"]["status"] == "degraded"
    assert failed.finished_results() is None and missing.finished_results() is None
    assert retried.finished_results() is None
    assert "CUDA out of memory" in failed.failure()
    assert str(failed.folder / "20250101-000000_run1") in failed.failure()
    assert "no results.json" in missing.failure()
    assert "still 'running'" in retried.failure() and "run2" in retried.failure()


def test_a_degraded_run_after_a_failed_one_is_the_seeds_result(tmp_path: Path) -> None:
    (spec,) = one_cell_specs(tmp_path, 1)
    write_results(spec, "failed", run="20250101-000000_run1")
    write_results(spec, "degraded", run="20250102-000000_run2", best_global_accuracy=0.55)
    assert spec.finished_results()["best_global_accuracy"] == 0.55


def test_table_marks_degraded_cells_and_answered_only_personal_figures(tmp_path: Path) -> None:
    specs = plan([grid_experiment(tmp_path)], tmp_path / "out", DECLARED, {}, algos=("fedreg",))
    first, second = [s for s in specs if s.cell == specs[0].cell]
    other = next(s for s in specs if s.cell != specs[0].cell)
    write_results(first, "completed", best_global_accuracy=0.80, best_personal_accuracy=0.90)
    write_results(second, "degraded", best_global_accuracy=0.84,
                  best_personal_accuracy=None, best_personal_accuracy_answered=0.92)  # fmt: skip
    # Degraded, but with complete rounds: its all-client P exists and is the one shown.
    write_results(other, "degraded", best_global_accuracy=0.5, best_personal_accuracy=0.6,
                  best_personal_accuracy_answered=0.99)  # fmt: skip
    for spec in specs:
        spec.result = spec.finished_results()
    table = markdown_table(summarize(specs))
    assert "| 82.00 ± 2.83† | 91.00 ± 1.41†‡ | 2/2 (1 degraded) |" in table
    assert "| 50.00† | 60.00† | 1/2 (1 degraded) |" in table  # not 99.00: answered-only
    assert "| – | – | 0/2 |" in table  # nothing to mark
    assert DEGRADED_NOTE in table and ANSWERED_NOTE in table
    assert table.index(ANSWERED_NOTE) > table.index("| – | – | 0/2 |")  # under the table


def test_table_without_degraded_runs_has_no_marks_or_notes(tmp_path: Path) -> None:
    (spec,) = one_cell_specs(tmp_path, 1)
    write_results(spec, "completed")
    spec.result = spec.finished_results()
    table = markdown_table(summarize([spec]))
    assert "†" not in table and "‡" not in table and table.endswith("| 50.00 | 70.00 | 1/1 |")


class FakeSuperLink:
    """Stands in for LocalSuperLink: records which runs were started and lets each "run"
    leave what the test says (a failed results.json, a degraded one, or nothing)."""

    started: list[str] = []
    outcome: dict[str, str] = {}  # seed folder name -> status written by the "run"

    def __init__(self, home: Path) -> None:
        self.home = home

    def __enter__(self) -> FakeSuperLink:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run_polling(
        self, config_file: str, clients: int, log_path: Path, poll: float
    ) -> Iterator[None]:
        folder = Path(tomllib.loads(Path(config_file).read_text())["results-dir"])
        FakeSuperLink.started.append(folder.name)
        status = FakeSuperLink.outcome.get(folder.name)
        if status is not None:
            run = folder / "20250103-000000_run3"
            run.mkdir()
            (run / "results.json").write_text(json.dumps(results_document(status)))
        yield


def test_runner_reruns_failed_runs_lists_them_and_exits_non_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    config = write(tmp_path / "t2.toml", "[experiment]\nname = 't2'\nseeds = 4\n")
    out = tmp_path / "out"
    completed, degraded, failed, missing = plan(
        [Experiment.load(config, DECLARED)], out, DECLARED, {}
    )
    write_results(completed, "completed")
    write_results(degraded, "degraded")
    write_results(failed, "failed")
    monkeypatch.setattr(experiments, "LocalSuperLink", FakeSuperLink)
    monkeypatch.setattr(FakeSuperLink, "started", [])
    # The failed seed fails again; the missing one crashes before writing anything.
    monkeypatch.setattr(FakeSuperLink, "outcome", {"seed2": "failed"})
    assert main([str(config), "--out", str(out)]) == 1
    assert FakeSuperLink.started == ["seed2", "seed3"]  # finished runs are not rerun
    printed = capsys.readouterr()
    assert "2 of 4 runs already finished; 2 to run" in printed.out
    assert "| 50.00 ± 0.00† | 70.00 ± 0.00†‡ | 2/4 (1 degraded) |" in printed.out
    assert DEGRADED_NOTE in (out / "summary.md").read_text()
    assert "wrote" in printed.out and (out / "report" / "table.md").is_file()
    report = printed.err[printed.err.index("2 of 4 runs failed") :]
    assert f"{failed.describe()}: {failed.folder / '20250103-000000_run3'} (failed)" in report
    assert "error: RuntimeError: CUDA out of memory" in report
    assert f"{missing.describe()}: no results.json in {missing.folder}" in report
    assert completed.describe() not in report and degraded.describe() not in report


def test_runner_exits_zero_when_every_run_finished_even_degraded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    config = write(tmp_path / "t2.toml", "[experiment]\nname = 't2'\nseeds = 2\n")
    out = tmp_path / "out"
    first, _ = plan([Experiment.load(config, DECLARED)], out, DECLARED, {})
    write_results(first, "degraded")
    monkeypatch.setattr(experiments, "LocalSuperLink", FakeSuperLink)
    monkeypatch.setattr(FakeSuperLink, "started", [])
    monkeypatch.setattr(FakeSuperLink, "outcome", {"seed1": "degraded"})
    assert main([str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert FakeSuperLink.started == ["seed1"]
    assert (
        "done: t2 fedreg seed 1 | degraded | best global 0.5000 | best personal 0.7000 "
        "(over the clients that answered)" in printed.out
    )
    assert "| 50.00 ± 0.00† | 70.00 ± 0.00†‡ | 2/2 (2 degraded) |" in printed.out
    assert "failed" not in printed.err


@pytest.mark.e2e
def test_runner_runs_resumes_and_summarises(grey_dataset: Path, tmp_path: Path, capsys) -> None:
    config = write(
        tmp_path / "tiny.toml",
        f"""
algo = "fedavg"
dataset-path = "{grey_dataset}"
num-server-rounds = 2
local-epochs = 1
fraction-train = 0.5
min-partition-size = 5
[experiment]
name = "tiny"
clients = 4
seeds = 2
""",
    )
    out = tmp_path / "out"
    assert main([str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "0 of 2 runs already finished; 2 to run" in printed
    assert "[run 2/2 | round 2/2]" in printed
    summary = (out / "summary.md").read_text()
    assert "| tiny | fedavg |" in summary and "2/2 |" in summary
    # Resume: a completed grid runs nothing again.
    assert main([str(config), "--out", str(out)]) == 0
    assert "2 of 2 runs already finished; 0 to run" in capsys.readouterr().out


def test_variants_are_named_cells_with_their_own_overrides(tmp_path: Path) -> None:
    config = write(
        tmp_path / "t5.toml",
        """
[experiment]
clients = 20
variants = { fedreg = {}, a = { fedreg-head-weight = "original" }, fedavg = { algo = "fedavg" } }
""",
    )
    specs = plan([Experiment.load(config, DECLARED)], tmp_path, DECLARED, {})
    assert [(s.cell["algo"], s.cell["variant"]) for s in specs] == [
        ("fedreg", "fedreg"),
        ("fedreg", "a"),
        ("fedavg", "fedavg"),
    ]
    assert specs[1].run_config["fedreg-head-weight"] == "original"
    assert "fedreg-head-weight" not in specs[0].run_config
    assert specs[2].run_config["algo"] == "fedavg"
    assert specs[1].folder.parent.name == "fedreg__variant-a"
