"""The experiment runner: planning, resuming, mean ± std over seeds, and what it does with
degraded and failed runs."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedreg_app.core import persist
from fedreg_app.core.checkpoint import Checkpoint, clients_record
from fedreg_app.core.config import ConfigError
from fedreg_app.core.data import PartitionKey, split_digests, split_sizes
from fedreg_app.core.metrics import BEST_OF, ResultsWriter, RoundRecord, round_fields, rounds_sha256
from fedreg_app.core.protocol import is_valid_state_key
from fedreg_app.registry import load_config
from fedreg_app.server_app import run_folder
from fedreg_tools import experiments, runner_decisions, runner_progress, runner_session
from fedreg_tools.experiments import EXIT_BUSY, main
from fedreg_tools.launcher import ClientResources, LocalSuperLink, kill_tree, processes_naming
from fedreg_tools.overrides import declared_overrides, declared_run_config, parse_overrides
from fedreg_tools.report_tables import ANSWERED_NOTE, DEGRADED_NOTE, mean_std
from fedreg_tools.run_records import cell_problem
from fedreg_tools.runner_decisions import (
    decide,
    never_resumed,
    pending_state,
    read_marker,
    tidy,
    write_marker,
)
from fedreg_tools.runner_plan import (
    Experiment,
    RunSpec,
    cell_id,
    checkpoint_round,
    plan,
    seed_numbers,
    write_run_config,
)
from fedreg_tools.runner_progress import RECENT_ROUNDS, Progress, cell_key, recorded_seconds
from fedreg_tools.runner_session import RUNNER_LOCK
from fedreg_tools.runner_summary import EXIT_FAILED, CellSummary, markdown_table, summarize
from tests.fake_data import copy_dataset
from tests.holders import SERVERAPP, held_elsewhere

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


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ("name = '../../outside'", "name='../../outside' is not allowed: expected a folder"),
        ("name = '/abs'", "name='/abs' is not allowed"),
        ("clients = 'many'", "clients='many' is not allowed: expected an integer >= 1"),
        ("seeds = 2.9", "seeds=2.9 is not allowed: expected an integer >= 1"),
        ("seeds = true", "seeds=True is not allowed"),
        ("seeds = 1001", "seeds=1001 is not allowed: expected an integer from 1 to 1000"),
        ("algos = 'fedavg'", "algos='fedavg' is not allowed: expected a list of algorithm"),
        ("grid = { alpha = 0.5 }", "grid={'alpha': 0.5} is not allowed"),
        ("variants = { a = 1 }", "variants={'a': 1} is not allowed: expected a table of tables"),
        (
            "seed = 3",
            "'seed' is not one of its keys (name, clients, algos, seeds, grid, "
            "variants, paper); did you mean 'seeds'?",
        ),
    ],
)
def test_a_bad_experiment_table_is_refused_naming_the_key(
    tmp_path: Path, table: str, problem: str, capsys
) -> None:
    """A name such as `../../x` (it would put runs outside `--out`, where its lock does
    not reach), `seeds = 2.9` (2 seeds), `algos = 'fedavg'` (split into letters) and a
    string where a number belongs (a traceback) are refused: exit 2, naming the key."""
    config = write(tmp_path / "bad.toml", f"[experiment]\n{table}\n")
    with pytest.raises(ConfigError, match=re.escape(problem)):
        Experiment.load(config, DECLARED)
    with pytest.raises(SystemExit) as exited:
        main([str(config), "--out", str(tmp_path / "out")])
    assert exited.value.code == 2
    assert problem in capsys.readouterr().err and not (tmp_path / "outside").exists()


@pytest.mark.parametrize(
    ("toml", "overrides", "named"),
    [
        ("grid = { alpha = [0.1, 0.5] }", {"alpha": 1.0}, "config alpha=1.0 but its runs"),
        ("grid = { seed = [5] }", {}, "config seed=0 but its runs"),
        ("", {"algo": "fedavg"}, "config.algo is 'fedavg' but its runs would lie in cell 'fedreg'"),
    ],
    ids=["set-on-a-grid-key", "grid-sets-seed", "set-algo"],
)
def test_a_run_its_cell_folder_would_misname_is_refused_before_any_work(
    tmp_path: Path, toml: str, overrides: dict, named: str
) -> None:
    """A `--set` of a grid key (or of the algorithm) and a grid over `seed` made runs whose
    folder names another value than they ran with: the report would then refuse them, or
    publish them as that other cell. Refused when the grid is planned."""
    config = write(tmp_path / "t.toml", f"algo = 'fedreg'\n[experiment]\nname = 'm'\n{toml}\n")
    with pytest.raises(ConfigError, match="a --set or a variant may not change") as refused:
        plan([Experiment.load(config, DECLARED)], tmp_path / "out", DECLARED, overrides)
    assert named in str(refused.value)


def test_two_cells_that_would_share_a_folder_are_refused_before_any_work(
    tmp_path: Path, capsys
) -> None:
    """Grid values that differ but name the same folder would make two runs of different
    settings resume and overwrite each other's records there: refused before any work."""
    grid = '{ dataset = ["a/b", "a_b"] }'
    config = write(
        tmp_path / "t.toml", f"algo = 'fedreg'\n[experiment]\nname = 'm'\ngrid = {grid}\n"
    )
    with pytest.raises(SystemExit) as exited:
        main([str(config), "--out", str(tmp_path / "out")])
    assert exited.value.code == 2
    assert "would both run in fedreg__dataset-a_b/seed0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_same_cell_twice_is_one_run(tmp_path: Path) -> None:
    config = write(tmp_path / "t.toml", "[experiment]\nname = 'm'\nalgos = ['fedavg', 'fedavg']\n")
    specs = plan([Experiment.load(config, DECLARED)], tmp_path, DECLARED, {}, seeds=2)
    assert [(s.cell["algo"], s.seed) for s in specs] == [("fedavg", 0), ("fedavg", 1)]
    twice = plan([Experiment.load(config, DECLARED)] * 2, tmp_path, DECLARED, {}, seeds=1)
    assert len(twice) == 1
    # grid values 1 and "1" name one folder, and validate to one setting: one run
    same = write(tmp_path / "s.toml", '[experiment]\nname = "m"\ngrid = { threshold = ["1", 1] }\n')
    assert len(plan([Experiment.load(same, DECLARED)], tmp_path, DECLARED, {}, seeds=1)) == 1
    # the same name and setting on another number of clients is another run
    more = write(tmp_path / "u.toml", "[experiment]\nname = 'm'\nclients = 7\nalgos = ['fedavg']\n")
    with pytest.raises(ConfigError, match="would both run in fedavg/seed0"):
        plan(
            [Experiment.load(f, DECLARED) for f in (config, more)], tmp_path, DECLARED, {}, seeds=1
        )


def test_the_runners_own_cell_folders_hold_records_it_reads_as_theirs(
    tmp_path: Path, grey_dataset: Path
) -> None:
    """Grid values the run records otherwise than the folder names them: a relative
    dataset path (recorded resolved), an integer grid value (recorded as a float), a
    bool, and a variant's label; and (the folder check alone) a value holding the
    folder separator."""
    config = write(tmp_path / "t.toml", textwrap.dedent(f"""
        [experiment]
        name = "own"
        algos = ["fedreg"]
        grid = {{ dataset-path = ["{grey_dataset.name}"], alpha = [1], tensorboard = [true] }}
        variants = {{ plain = {{ local-epochs = 2 }} }}
    """))  # fmt: skip
    here = Path.cwd()
    os.chdir(grey_dataset.parent)
    try:
        [spec] = plan([Experiment.load(config, DECLARED)], tmp_path / "out", DECLARED, {})
    finally:
        os.chdir(here)
    assert spec.folder.parent.name == (
        f"fedreg__dataset-path-{grey_dataset.name}__alpha-1__tensorboard-True__variant-plain"
    )
    write_results(spec, "completed")
    assert spec.finished_results() is not None, spec.failure()
    separated = {"algo": "fedreg", "dataset": "org__x/ds", "alpha": 0.5}
    assert cell_problem("fedreg__dataset-org__x_ds__alpha-0.5", separated) is None
    assert "alpha=0.5" in cell_problem("fedreg__dataset-org__x_ds__alpha-0.1", separated)


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


def fake_result(spec: RunSpec, status: str, g: float, p: float) -> None:
    run = spec.folder / f"run-{status}"
    run.mkdir(parents=True)
    rounds = [{"round": k, "global_accuracy": g, "personal_accuracy": p,
               "train_seconds": 1.0, "eval_seconds": 1.0} for k in (1, 2, 3)]  # fmt: skip
    document = {"config": spec.setting, "run": {"status": status, "num_clients": 7},
                "rounds": rounds, "best_global_accuracy": g,
                "best_personal_accuracy": p}  # fmt: skip
    (run / "results.json").write_text(json.dumps(document))


def test_completed_runs_are_found_and_summarised(tmp_path: Path) -> None:
    specs = plan([grid_experiment(tmp_path)], tmp_path / "out", DECLARED, {}, algos=("fedreg",))
    first_cell = [s for s in specs if s.cell == specs[0].cell]
    fake_result(first_cell[0], "completed", 0.80, 0.90)
    fake_result(first_cell[1], "failed", 0.10, 0.10)  # interrupted: to be rerun
    fake_result(first_cell[1], "completed", 0.84, 0.92)
    for spec in specs:
        spec.result = spec.finished_results()
    assert first_cell[1].result["best_global_accuracy"] == 0.84
    assert len(first_cell[1].result["rounds"]) == 3  # the newest run's rounds
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
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 8 + 1 and lines[-1] == (
        "grid 0/24 rounds done in 8 runs; time left unknown: no record yet of "
        "t1 fedavg augment=auto threshold=max, t1 fedavg augment=auto threshold=mean, "
        "t1 fedavg augment=simple threshold=max, 5 more"
    )
    assert all(line.endswith(": starts") for line in lines[:-1])
    with pytest.raises(SystemExit):
        main([str(path), "--set", "nonsense-key=1"])
    assert "nonsense-key" in capsys.readouterr().err


def test_seeds_given_by_number_run_from_0_and_given_by_name_run_only_those(
    tmp_path: Path, capsys
) -> None:
    """`--seeds 1-2` runs seeds 1 and 2 in the folders `--seeds 3` gives them, so seeds run
    on two machines merge in one report; a number keeps meaning seeds 0..n-1."""
    assert seed_numbers("3") == 3
    assert seed_numbers("1-2") == (1, 2)
    assert seed_numbers("0,3") == (0, 3)
    assert seed_numbers("4-4, 6") == (4, 6)
    experiment = grid_experiment(tmp_path)
    every = plan([experiment], tmp_path / "o", DECLARED, {}, 3, ("fedreg",))
    named = plan([experiment], tmp_path / "o", DECLARED, {}, (1, 2), ("fedreg",))
    assert {s.seed for s in named} == {1, 2}
    assert [s.folder for s in named] == [s.folder for s in every if s.seed > 0]
    assert main([str(tmp_path / "t1.toml"), "--dry-run", "--seeds", "2-2", "--algos", "fedavg",
                 "--out", str(tmp_path / "o")]) == 0  # fmt: skip
    runs = capsys.readouterr().out.strip().splitlines()[:-1]
    assert len(runs) == 4 and all("seed 2" in run for run in runs)


def test_an_unknown_set_key_names_the_closest_declared_key(tmp_path: Path, capsys) -> None:
    with pytest.raises(ConfigError, match=r"'pxor-mu' .*did you mean 'prox-mu'"):
        declared_overrides(["pxor-mu=0.1"], DECLARED)
    grid_experiment(tmp_path)
    with pytest.raises(SystemExit):
        main([str(tmp_path / "t1.toml"), "--set", "pxor-mu=0.1", "--dry-run"])
    err = capsys.readouterr().err
    assert "'pxor-mu'" in err and "did you mean 'prox-mu'" in err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--seeds", "-1"], "--seeds=-1 is not allowed"),  # before: 0 runs, exit 0
        (["--seeds", "0"], "--seeds=0 is not allowed"),  # before: the file's seeds
        (["--seeds", "2-1"], "--seeds=2-1 is not allowed"),  # would run none
        (["--seeds", "1-"], "--seeds=1- is not allowed"),
        (["--seeds", "0,x"], "--seeds=0,x is not allowed"),
        (["--seeds", "\u00b2"], "is not allowed: expected a number of seeds"),  # isdigit: True
        (["--seeds", "1-\u00b2"], "is not allowed: expected a number of seeds"),
        (["--seeds", "0-2,1"], "names a seed twice"),  # would count seed 1 twice
        # before: a billion runs planned, one by one, before anything was said
        (["--seeds", "0-1000000000"], "expected a number of seeds from 1 to 1000"),
        (["--seeds", "1001"], "--seeds=1001 is not allowed"),
        (["--seeds", "0-599,1000-1400"], "--seeds=0-599,1000-1400 is not allowed"),  # 1001
        (["--seeds", f"{2**63}-{2**63}"], "each at most 2**63 - 1"),  # Flower's int64 field
        (["--algos", ""], "--algos='' is not allowed"),  # before: every algorithm
        (["--variants", "a,"], "--variants='a,' is not allowed"),
        (["--set", "resume=/some/run"], "resume=... is not allowed: the runner resumes"),
        (["--set", "seed=5"], "seed=... is not allowed: --seeds"),  # before: ignored
        (["--set", "results-dir=/x"], "results-dir=... is not allowed: --out"),
    ],
)
def test_runner_arguments_it_would_ignore_or_misuse_are_refused(
    tmp_path: Path, capsys, args: list[str], said: str
) -> None:
    """Refused before anything starts: `--set resume=<a finished run of another grid>`
    (it would rewrite that run's results.json, its results-dir and a `resumed` entry, before
    failing); `--set seed` and `--set results-dir` (the runner sets both itself);
    `--seeds -1` (it would run nothing and exit 0)."""
    grid_experiment(tmp_path)
    out = tmp_path / "o"
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "t1.toml"), "--out", str(out), *args])
    assert stopped.value.code == 2 and said in capsys.readouterr().err
    assert not out.exists()  # nothing started
    write(tmp_path / "r.toml", "resume = '/some/run'\n[experiment]\nclients = 20\n")
    with pytest.raises(ConfigError, match="r: resume=... is not allowed"):
        plan([Experiment.load(tmp_path / "r.toml", DECLARED)], out, DECLARED, {})


def test_a_linked_state_folder_is_refused_not_deleted_through(tmp_path: Path) -> None:
    """The runner deletes a finished run's own state folder: a `seed<k>/state` that is a
    link to a folder elsewhere is refused, so that folder is not deleted through it."""
    grid_experiment(tmp_path)
    victim = tmp_path / "victim"
    (victim / "keep").mkdir(parents=True)
    experiment = Experiment.load(tmp_path / "t1.toml", DECLARED)
    [spec, *_] = plan([experiment], tmp_path / "o", DECLARED, {}, 1, ("fedreg",))
    spec.folder.mkdir(parents=True)
    (spec.folder / "state").symlink_to(victim)
    with pytest.raises(ConfigError, match="state is a link; the runner keeps"):
        plan([experiment], tmp_path / "o", DECLARED, {}, 1, ("fedreg",))
    assert (victim / "keep").is_dir()


def test_an_unknown_key_in_a_config_file_names_the_file_and_the_closest_key(
    tmp_path: Path,
) -> None:
    typo = write(tmp_path / "typo.toml", "[experiment]\ngrid = { num-rounds = [3] }\n")
    with pytest.raises(ConfigError, match=r"'num-rounds' .*typo.toml.*'num-server-rounds'"):
        Experiment.load(typo, DECLARED)


# ------------------------------------------------------- degraded and failed runs
#: A round's coverage where every one of a test grid's 20 clients answered.
EVERY_CLIENT = {"clients": 20, "of_clients": 20, "test_samples": 30, "of_test_samples": 30}


def results_document(
    status: str, config: dict[str, Any] | None = None, clients: int = 20, **summary: Any
) -> dict[str, Any]:
    """A results.json as the ServerApp writes it (the fields the runner and report read),
    recording ``config`` (a run's whole validated config: the runner compares it) and the
    number of clients (part of the setting too; the test grids' default is 20). A finished
    run records every planned round; in a degraded one every round lost a client (its
    all-client P null), or only the last where ``summary`` gives an all-client best P.
    ``summary`` sets best figures, which the rounds then bear out."""
    whole = {
        "round": 1,
        "global_accuracy": 0.5,
        "personal_accuracy": 0.7,
        "personal_accuracy_answered": 0.7,
        "personal_accuracy_std": 0.1,
        "train_seconds": 1.0,
        "eval_seconds": 1.0,
        "num_train_examples": 100,
        "train_replies": 3,
        "train_failures": 0,
        "eval_replies": 3,
        "eval_failures": 0,
        "errors": [],
        "personal_coverage": {
            "clients": clients,
            "of_clients": clients,
            "test_samples": 30,
            "of_test_samples": 30,
        },
    }
    for best, field in BEST_OF.items():
        if best in summary:
            whole[field] = summary[best]
    partial = {
        **whole,
        "personal_accuracy": None,
        "personal_accuracy_std": None,
        "train_replies": 2,
        "train_failures": 1,
        "eval_replies": 2,
        "eval_failures": 1,
        "errors": [{"phase": "train", "error": "client crashed", "nodes": [7], "partitions": [2]}],
        "personal_coverage": {
            "clients": clients - 1,
            "of_clients": clients,
            "test_samples": 20,
            "of_test_samples": 30,
        },
    }
    planned = (config or {}).get("num-server-rounds", 1) if status != "running" else 1
    rounds = [{**whole, "round": k} for k in range(1, planned + 1)]
    if status == "degraded" and summary.get("best_personal_accuracy") is None:
        rounds = [{**partial, "round": k} for k in range(1, planned + 1)]  # none complete
    elif status == "degraded":
        rounds[-1] = {**partial, "round": planned}
    if status == "failed":
        rounds = []
    personal = [r["personal_accuracy"] for r in rounds if r["personal_accuracy"] is not None]
    return {
        "config": config or {"algo": "fedreg", "dataset": "zalando-datasets/fashion_mnist",
                             "alpha": 0.1, "fraction-train": 0.25, "local-epochs": 1,
                             "batch-size": 10},
        "run": {"status": status, "run_id": 1, "num_clients": clients,
                **({"error": "RuntimeError: CUDA out of memory\nsecond line"}
                   if status == "failed" else {})},
        "rounds": rounds,
        "best_global_accuracy": whole["global_accuracy"] if rounds else None,
        "best_personal_accuracy": max(personal, default=None),
        "best_personal_accuracy_answered": whole["personal_accuracy_answered"] if rounds else None,
    }  # fmt: skip


def write_results(
    spec: RunSpec, status: str, run: str = "20250101-000000_run1", **summary: Any
) -> None:
    """Lay a run out as the runner does: <out>/<experiment>/<cell>/seed<k>/<run>/."""
    folder = spec.folder / run
    folder.mkdir(parents=True)
    document = results_document(status, spec.setting, spec.clients, **summary)
    (folder / "results.json").write_text(json.dumps(document))


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


def test_the_runners_table_says_when_fewer_seeds_give_a_figure_than_finished() -> None:
    """A degraded seed with no complete round gives no G when the clients evaluate the
    global model: ``70.00`` over one of two finished seeds said nothing of it."""
    summary = CellSummary("t2", {"algo": "fedreg"}, (0.7,), (0.8, 0.9), seeds=2,
                                      finished=2, degraded=1)  # fmt: skip
    row = markdown_table([summary]).splitlines()[2]
    assert row == "| t2 | fedreg | 70.00† (1 of 2 seeds) | 85.00 ± 7.07† | 2/2 (1 degraded) |"


def test_table_without_degraded_runs_has_no_marks_or_notes(tmp_path: Path) -> None:
    (spec,) = one_cell_specs(tmp_path, 1)
    write_results(spec, "completed")
    spec.result = spec.finished_results()
    table = markdown_table(summarize([spec]))
    assert "†" not in table and "‡" not in table and table.endswith("| 50.00 | 70.00 | 1/1 |")


def test_a_finished_run_of_another_setting_is_not_taken_for_this_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The config file was edited (local epochs) after seed 0 finished: that run is not
    this config's result, so it runs again and the table never shows the old figures
    under the new setting. A run that differs only in where it ran (dataset path, device,
    results folder) is the same setting and is kept."""
    config = write(tmp_path / "t2.toml", "[experiment]\nname = 't2'\nseeds = 2\n")
    out = tmp_path / "out"
    edited, moved = plan([Experiment.load(config, DECLARED)], out, DECLARED, {})
    before = {**edited.setting, "local-epochs": edited.setting["local-epochs"] + 4}
    (edited.folder / "run-old").mkdir(parents=True)
    document = results_document("completed", before)
    (edited.folder / "run-old" / "results.json").write_text(json.dumps(document))
    elsewhere = {**moved.setting, "dataset-path": "/data/elsewhere", "device": "cuda",
                 "results-dir": "/elsewhere/seed1", "state-dir": "/elsewhere/state"}  # fmt: skip
    write_results(moved, "completed")
    (moved.folder / "20250101-000000_run1" / "results.json").write_text(
        json.dumps(results_document("completed", elsewhere))
    )
    epochs = edited.setting["local-epochs"]
    assert edited.finished_results() is None
    assert edited.differences(document) == [f"local-epochs={epochs + 4}, not {epochs}"]
    assert moved.finished_results() is not None and moved.other_setting() is None
    assert pending_state(edited, DECLARED) == (
        f"starts: {edited.folder / 'run-old'} finished with another setting "
        f"(local-epochs={epochs + 4}, not {epochs})", 0,
    )  # fmt: skip
    monkeypatch.setattr(runner_session, "LocalSuperLink", FakeSuperLink)
    monkeypatch.setattr(FakeSuperLink, "started", [])
    monkeypatch.setattr(FakeSuperLink, "outcome", {"seed0": "completed"})
    assert main([str(config), "--out", str(out)]) == 0
    assert FakeSuperLink.started == ["seed0"]
    printed = capsys.readouterr().out
    assert "1 of 2 runs already finished; 1 to run" in printed
    assert f"finished with another setting (local-epochs={epochs + 4}, not {epochs}); " \
           "running this setting" in printed  # fmt: skip
    assert edited.finished_results()["config"]["local-epochs"] == epochs


class FakeSuperLink:
    """Stands in for LocalSuperLink: records which runs were started and lets each "run"
    leave what the test says (a failed results.json, a degraded one, or nothing)."""

    started: list[str] = []
    resumed: list[str] = []  # each submitted run's `resume` ("" for a start anew)
    entered = 0  # how many times the runner started it
    options: dict[str, Any] = {}  # what the runner built the SuperLink with
    outcome: dict[str, str] = {}  # seed folder name -> status written by the "run"

    def __init__(self, home: Path, **options: Any) -> None:
        self.home = home
        FakeSuperLink.options = options

    def __enter__(self) -> FakeSuperLink:
        FakeSuperLink.entered += 1
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run_polling(
        self, config_file: str, clients: int, log_path: Path, poll: float
    ) -> Iterator[None]:
        submitted = tomllib.loads(Path(config_file).read_text())
        folder = Path(submitted["results-dir"])
        FakeSuperLink.started.append(folder.name)
        FakeSuperLink.resumed.append(submitted.get("resume", ""))
        status = FakeSuperLink.outcome.get(folder.name)
        if status is not None:
            run = folder / "20250103-000000_run3"
            run.mkdir()
            run_config = tomllib.loads(Path(config_file).read_text())
            config = load_config({**DECLARED, **run_config}).to_run_config()
            (run / "results.json").write_text(json.dumps(results_document(status, config)))
        yield


def test_a_finished_run_with_another_number_of_clients_is_not_this_runs(tmp_path: Path) -> None:
    """The client count lives under ``run``, not in the recorded config: after
    ``clients`` changed, the runner took the old finished run as the new setting's."""
    (spec,) = one_cell_specs(tmp_path, 1)
    folder = spec.folder / "20250101-000000_run1"
    folder.mkdir(parents=True)
    document = results_document("completed", spec.setting, clients=spec.clients + 10)
    (folder / "results.json").write_text(json.dumps(document))
    assert spec.finished_results() is None
    assert f"clients={spec.clients + 10}, not {spec.clients}" in spec.other_setting()


def test_runner_reruns_failed_runs_lists_them_and_exits_non_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    config = write(
        tmp_path / "t2.toml",
        "[experiment]\nname = 't2'\nseeds = 4\n"
        "[experiment.paper]\nsource = 'paper X'\nfedreg = { G = 40.0, P = 80.0 }\n",
    )
    out = tmp_path / "out"
    completed, degraded, failed, missing = plan(
        [Experiment.load(config, DECLARED)], out, DECLARED, {}
    )
    write_results(completed, "completed")
    write_results(degraded, "degraded")
    write_results(failed, "failed")
    monkeypatch.setattr(runner_session, "LocalSuperLink", FakeSuperLink)
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
    beside = "| fedreg | 50.00 ± 0.00† | 40.00 | +10.00 | 70.00 ± 0.00†‡ | 80.00 | -10.00 | 2 |"
    assert beside in (out / "report" / "table.md").read_text()  # the file's [experiment.paper]
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
    monkeypatch.setattr(runner_session, "LocalSuperLink", FakeSuperLink)
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


def tiny_config(folder: Path, dataset: Path, algo: str, rounds: int, seeds: int) -> Path:
    """An experiment ``tiny`` on 4 clients of the generated dataset, one local epoch, half
    of them training each round."""
    return write(
        folder / "tiny.toml",
        f"""
algo = "{algo}"
dataset-path = "{dataset}"
num-server-rounds = {rounds}
local-epochs = 1
fraction-train = 0.5
min-partition-size = 5
[experiment]
name = "tiny"
clients = 4
seeds = {seeds}
""",
    )


@pytest.mark.e2e
def test_runner_runs_a_grid_summarises_it_and_skips_it_once_finished(
    grey_dataset: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """The resume of interrupted runs is tested below, with real stops; here a finished
    grid run again trains nothing. ``--out`` is relative, as the README's commands give it
    (``flwr run`` runs in another folder, so the staged app's path it is given must not be
    relative to this one, or every run fails)."""
    config = tiny_config(tmp_path, grey_dataset, algo="fedavg", rounds=2, seeds=2)
    monkeypatch.chdir(tmp_path)
    out = Path("experiments") / "out"
    assert main([str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "0 of 2 runs already finished; 2 to run" in printed
    assert "[run 2/2 | round 2/2]" in printed
    summary = (out / "summary.md").read_text()
    assert "| tiny | fedavg |" in summary and "2/2 |" in summary
    assert main([str(config), "--out", str(out)]) == 0
    assert "2 of 2 runs already finished; 0 to run" in capsys.readouterr().out
    assert not (out / ".flwr_home" / "experiments").exists()  # Flower's home, not below it


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


def test_variants_flag_runs_the_named_variants_in_the_folders_of_the_whole_file(
    tmp_path: Path, capsys
) -> None:
    """`--variants a` runs one variant of a file (a full-scale option study run in parts,
    one option at a time) where the whole file would put it, so a report pairs it as before;
    a name the file does not define is refused, naming the ones it does."""
    config = write(
        tmp_path / "t6.toml",
        """
[experiment]
clients = 20
variants = { fedreg = {}, a = { fedreg-head-weight = "original" }, b = { lr = 0.1 } }
""",
    )
    experiment = Experiment.load(config, DECLARED)
    every = plan([experiment], tmp_path, DECLARED, {})
    chosen = plan([experiment], tmp_path, DECLARED, {}, variants=("b", "a"))
    assert [s.cell["variant"] for s in chosen] == ["a", "b"]  # the file's order
    assert [s.folder for s in chosen] == [every[1].folder, every[2].folder]
    assert [s.run_config for s in chosen] == [every[1].run_config, every[2].run_config]
    unknown = r"t6 defines no variant 'c' \(its variants: fedreg, a, b\)"
    with pytest.raises(ConfigError, match=unknown):
        plan([experiment], tmp_path, DECLARED, {}, variants=("a", "c"))
    plain = grid_experiment(tmp_path)
    with pytest.raises(ConfigError, match="its variants: none: the file has no"):
        plan([plain], tmp_path, DECLARED, {}, variants=("a",))
    assert main([str(config), "--variants", "a", "--dry-run", "--seeds", "1",
                 "--out", str(tmp_path / "o")]) == 0  # fmt: skip
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and "variant=a seed 0" in lines[0]


# ------------------------------------------------- resuming interrupted runs
def interrupted_run(
    spec: RunSpec,
    status: str,
    name: str = "20250101-000000_run1",
    at_round: int = 1,
    record_clients: bool = True,
) -> Path:
    """A run folder as an interrupted run leaves it: results.json with one round, a
    checkpoint of ``at_round`` made with the spec's config, and (for FedReG) its clients'
    state."""
    folder = spec.folder / name
    folder.mkdir(parents=True)
    document = results_document("completed", spec.setting)
    document["run"]["status"] = status
    if status == "failed":
        document["run"]["error"] = "RuntimeError: CUDA out of memory\nsecond line"
    document["rounds"] = [{**document["rounds"][0], "round": k} for k in range(1, at_round + 1)]
    (folder / "results.json").write_text(json.dumps(document))
    config = load_config({**DECLARED, **spec.run_config})
    Checkpoint(
        round=at_round, model={"w": np.ones(3, np.float32)}, strategy_arrays={},
        strategy_state={}, state_key=name, run_config=config.to_run_config(),
        clients=clients_record(spec.clients, {}) if record_clients else None,
    ).save(folder)  # fmt: skip
    (spec.state_dir / "runs" / name / "partition-0").mkdir(parents=True)
    return folder


def finished_run(spec: RunSpec, seconds: float) -> None:
    """A completed run of the spec whose every round took ``seconds`` (training + eval)."""
    write_results(spec, "completed")
    path = next(spec.folder.glob("*/results.json"))
    document = json.loads(path.read_text())
    first = {**document["rounds"][0], "train_seconds": seconds - 1, "eval_seconds": 1.0}
    document["rounds"] = [{**first, "round": k} for k in range(1, spec.num_rounds + 1)]
    path.write_text(json.dumps(document))


def test_progress_takes_seconds_only_from_checked_records_of_this_setting(
    tmp_path: Path,
) -> None:
    """A failed record whose rounds lack `train_seconds` (the report does not check a
    failed run's rounds) must not crash the runner, `--dry-run` too, with a KeyError; the
    records of another setting (50 local epochs, not 1) must not give the estimate."""
    [spec] = one_cell_specs(tmp_path, 1)
    finished_run(spec, 5.0)
    damaged = spec.folder / "20250102-000000_run2"
    damaged.mkdir()
    failed = {**results_document("failed", spec.setting, spec.clients), "rounds": [{"round": 1}]}
    (damaged / "results.json").write_text(json.dumps(failed))
    other = RunSpec(**{**spec.__dict__, "setting": {**spec.setting, "local-epochs": 50}})
    finished_run(RunSpec(**{**other.__dict__, "folder": tmp_path / "elsewhere"}), 500.0)
    shutil.move(next((tmp_path / "elsewhere").iterdir()), spec.folder / "20250103-000000_run3")
    assert recorded_seconds([spec]) == {cell_key(spec): 5.0}


def test_progress_expects_each_cell_to_cost_what_it_costs(tmp_path: Path) -> None:
    """A grid's cells cost differently (Ditto trains two models): the time left adds each
    cell's own seconds a round, from its records on disk until it has run here, scaled by
    how this machine compares with the records of the cells it has run; a run's first
    round here also pays its start-up, which is timed apart and expected once per run
    still to start; the rounds an interrupted run's checkpoint holds count as done and
    are not expected again."""
    config = write(tmp_path / "t3.toml", textwrap.dedent("""
        num-server-rounds = 4
        [experiment]
        name = "t3"
        algos = ["fedavg", "ditto", "fedrep"]
        seeds = 2
    """))  # fmt: skip
    specs = plan([Experiment.load(config, DECLARED)], tmp_path / "out", DECLARED, {})
    by = {(s.cell["algo"], s.seed): s for s in specs}
    finished_run(by["fedavg", 0], seconds=5.0)
    finished_run(by["ditto", 0], seconds=10.0)
    interrupted_run(by["ditto", 1], "running", at_round=2)  # its own rounds took 2 s
    for spec in specs:
        spec.result = spec.finished_results()
    resumes_after = decide(by["ditto", 1], DECLARED).after_round  # as run_all asks
    assert resumes_after == 2
    now = [0.0]
    progress = Progress(specs, {id(by["ditto", 1]): resumes_after}, clock=lambda: now[0])
    assert progress.done() == 4 + 4 + 2  # two finished runs and ditto seed 1's checkpoint
    fedavg, ditto = by["fedavg", 1], by["ditto", 1]
    progress.start(fedavg, 0)
    assert math.isnan(progress.seconds_left(fedavg, 0))  # nothing tells FedRep's cost yet
    now[0] = 10.0  # the first round: 3 s of start-up and 7 s of round
    progress.observe(1)
    assert "| 10.0 s/round |" in progress.line(3, 6, fedavg, 1)  # all there is to show yet
    now[0] = 17.0  # this machine: 7 s a round where FedAvg's record says 5
    progress.observe(2)
    assert progress.seconds_per_round(fedavg, 2)[cell_key(fedavg)] == 7.0  # not 17 / 2
    assert progress.start_up_seconds(fedavg, 2) == 3.0
    # FedAvg as timed, Ditto's record scaled by 7 / 5, FedRep at the mean timed, and a
    # start-up for each of the three runs still to start
    assert progress.seconds_left(fedavg, 2) == 2 * 7.0 + 2 * 14.0 + 8 * 7.0 + 3 * 3.0
    assert "| 7.0 s/round |" in progress.line(3, 6, fedavg, 2)
    now[0] = 31.0
    progress.observe(4)
    progress.close(fedavg, 4)
    progress.start(ditto, 2)
    assert progress.done(2) == 3 * 4 + 2
    assert progress.seconds_left(ditto, 2) == 2 * 14.0 + 8 * 7.0 + 2 * 3.0
    line = progress.line(4, 6, ditto, 2)  # the rate shown is timed, never a record's
    assert "| ? s/round |" in line and "left ~1m30s, ETA" in line
    now[0] = 131.0
    progress.close(by["fedrep", 0], 0)  # given up before it started: nothing timed
    assert progress.seconds_left(ditto, 2) == 2 * 14.0 + 4 * 7.0 + 1 * 3.0


def test_progress_follows_the_present_pace_of_a_long_run(tmp_path: Path) -> None:
    """A run's first rounds beside another workload (150 s a round), then alone (47 s):
    the mean since its start would say 5 hours left where the present pace gives 2 h
    20 min. A run counts with its last RECENT_ROUNDS rounds."""
    (spec,) = one_cell_specs(tmp_path, 1)
    spec = RunSpec(**{**spec.__dict__, "num_rounds": 100})
    now = [0.0]
    progress = Progress([spec], clock=lambda: now[0])
    progress.start(spec, 0)
    now[0] = 200.0
    progress.observe(1)  # the first round, start-up in
    for rounds in range(2, 12):
        now[0] += 150.0
        progress.observe(rounds)
    assert progress.measured_per_round(spec, 11) == 150.0
    for rounds in range(12, 12 + RECENT_ROUNDS):
        now[0] += 50.0
        progress.observe(rounds)
    done = 11 + RECENT_ROUNDS
    assert progress.measured_per_round(spec, done) == 50.0  # the mean since round 1: 100
    assert progress.seconds_left(spec, done) == (100 - done) * 50.0
    assert "| 50.0 s/round |" in progress.line(1, 1, spec, done)
    now[0] += 4500.0  # a round that hangs shows at once: it is the present pace too
    window = RECENT_ROUNDS * 50.0 + 4500.0
    assert progress.measured_per_round(spec, done) == window / RECENT_ROUNDS


def test_progress_says_it_does_not_know_until_a_round_is_timed(tmp_path: Path) -> None:
    (spec,) = one_cell_specs(tmp_path, 1)
    now = [0.0]
    progress = Progress([spec], clock=lambda: now[0])
    progress.start(spec, 0)
    assert "? s/round" in progress.line(1, 1, spec, 0)
    assert "left ~?" in progress.line(1, 1, spec, 0) and "ETA" not in progress.line(1, 1, spec, 0)
    now[0] = 30.0
    assert "| 30.0 s/round |" in progress.line(1, 1, spec, 1) and "ETA" in progress.line(
        1, 1, spec, 1
    )


def test_runs_whose_clients_keep_state_get_their_own_state_dir(tmp_path: Path) -> None:
    (spec,) = one_cell_specs(tmp_path, 1)  # fedreg: its clients keep a private head
    assert spec.keeps_state and spec.state_dir == (spec.folder / "state").resolve()
    fedavg = plan([grid_experiment(tmp_path)], tmp_path, DECLARED, {}, algos=("fedavg",))[0]
    assert fedavg.keeps_state and "state-dir" in fedavg.run_config  # its momentum is kept
    fresh = plan([grid_experiment(tmp_path)], tmp_path, DECLARED,
                 {"optimizer-state": "fresh"}, algos=("fedavg",))[0]  # fmt: skip
    assert not fresh.keeps_state and "state-dir" not in fresh.run_config
    shared = plan([grid_experiment(tmp_path)], tmp_path, DECLARED,
                  {"state-dir": str(tmp_path / "mine")}, algos=("fedreg",))[0]  # fmt: skip
    assert shared.state_dir == tmp_path / "mine" and not shared.own_state_dir


def test_a_run_folder_a_serverapp_still_writes_is_left_alone_even_with_restart_damaged(
    tmp_path: Path,
) -> None:
    """Status ``running``, and a live process (a real one) holds the folder: a simulation
    a killed runner left behind. The runner neither resumes it nor starts it anew (with
    ``--restart-damaged`` too: nothing is damaged), and names the holder; once the holder
    is gone the run is resumed as any interrupted one."""
    (spec,) = one_cell_specs(tmp_path, 1)
    folder = interrupted_run(spec, "running")
    with held_elsewhere(folder):
        for restart in (False, True):
            attempt = decide(spec, DECLARED, restart_damaged=restart)
            assert attempt.resume is None and attempt.note is None
            assert f"{folder} is in use by {SERVERAPP}" in attempt.problem
        assert not read_marker(folder).get("abandoned")
    assert decide(spec, DECLARED).resume == folder


def test_a_folder_whose_holder_lets_go_while_the_superlink_starts_is_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder in use is no lasting refusal: after a runner is SIGKILLed its ServerApp
    may still be exiting when the same command starts again. The runner starts its
    SuperLink for such a run (though no other run is pending) and decides it again
    then; a holder gone by then, the run is resumed, not named as failed."""
    (spec,) = one_cell_specs(tmp_path, 1)
    folder = interrupted_run(spec, "running")

    class ReleasingSuperLink(FakeSuperLink):
        def __enter__(self) -> FakeSuperLink:
            os.kill(holder, signal.SIGKILL)  # the ServerApp ends as the SuperLink starts
            deadline = time.monotonic() + 30
            while persist.folder_holder(folder, persist.RUN_FOLDER_LOCK) is not None:
                assert time.monotonic() < deadline, "the holder never let go"
                time.sleep(0.05)
            return super().__enter__()

    monkeypatch.setattr(runner_session, "LocalSuperLink", ReleasingSuperLink)
    monkeypatch.setattr(FakeSuperLink, "started", [])
    monkeypatch.setattr(FakeSuperLink, "outcome", {})
    monkeypatch.setattr(FakeSuperLink, "resumed", [])
    with held_elsewhere(folder) as holder:
        assert decide(spec, DECLARED).problem  # in use when the runner looks first
        runner_session.run_all([spec], tmp_path / "home", declared=DECLARED)
    assert FakeSuperLink.started == [spec.folder.name] and spec.problem is None
    assert FakeSuperLink.resumed == [str(folder)]  # resumed from its checkpoint


def test_an_interrupted_run_and_a_failed_one_are_resumed_from_their_checkpoints(
    tmp_path: Path,
) -> None:
    """A run that failed of its own (its data folder vanished at round 99 of 100) is
    retried from its checkpoint, not started anew from round 1 with its 98 checkpointed
    rounds thrown away, and says that it failed."""
    killed, stopped, failed = one_cell_specs(tmp_path, 3)
    folder = interrupted_run(killed, "running")  # SIGKILL: no time to write anything
    attempt = decide(killed, DECLARED)
    assert (attempt.resume, attempt.after_round, attempt.problem) == (folder, 1, None)
    # The ServerApp writes "failed" when the runner stops it; the runner's note says why.
    folder = interrupted_run(stopped, "failed")
    write_marker(folder, stopped="stopped by SIGTERM")
    assert decide(stopped, DECLARED).resume == folder
    assert "it failed" not in decide(stopped, DECLARED).note
    folder = interrupted_run(failed, "failed")
    attempt = decide(failed, DECLARED)
    assert (attempt.resume, attempt.after_round, attempt.problem) == (folder, 1, None)
    oom = "RuntimeError: CUDA out of memory"
    assert attempt.note == f"resuming {folder} after round 1 (it failed: {oom})"
    assert not never_resumed(folder)  # so its clients' state is not tidied away
    assert pending_state(failed, DECLARED) == (
        f"resumes after round 1/{failed.num_rounds}; it failed: {oom}",
        1,
    )
    # A changed config cannot continue the old run: it starts anew, and says so.
    changed = {**killed.run_config, "local-epochs": 7}
    attempt = decide(RunSpec(**{**killed.__dict__, "run_config": changed}), DECLARED)
    assert attempt.resume is None and "local-epochs" in attempt.note
    # Even the keys a ServerApp's resume may change (extending a deployed run): resumed,
    # the record would hold rounds evaluated that an uninterrupted run never evaluates.
    for key, value in (("eval-every", 4), ("num-server-rounds", 1)):
        other = RunSpec(**{**killed.__dict__, "run_config": {**killed.run_config, key: value}})
        attempt = decide(other, DECLARED)
        assert attempt.resume is None and f"another setting ({key}={value}" in attempt.note
    # So does the experiment's number of clients (the ServerApp would refuse the resume).
    attempt = decide(RunSpec(**{**killed.__dict__, "clients": killed.clients + 1}), DECLARED)
    assert attempt.resume is None
    assert f"checkpoint was made with {killed.clients}; starting anew" in attempt.note
    # A checkpoint of an earlier version records no clients: its results.json's count.
    shutil.rmtree(killed.folder)
    interrupted_run(killed, "running", record_clients=False)
    attempt = decide(RunSpec(**{**killed.__dict__, "clients": killed.clients + 1}), DECLARED)
    assert attempt.resume is None and "made with 20; starting anew" in attempt.note
    assert decide(killed, DECLARED).resume is not None


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda d: d["rounds"].pop(), "it holds 1 rounds, fewer than the checkpoint's"),
        (lambda d: d["rounds"][0].update(global_accuracy=1.7), "round 1: global_accuracy is 1.7"),
        (lambda d: d.pop("rounds"), "rounds is not a list"),
        (lambda d: d["rounds"][1].pop("global_accuracy"), "round 2 lacks ['global_accuracy']"),
        (lambda d: d["run"].pop("run_id"), "run.run_id is None; expected the run's id"),
    ],
)
def test_a_results_file_that_cannot_give_a_resume_its_rounds_is_damaged(
    tmp_path: Path, damage, problem: str
) -> None:
    """The rounds before the checkpoint are kept from results.json: a hole there would
    finish as `completed` with a round missing, a G of 1.7 would print as 170.00, a file
    with no rounds would fail every attempt anew. Such a folder is named as damaged."""
    (spec,) = one_cell_specs(tmp_path, 1)
    folder = interrupted_run(spec, "running", at_round=2)
    document = json.loads((folder / "results.json").read_text())
    damage(document)
    (folder / "results.json").write_text(json.dumps(document))
    attempt = decide(spec, DECLARED)
    assert attempt.resume is None and f"cannot resume {folder}: results.json: {problem}" in \
        attempt.problem  # fmt: skip


@pytest.mark.parametrize("swap", ["another run's", "edited", "none"])
def test_a_results_file_other_than_the_one_the_checkpoint_sealed_is_damaged(
    tmp_path: Path, swap: str
) -> None:
    """Another run's results.json copied into an interrupted run's folder, or a kept round
    edited, passes the runner's range checks but must not be resumed as the run's own.
    The checkpoint's seal (run id, sha256 of the rounds) names the folder as damaged, as
    the ServerApp refuses it; the sealed file itself resumes."""
    (spec,) = one_cell_specs(tmp_path, 1)
    folder = interrupted_run(spec, "running", at_round=2)
    document = json.loads((folder / "results.json").read_text())
    document["run"]["run_id"] = 1  # as the ServerApp writes it
    checkpoint, _ = Checkpoint.load(folder)
    fields = round_fields()  # a seal names the fields it hashed, as the ServerApp's does
    sealed = rounds_sha256(document["rounds"][:2], fields)
    checkpoint.results = {"run_id": 1, "fields": fields, "rounds_sha256": sealed}
    checkpoint.save(folder)
    if swap == "another run's":
        document["run"]["run_id"] += 1
    elif swap == "edited":
        document["rounds"][1]["global_accuracy"] /= 2
    (folder / "results.json").write_text(json.dumps(document))
    attempt = decide(spec, DECLARED)
    if swap == "none":
        assert attempt.resume == folder and attempt.problem is None
    else:
        assert attempt.resume is None and f"cannot resume {folder}: results.json: it" in \
            attempt.problem  # fmt: skip


def test_a_results_file_of_no_run_at_all_is_not_finished_and_does_not_crash(
    tmp_path: Path,
) -> None:
    """`[]` or `{"run": "completed"}` in a seed folder crashed the runner (AttributeError)."""
    (spec,) = one_cell_specs(tmp_path, 1)
    for index, text in enumerate(("[]", '{"run": "completed"}')):
        (spec.folder / f"run{index}").mkdir(parents=True)
        (spec.folder / f"run{index}" / "results.json").write_text(text)
    assert spec.finished_results() is None
    assert "invalid" in spec.failure() and spec.other_setting() is None


def test_a_run_killed_after_its_last_checkpoint_is_resumed_not_restarted(tmp_path: Path) -> None:
    """Killed between the last round's checkpoint and the final status: the rerun
    completes that folder (no round left to train) instead of training it all again."""
    (spec,) = one_cell_specs(tmp_path, 1)
    last = load_config({**DECLARED, **spec.run_config}).num_server_rounds
    folder = interrupted_run(spec, "running", at_round=last)
    attempt = decide(spec, DECLARED)
    assert (attempt.resume, attempt.after_round, attempt.problem) == (folder, last, None)


def test_a_run_whose_final_status_write_fails_says_so_and_the_rerun_completes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills as the ServerApp writes ``completed``: the atomic write leaves the
    last round's results.json (status ``running``) in place. The runner's report names
    the log and the checkpoint's round instead of guessing the run was stopped, and the
    same command resumes it after that round (nothing left to train)."""
    (spec,) = one_cell_specs(tmp_path, 1)
    last = load_config({**DECLARED, **spec.run_config}).num_server_rounds
    folder = interrupted_run(spec, "running", at_round=last)
    document = json.loads((folder / "results.json").read_text())
    writer = ResultsWriter(folder, document["config"], document["run"])  # as the ServerApp
    for k in range(1, last + 1):
        writer.add(RoundRecord(k, 0.5, 0.7, 0.0, 1.0, 1.0, 30, personal_coverage=EVERY_CLIENT))
    before = (folder / "results.json").read_bytes()

    def disk_full(fd: int) -> None:  # a full disk surfaces when the written data is synced
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(persist.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        writer.finish()
    monkeypatch.undo()
    assert (folder / "results.json").read_bytes() == before  # status: running, as left
    assert not list(folder.glob(".results.json.*"))  # the temporary file is gone too
    assert spec.finished_results() is None
    failure = spec.failure()
    assert "ended without writing its status" in failure
    assert str(spec.folder / "flwr.log") in failure and f"round {last}," in failure
    attempt = decide(spec, DECLARED)
    assert (attempt.resume, attempt.after_round, attempt.problem) == (folder, last, None)
    shutil.rmtree(folder / "checkpoint")  # killed before its first checkpoint
    assert "it has no checkpoint, so the same command starts it anew" in spec.failure()
    assert decide(spec, DECLARED).resume is None


#: A ServerApp's last write, made in a process of its own and stopped where a SIGKILL
#: hurts most: the new results.json is written to its temporary file, not yet synced
#: nor renamed into place.
KILLED_MID_WRITE = """
import json, sys, time
from pathlib import Path
from fedreg_app.core import persist
from fedreg_app.core.metrics import ResultsWriter, RoundRecord
folder, last, signals = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
EVERY_CLIENT = {"clients": 20, "of_clients": 20, "test_samples": 30, "of_test_samples": 30}
document = json.loads((folder / "results.json").read_text())
writer = ResultsWriter(folder, document["config"], document["run"])
for k in range(1, last + 1):
    writer.add(RoundRecord(k, 0.5, 0.7, 0.0, 1.0, 1.0, 30, personal_coverage=EVERY_CLIENT))
(signals / "before").write_bytes((folder / "results.json").read_bytes())
def wait_for_the_kill(fd):
    (signals / "ready").touch()
    time.sleep(300)
persist.os.fsync = wait_for_the_kill
writer.finish()
"""


def test_a_run_sigkilled_while_writing_its_final_status_keeps_its_last_results(
    tmp_path: Path,
) -> None:
    """The ServerApp's process is SIGKILLed by PID inside the atomic write of
    ``completed``: no cleanup runs, so the temporary file stays beside results.json. The
    last round's results.json is intact (status ``running``), the leftover is ignored,
    and the same command resumes the run after its last round."""
    (spec,) = one_cell_specs(tmp_path, 1)
    last = load_config({**DECLARED, **spec.run_config}).num_server_rounds
    folder = interrupted_run(spec, "running", at_round=last)
    signals = tmp_path / "signals"
    signals.mkdir()
    child = subprocess.Popen([sys.executable, "-c", KILLED_MID_WRITE, str(folder), str(last),
                              str(signals)])  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (signals / "ready").exists():
            assert child.poll() is None and time.monotonic() < deadline, "never reached"
            time.sleep(0.01)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert (folder / "results.json").read_bytes() == (signals / "before").read_bytes()
    [leftover] = list(folder.glob(".results.json.*.tmp"))
    assert json.loads(leftover.read_text())["run"]["status"] == "completed"  # never renamed
    assert spec.finished_results() is None
    assert json.loads((folder / "results.json").read_text())["run"]["status"] == "running"
    assert "ended without writing its status" in spec.failure()
    attempt = decide(spec, DECLARED)
    assert (attempt.resume, attempt.after_round, attempt.problem) == (folder, last, None)
    assert pending_state(spec, DECLARED) == (f"resumes after round {last}/{last}; its status "
                                             "says running: in progress now, or killed "
                                             "unawares", last)  # fmt: skip


def test_dry_run_says_what_the_command_would_do_with_each_run_and_changes_nothing(
    tmp_path: Path, capsys
) -> None:
    """Finished, resumable (stopped by the runner, or killed), damaged, failed and fresh
    runs, each named with what a real invocation would do; the grid's rounds done at the
    end; the damaged folder is not marked abandoned (dry runs change nothing)."""
    finished, stopped, damaged, failed, fresh, killed = one_cell_specs(tmp_path, 6)
    write_results(finished, "completed")
    folder = interrupted_run(stopped, "stopped", at_round=2)
    write_marker(folder, stopped="stopped by --max-minutes")
    broken = interrupted_run(damaged, "running")
    (broken / "results.json").write_text("{")
    interrupted_run(failed, "failed")
    interrupted_run(killed, "running", at_round=1)
    rounds = finished.num_rounds
    before = sorted(p.name for p in (tmp_path / "out").rglob("*"))
    assert main([str(tmp_path / "t2.toml"), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{finished.describe()} -> {finished.folder}: finished (completed)"
    assert lines[1] == (f"{stopped.describe()} -> {stopped.folder}: resumes after round "
                        f"2/{rounds}; stopped by --max-minutes")  # fmt: skip
    assert lines[2].startswith(f"{damaged.describe()} -> {damaged.folder}: not run: cannot "
                               f"resume {broken}: results.json is unreadable")  # fmt: skip
    assert lines[3] == (f"{failed.describe()} -> {failed.folder}: resumes after round "
                        f"1/{rounds}; it failed: RuntimeError: CUDA out of memory")  # fmt: skip
    assert lines[4] == f"{fresh.describe()} -> {fresh.folder}: starts"
    assert lines[5] == (f"{killed.describe()} -> {killed.folder}: resumes after round "
                        f"1/{rounds}; its status says running: in progress now, or killed "
                        "unawares")  # fmt: skip
    left = runner_progress._clock((5 * rounds - 4) * 2.0)  # every recorded round took 2 s
    assert lines[6] == (f"grid {rounds + 4}/{6 * rounds} rounds done in 6 runs; about "
                        f"{left} left at the seconds a round of the records")  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == before
    assert read_marker(broken) == {}


def test_the_dry_run_times_the_cells_with_records_and_names_those_without(
    tmp_path: Path, capsys
) -> None:
    """One cell has a finished seed (rounds of 2 s), the other no record: the time the
    first cell's open seed needs is given for it alone, the other cell is named, and no
    figure is made up for it."""
    specs = plan([grid_experiment(tmp_path)], tmp_path / "out", DECLARED, {}, algos=("fedavg",))
    first = [s for s in specs if s.cell == specs[0].cell]
    write_results(first[0], "completed")
    assert main([str(tmp_path / "t1.toml"), "--out", str(tmp_path / "out"), "--dry-run",
                 "--algos", "fedavg"]) == 0  # fmt: skip
    last = capsys.readouterr().out.splitlines()[-1]
    rounds = first[1].num_rounds
    assert last == (
        f"grid {rounds}/{8 * rounds} rounds done in 8 runs; time left unknown: no record yet "
        "of t1 fedavg augment=auto threshold=max, t1 fedavg augment=simple threshold=max, "
        "t1 fedavg augment=simple threshold=mean; about "
        f"{runner_progress._clock(rounds * 2.0)} for the other run, by its records"
    )


@pytest.mark.parametrize(
    ("marker", "problem"),
    [
        ('{"abandoned": 1, "at": "2026-01-01T00:00:00"}', "abandoned must be a non-empty text"),
        ('{"abandoned": "", "at": "2026-01-01T00:00:00"}', "abandoned must be a non-empty text"),
        ('{"stopped": "x", "abandoned": "y", "at": "t"}', "must hold one of stopped, abandoned"),
        ('{"stopped": "x", "at": "t", "resume": true}', "it holds at, resume, stopped"),
        ('{"stopped": "x"}', "at must be a non-empty text"),
        ('["abandoned"]', "runner.json is not an object"),
        ("{", "runner.json is unreadable"),
    ],
)
def test_a_marker_the_runner_did_not_write_is_not_obeyed(
    tmp_path: Path, marker: str, problem: str
) -> None:
    """``runner.json`` decides whether a run is resumed (``stopped``) or passed over
    (``abandoned``). A file of another shape is not read by truthiness (``{"abandoned":
    1}`` would make the runner start the seed anew beside a resumable run): the folder is
    named as damaged; --restart-damaged replaces the file with the runner's own marker."""
    (spec,) = one_cell_specs(tmp_path, 1)
    older = interrupted_run(spec, "running", name="20240101-000000_run0")
    write_marker(older, abandoned="an earlier attempt")  # the runner's own: passed over
    folder = interrupted_run(spec, "failed", at_round=2)
    (folder / "runner.json").write_text(marker)
    attempt = decide(spec, DECLARED)
    assert attempt.resume is None and f"cannot resume {folder}: " in attempt.problem
    assert problem in attempt.problem
    assert read_marker(folder) == {}
    again = decide(spec, DECLARED, restart_damaged=True)
    assert again.resume is None and again.problem is None and str(folder) in again.note
    assert read_marker(folder)["abandoned"].startswith("runner.json")
    assert decide(spec, DECLARED) == runner_decisions.Attempt()  # both passed over: a fresh run


def test_the_runners_own_markers_are_obeyed(tmp_path: Path) -> None:
    """The shapes :func:`write_marker` writes: ``stopped`` resumes a run whose ServerApp
    wrote ``failed`` on its way out; ``abandoned`` passes a folder over."""
    (spec,) = one_cell_specs(tmp_path, 1)
    folder = interrupted_run(spec, "failed", at_round=2)
    write_marker(folder, stopped="stopped by --max-minutes")
    assert runner_decisions.marker_problem(folder) is None
    assert decide(spec, DECLARED).resume == folder
    write_marker(folder, abandoned="checkpoint damaged")
    assert decide(spec, DECLARED) == runner_decisions.Attempt()


@pytest.mark.parametrize("damage", ["model", "state", "client-state", "results"])
def test_a_damaged_run_folder_is_named_and_restarted_only_when_asked(
    tmp_path: Path, damage: str
) -> None:
    (spec,) = one_cell_specs(tmp_path, 1)
    folder = interrupted_run(spec, "running")
    checkpoint = folder / "checkpoint"
    if damage == "model":
        [model] = checkpoint.glob("round-*/model.npz")
        model.write_bytes(model.read_bytes()[:-10])
    elif damage == "state":
        (checkpoint / "state.json").write_text("{garbage")
    elif damage == "client-state":
        shutil.rmtree(spec.state_dir)
    else:
        (folder / "results.json").write_text("{")
    attempt = decide(spec, DECLARED)
    assert attempt.resume is None and str(folder) in attempt.problem
    assert "--restart-damaged" in attempt.problem
    expected = {"model": "model.npz", "state": "state.json", "client-state": "private state",
                "results": "results.json"}[damage]  # fmt: skip
    assert expected in attempt.problem
    again = decide(spec, DECLARED, restart_damaged=True)
    assert again.resume is None and again.problem is None and str(folder) in again.note
    assert read_marker(folder)["abandoned"]  # kept, and never resumed later
    assert decide(spec, DECLARED) == runner_decisions.Attempt()


def test_a_damaged_run_is_reported_and_the_runner_exits_non_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    config = write(tmp_path / "t2.toml", "[experiment]\nname = 't2'\nseeds = 1\n")
    out = tmp_path / "out"
    (spec,) = plan([Experiment.load(config, DECLARED)], out, DECLARED, {})
    folder = interrupted_run(spec, "running")
    (folder / "checkpoint" / "state.json").write_text("{garbage")
    monkeypatch.setattr(runner_session, "LocalSuperLink", FakeSuperLink)
    monkeypatch.setattr(FakeSuperLink, "started", [])
    monkeypatch.setattr(FakeSuperLink, "outcome", {})
    assert main([str(config), "--out", str(out)]) == 1
    assert FakeSuperLink.started == []  # not run over
    err = capsys.readouterr().err
    assert f"cannot resume {folder}: checkpoint file" in err and "state.json" in err
    # the final report does not say a rerun retries it: a rerun leaves it alone as this
    # one did
    report = err[err.index("1 of 1 runs left alone as they stand") :]
    assert "--restart-damaged starts each anew" in report and "run again" not in report
    assert f"cannot resume {folder}" in report


def test_a_run_whose_data_changed_at_its_path_is_refused_before_any_start(
    tmp_path: Path, grey_dataset: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The ServerApp refuses to resume a checkpoint on other samples; were the runner to
    learn of it only from a failed run, ``--dry-run`` would promise the resume, and every
    invocation would start Ray for a run that is refused again. The runner compares the
    checkpoint's partitions (sizes, content digests) with the data at its path first: a
    copy with one pixel changed is named and not run, the folder left as it was, and
    with no other run to do no SuperLink is started; with ``--restart-damaged`` it
    starts anew (not when the data only cannot be read). A copy of the same samples in
    other files resumes."""
    data = copy_dataset(grey_dataset, tmp_path / "data")
    config = tiny_config(tmp_path, data, algo="fedreg", rounds=3, seeds=1)
    out = tmp_path / "out"
    (spec,) = plan([Experiment.load(config, DECLARED)], out, DECLARED, {})
    folder = interrupted_run(spec, "stopped")
    checkpoint, _ = Checkpoint.load(folder)
    key = PartitionKey.from_config(load_config({**DECLARED, **spec.run_config}), spec.clients)
    checkpoint.clients = clients_record(spec.clients, split_sizes(key), split_digests(key))
    checkpoint.save(folder)
    assert decide(spec, DECLARED).resume == folder  # the data it trained on
    shutil.rmtree(data)
    copy_dataset(grey_dataset, data, row_group_size=17)  # the same samples, other files
    assert decide(spec, DECLARED).resume == folder
    shutil.rmtree(data)
    copy_dataset(grey_dataset, data, repaint=7)  # the same sizes, one pixel changed
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    attempt = decide(spec, DECLARED)
    assert attempt.resume is None and str(folder) in attempt.problem
    assert "now holds other samples" in attempt.problem
    assert "--restart-damaged" in attempt.problem
    assert main([str(config), "--out", str(out), "--dry-run"]) == 0
    assert "not run: cannot resume" in capsys.readouterr().out
    monkeypatch.setattr(runner_session, "LocalSuperLink", FakeSuperLink)
    monkeypatch.setattr(FakeSuperLink, "started", [])
    monkeypatch.setattr(FakeSuperLink, "outcome", {})
    monkeypatch.setattr(FakeSuperLink, "entered", 0)
    assert main([str(config), "--out", str(out)]) == 1
    assert FakeSuperLink.started == []  # no run submitted
    assert FakeSuperLink.entered == 0  # nor a SuperLink started for nothing
    assert "now holds other samples" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    assert main([str(config), "--out", str(out), "--restart-damaged"]) == 1  # no outcome
    assert FakeSuperLink.entered == 1 and len(FakeSuperLink.started) == 1  # started anew
    assert read_marker(folder)["abandoned"]
    shutil.rmtree(out)
    folder = interrupted_run(spec, "stopped")
    checkpoint.save(folder)  # the changed data's run again, for the unreadable case
    train = data / "train.parquet"
    intact = train.read_bytes()
    train.write_bytes(intact[: len(intact) // 2])  # unreadable, not changed: kept for later
    unreadable = decide(spec, DECLARED, restart_damaged=True)
    assert "its data cannot be read" in unreadable.problem and unreadable.note is None
    assert not read_marker(folder).get("abandoned")
    train.write_bytes(intact)
    again = decide(spec, DECLARED, restart_damaged=True)
    assert again.resume is None and "starting anew" in again.note
    assert read_marker(folder)["abandoned"]


# ----------------------------------- interrupted for real, then resumed (e2e)
def tiny_fedreg(folder: Path, dataset: Path) -> Path:
    """One FedReG run of 4 rounds on 4 clients: its clients keep a private head, so a
    resume needs their state on disk."""
    return tiny_config(folder, dataset, algo="fedreg", rounds=4, seeds=1)


def only_run_folder(out: Path) -> Path:
    [results] = (out / "tiny" / "fedreg" / "seed0").glob("*/results.json")
    return results.parent


def assert_equal_runs(folder: Path, reference: Path) -> None:
    """Every round's accuracies and sampled clients, and the final global model, equal
    bit for bit."""
    ran, expected = (json.loads((f / "results.json").read_text()) for f in (folder, reference))
    assert ran["run"]["status"] == expected["run"]["status"] == "completed"
    keys = ("round", "sampled_clients", "global_accuracy", "personal_accuracy",
            "client_accuracies")  # fmt: skip
    assert [[r[k] for k in keys] for r in ran["rounds"]] == [
        [r[k] for k in keys] for r in expected["rounds"]
    ]
    final, reference_model = Checkpoint.load(folder)[0], Checkpoint.load(reference)[0]
    assert final.round == reference_model.round == 4
    assert final.model.keys() == reference_model.model.keys()
    assert all(np.array_equal(final.model[k], reference_model.model[k]) for k in final.model)


@pytest.fixture(scope="module")
def uninterrupted(grey_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: the same grid run without interruption."""
    root = tmp_path_factory.mktemp("whole")
    assert main([str(tiny_fedreg(root, grey_dataset)), "--out", str(root / "out")]) == 0
    return only_run_folder(root / "out")


def test_a_second_runner_on_the_same_out_is_refused_until_the_first_is_gone(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Another process (a real one) holds ``--out``: a runner started on it exits 4
    naming that PID and runs nothing. SIGKILL the holder (no chance to clean up): the
    kernel releases the lock, and the next runner goes ahead."""
    config = write(tmp_path / "t.toml", "num-server-rounds = 2\n[experiment]\nname = 't'\n")
    out = tmp_path / "out"
    ran = []
    monkeypatch.setattr(experiments, "run_all", lambda specs, *_, **__: ran.append(specs) or [])
    monkeypatch.setattr(experiments, "finish", lambda *_: 0)
    with held_elsewhere(out, RUNNER_LOCK, "another fedreg-experiment (PID {pid})") as pid:
        assert main([str(config), "--out", str(out)]) == EXIT_BUSY
        err = capsys.readouterr().err
        assert f"{out} is in use by another fedreg-experiment (PID {pid}) since" in err
        assert not ran
    assert main([str(config), "--out", str(out)]) == 0
    assert len(ran) == 1
    assert (out / RUNNER_LOCK).read_text() == ""  # released, and no stale PID left


def runner_at_round_1(config: Path, out: Path, log: Any) -> subprocess.Popen:
    """A fedreg-experiment process on ``config``, returned once round 1 is checkpointed."""
    command = [sys.executable, "-m", "fedreg_tools.experiments", str(config), "--out", str(out)]
    runner = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    seed, deadline = out / "tiny" / "fedreg" / "seed0", time.monotonic() + 300
    try:
        while not any(checkpoint_round(f.parent.parent) >= 1
                      for f in seed.glob("*/checkpoint/state.json")):  # fmt: skip
            assert runner.poll() is None and time.monotonic() < deadline, "no round 1"
            time.sleep(0.05)
    except BaseException:
        kill_tree(runner)
        raise
    return runner


@pytest.mark.e2e
def test_sigterm_then_rerun_continues_from_the_checkpoint_and_equals_an_uninterrupted_run(
    uninterrupted: Path, grey_dataset: Path, tmp_path: Path, capsys
) -> None:
    """SIGTERM to the fedreg-experiment process (by PID) once round 1 is checkpointed: it
    stops the SuperLink and the simulation, exits 143 saying how to continue; the same
    command then resumes that run folder after its checkpoint's round (the rounds before
    are kept, not recomputed) and ends with the uninterrupted run's accuracies and
    model."""
    config, out = tiny_fedreg(tmp_path, grey_dataset), tmp_path / "out"
    with (tmp_path / "first.log").open("w") as log:
        runner = runner_at_round_1(config, out, log)
        try:
            # the same command started twice by mistake: refused while the first runs
            assert main([str(config), "--out", str(out)]) == EXIT_BUSY
            assert f"in use by another fedreg-experiment (PID {runner.pid}) since" in (
                capsys.readouterr().err
            )
            os.kill(runner.pid, signal.SIGTERM)
            assert runner.wait(timeout=120) == 128 + signal.SIGTERM
        finally:
            kill_tree(runner)  # only if the test failed: the runner and what it started
    printed = (tmp_path / "first.log").read_text()
    assert "stopped by SIGTERM" in printed and "Continue with the same command" in printed
    assert processes_naming(out / ".flwr_home") == []  # SuperLink, simulation: all gone
    folder = only_run_folder(out)
    stopped_at = checkpoint_round(folder)
    assert 1 <= stopped_at < 4, printed
    before = json.loads((folder / "results.json").read_text())["rounds"][:stopped_at]
    assert read_marker(folder)["stopped"] == "stopped by SIGTERM"
    run = json.loads((folder / "results.json").read_text())["run"]
    assert run["status"] == "stopped" and "error" not in run  # not "running", not "failed"
    assert run["stopped"]["reason"] == "stopped by SIGTERM"
    assert run["stopped"]["after_round"] == stopped_at
    assert main([str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"resuming {folder} after round {stopped_at}" in printed
    assert only_run_folder(out) == folder  # the same run folder, continued
    results = json.loads((folder / "results.json").read_text())
    assert [r["after_round"] for r in results["run"]["resumed"]] == [stopped_at]
    assert results["run"]["status"] == "completed" and "stopped" not in results["run"]
    # The rounds before the checkpoint are the first attempt's records, timings and all:
    # only rounds stopped_at + 1 .. 4 were computed again.
    assert results["rounds"][:stopped_at] == before
    assert_equal_runs(folder, uninterrupted)
    assert not (out / "tiny" / "fedreg" / "seed0" / "state").exists()  # finished: freed


@pytest.mark.e2e
def test_a_run_that_failed_when_its_data_vanished_resumes_from_its_checkpoint(
    uninterrupted: Path, grey_dataset: Path, tmp_path: Path, capsys
) -> None:
    """The dataset folder is moved away (by the test, for real) once round 1 is
    checkpointed. Every client refuses the next query, the run fails and the runner exits
    1, keeping the clients' state. With the folder back, the same command retries the run
    from its checkpoint, in the same folder (not anew from round 1, which would lose every
    checkpointed round), and ends as the uninterrupted run."""
    data = shutil.copytree(grey_dataset, tmp_path / "data")
    config, out = tiny_fedreg(tmp_path, data), tmp_path / "out"
    with (tmp_path / "first.log").open("w") as log:
        runner = runner_at_round_1(config, out, log)
        try:
            data.rename(tmp_path / "away")
            assert runner.wait(timeout=180) == EXIT_FAILED
        finally:
            kill_tree(runner)  # only if the test failed
    printed = (tmp_path / "first.log").read_text()
    folder = only_run_folder(out)
    record = json.loads((folder / "results.json").read_text())
    assert record["run"]["status"] == "failed", printed
    assert "no train.parquet" in record["run"]["error"]
    failed_at = checkpoint_round(folder)
    assert 1 <= failed_at < 4 and len(record["rounds"]) == failed_at
    assert f"(failed; the same command retries it after round {failed_at})" in printed
    assert (out / "tiny" / "fedreg" / "seed0" / "state").is_dir()  # kept for the retry
    (tmp_path / "away").rename(data)  # mended
    assert main([str(config), "--out", str(out), "--dry-run"]) == 0
    assert f"resumes after round {failed_at}/4; it failed: " in capsys.readouterr().out
    assert main([str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"resuming {folder} after round {failed_at} (it failed: " in printed
    assert only_run_folder(out) == folder
    results = json.loads((folder / "results.json").read_text())
    assert results["rounds"][:failed_at] == record["rounds"]  # kept, not recomputed
    assert "error" not in results["run"]
    assert_equal_runs(folder, uninterrupted)


@pytest.mark.e2e
def test_a_runner_killed_alone_takes_its_superlink_and_simulation_with_it(
    uninterrupted: Path, grey_dataset: Path, tmp_path: Path, capsys
) -> None:
    """SIGKILL to the fedreg-experiment process alone (by PID: an OOM kill, a `kill -9`)
    once round 1 is checkpointed. Left alone, its SuperLink and SuperExec would run on for
    good and the simulation would finish the run unsupervised: the SuperLink's watchdog
    stops them; the same command then resumes the run, which ends
    with the uninterrupted run's accuracies and model."""
    config, out = tiny_fedreg(tmp_path, grey_dataset), tmp_path / "out"
    with (tmp_path / "first.log").open("w") as log:
        runner = runner_at_round_1(config, out, log)
        try:
            assert processes_naming(out / ".flwr_home")  # the SuperLink and the run
            os.kill(runner.pid, signal.SIGKILL)  # the runner only: no chance to clean up
            assert runner.wait(timeout=30) == -signal.SIGKILL
            deadline = time.monotonic() + 60
            while processes_naming(out / ".flwr_home") and time.monotonic() < deadline:
                time.sleep(0.5)
            assert processes_naming(out / ".flwr_home") == []  # stopped, not left running
        finally:
            for pid in processes_naming(out / ".flwr_home"):  # only if the test failed
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    folder = only_run_folder(out)
    assert checkpoint_round(folder) < 4  # the run did not go on to its end unsupervised
    assert main([str(config), "--out", str(out)]) == 0
    assert f"resuming {folder} after round" in capsys.readouterr().out
    assert_equal_runs(folder, uninterrupted)


#: Put first on a process tree's PYTHONPATH: in the process that runs the ServerApp (the
#: simulation's, below the runner's SuperLink), ``ResultsWriter.finish`` says it was
#: reached and waits there for the SIGKILL, so the kill lands after the last round's
#: checkpoint and before the final status, every time. Other processes are untouched.
HOLD_AT_FINISH = """
import importlib.machinery, os, sys, time
from pathlib import Path

class HoldAtFinish:
    def find_spec(self, name, path=None, target=None):
        if name != "fedreg_app.core.metrics":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module
        def exec_module(module):
            load(module)
            def finish(writer, error=None):
                Path(os.environ["HOLD_AT_FINISH_SIGNALS"], "reached").write_text(str(error))
                time.sleep(600)
            module.ResultsWriter.finish = finish
        spec.loader.exec_module = exec_module
        return spec

if os.environ.get("HOLD_AT_FINISH_SIGNALS"):
    sys.meta_path.insert(0, HoldAtFinish())
"""


@pytest.mark.e2e
def test_a_runner_sigkilled_after_the_last_checkpoint_completes_the_run_without_training(
    uninterrupted: Path, grey_dataset: Path, tmp_path: Path, capsys
) -> None:
    """The machine goes (SIGKILL to the runner and every process below it, by PID) after
    the last round's checkpoint, before the ServerApp writes ``completed``: results.json
    still says ``running``. The same command resumes that folder after its last round,
    trains nothing, keeps the recorded rounds as they are and ends ``completed`` with
    the uninterrupted run's accuracies and model."""
    config, out = tiny_fedreg(tmp_path, grey_dataset), tmp_path / "out"
    hooks, signals = tmp_path / "hooks", tmp_path / "signals"
    hooks.mkdir(), signals.mkdir()
    (hooks / "sitecustomize.py").write_text(HOLD_AT_FINISH)
    path = os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "HOLD_AT_FINISH_SIGNALS": str(signals)}
    command = [sys.executable, "-m", "fedreg_tools.experiments", str(config), "--out", str(out)]
    with (tmp_path / "first.log").open("w") as log:
        runner = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 300
            while not (signals / "reached").exists():
                assert runner.poll() is None and time.monotonic() < deadline, "never reached"
                time.sleep(0.05)
            assert (signals / "reached").read_text() == "None"  # the end of a sound run
        finally:
            kill_tree(runner)
    assert runner.returncode == -signal.SIGKILL
    assert processes_naming(out / ".flwr_home") == []  # nothing of the first attempt lives
    folder = only_run_folder(out)
    first = json.loads((folder / "results.json").read_text())
    assert first["run"]["status"] == "running" and checkpoint_round(folder) == 4
    assert [r["round"] for r in first["rounds"]] == [1, 2, 3, 4]
    assert main([str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"resuming {folder} after round 4" in printed
    assert only_run_folder(out) == folder
    results = json.loads((folder / "results.json").read_text())
    assert results["rounds"] == first["rounds"]  # nothing trained again, timings and all
    assert [r["after_round"] for r in results["run"]["resumed"]] == [4]
    assert_equal_runs(folder, uninterrupted)
    assert not (out / "tiny" / "fedreg" / "seed0" / "state").exists()  # finished: freed


@pytest.mark.e2e
def test_max_minutes_stops_at_a_round_boundary_and_the_rerun_completes_the_grid(
    uninterrupted: Path, grey_dataset: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """``--max-minutes 0``: every slice runs at least one round, so this one stops right
    after round 1's checkpoint, with exit status 3; the rerun finishes the grid. ``--out``
    is relative: the resume's path must reach the ServerApp in a form it can resolve, or
    the rerun fails and the run can only start anew."""
    config = tiny_fedreg(tmp_path, grey_dataset)
    monkeypatch.chdir(tmp_path)
    out = Path("out")
    assert main([str(config), "--out", str(out), "--max-minutes", "0"]) == 3
    printed = capsys.readouterr()
    folder = only_run_folder(out)
    stopped_at = checkpoint_round(folder)
    assert "stopped by --max-minutes" in printed.err
    assert f"stopped after round {stopped_at}/4" in printed.err and 1 <= stopped_at < 4
    assert "Continue with the same command" in printed.err
    # the first round the poll saw (round 1, or 2 when a loaded machine polled late)
    assert re.search(
        r"\[run 1/1 \| round ([123])/4\] .* \| grid \1/4 rounds \| [\d.]+ s/round", printed.out
    )
    assert main([str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "grid 4/4 rounds" in printed and "ETA" in printed
    assert_equal_runs(only_run_folder(out), uninterrupted)


class RoundsSuperLink(FakeSuperLink):
    """A "run" that writes one round (results and checkpoint) per poll, from the round its
    ``resume`` folder's checkpoint holds, and records each run config it was given."""

    configs: list[dict[str, Any]] = []
    folder_name = "run1"  # of the run folder a new "run" makes

    def run_polling(
        self, config_file: str, clients: int, log_path: Path, poll: float
    ) -> Iterator[None]:
        run_config = tomllib.loads(Path(config_file).read_text())
        RoundsSuperLink.configs.append(run_config)
        new = Path(run_config["results-dir"]) / self.folder_name
        folder = Path(run_config.get("resume") or new)
        folder.mkdir(exist_ok=True)
        config = load_config({**DECLARED, **run_config}).to_run_config()
        document = results_document("completed", config)
        document["run"]["status"] = "running"
        for server_round in range(checkpoint_round(folder) + 1, config["num-server-rounds"] + 1):
            yield
            first = document["rounds"][0]
            document["rounds"] = [{**first, "round": k} for k in range(1, server_round + 1)]
            (folder / "results.json").write_text(json.dumps(document))
            Checkpoint(
                round=server_round, model={"w": np.ones(2)}, strategy_arrays={},
                strategy_state={}, state_key=folder.name, run_config=config,
            ).save(folder)  # fmt: skip
            Path(config["state-dir"], "runs", folder.name).mkdir(parents=True, exist_ok=True)
        document["run"]["status"] = "completed"
        (folder / "results.json").write_text(json.dumps(document))
        yield


def stopped_after_one_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, link: type[RoundsSuperLink]
) -> tuple[Path, Path, RunSpec]:
    """A 3-round grid run by ``link`` with ``--max-minutes 0``: stopped (exit 3) once a
    round is checkpointed. Returns the config, the output folder and the run's spec."""
    config = write(tmp_path / "t3.toml", "num-server-rounds = 3\n[experiment]\nname = 't3'\n")
    out = tmp_path / "out"
    monkeypatch.setattr(runner_session, "LocalSuperLink", link)
    monkeypatch.setattr(RoundsSuperLink, "configs", [])
    assert main([str(config), "--out", str(out), "--max-minutes", "0"]) == 3
    (spec,) = plan([Experiment.load(config, DECLARED)], out, DECLARED, {})
    return config, out, spec


def test_max_minutes_stops_after_a_round_and_the_rerun_resumes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Without Flower: ``--max-minutes 0`` stops once one round is checkpointed (exit 3,
    the run marked as stopped by the runner); the same command resumes that folder."""
    config, out, spec = stopped_after_one_round(tmp_path, monkeypatch, RoundsSuperLink)
    printed = capsys.readouterr()
    folder = spec.folder / "run1"
    assert checkpoint_round(folder) == 1 and read_marker(folder)["stopped"]
    run = json.loads((folder / "results.json").read_text())["run"]
    assert run["status"] == "stopped"
    assert run["stopped"]["reason"] == "stopped by --max-minutes"
    assert run["stopped"]["after_round"] == 1
    assert "stopped by --max-minutes; t3 fedreg seed 0 stopped after round 1/3" in printed.err
    assert f"fedreg-experiment {config} --out {out} --max-minutes 0" in printed.err
    assert "[run 1/1 | round 1/3] t3 fedreg seed 0 | grid 1/3 rounds |" in printed.out
    assert main([str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert RoundsSuperLink.configs[1]["resume"] == str(folder)
    assert RoundsSuperLink.configs[1]["state-dir"] == RoundsSuperLink.configs[0]["state-dir"]
    assert f"resuming {folder} after round 1" in printed and "grid 3/3 rounds" in printed
    assert not read_marker(folder) and not spec.state_dir.exists()  # finished: state freed


class StaleCopySuperLink(RoundsSuperLink):
    """``flwr run`` names run 7; meanwhile a copy of the run that an earlier SuperLink
    left pending (id 9: its folder sorts after ours) has made a folder of its own in the
    seed's folder and got further, to round 2."""

    folder_name = "20250101-000000_fedreg_run7"

    def run_polling(
        self, config_file: str, clients: int, log_path: Path, poll: float
    ) -> Iterator[None]:
        run_config = tomllib.loads(Path(config_file).read_text())
        config = load_config({**DECLARED, **run_config}).to_run_config()
        log_path.write_text("Successfully started run 7\n")
        stale = Path(run_config["results-dir"]) / "20250101-000000_fedreg_run9"
        stale.mkdir()
        document = results_document("completed", config)
        document["run"]["status"] = "running"
        document["rounds"] = [{**document["rounds"][0], "round": k} for k in (1, 2)]
        (stale / "results.json").write_text(json.dumps(document))
        Checkpoint(round=2, model={"w": np.ones(2)}, strategy_arrays={}, strategy_state={},
                   state_key=stale.name, run_config=config).save(stale)  # fmt: skip
        yield from super().run_polling(config_file, clients, log_path, poll)


def test_the_runner_follows_the_run_it_submitted_not_another_new_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The runner does not take the newest new folder in the seed's folder for its run's
    (with a stale copy of the run writing beside it, it would show and time the copy's
    rounds, and mark the copy stopped): it follows the folder of the run id that
    ``flwr run`` printed: stopped by ``--max-minutes`` after its own round 1."""
    _, _, spec = stopped_after_one_round(tmp_path, monkeypatch, StaleCopySuperLink)
    printed = capsys.readouterr()
    ours, stale = (
        spec.folder / StaleCopySuperLink.folder_name,
        spec.folder / "20250101-000000_fedreg_run9",
    )
    assert checkpoint_round(ours) == 1 and read_marker(ours)["stopped"]
    assert json.loads((ours / "results.json").read_text())["run"]["status"] == "stopped"
    assert not read_marker(stale) and checkpoint_round(stale) == 2
    assert "[run 1/1 | round 1/3] t3 fedreg seed 0" in printed.out
    assert "round 2/3" not in printed.out
    assert "stopped after round 1/3" in printed.err


def test_a_run_folder_name_keeps_its_run_id_whole_however_long_its_parts() -> None:
    """The runner finds its run's folder by the id that ends the name; before, a name
    over 180 characters was cut, run id first."""
    folder = run_folder("/r", ["fedreg", "d" * 300, "a0.1", "s0"], 9447175742636134187)
    assert folder.name.endswith("_run9447175742636134187")
    assert is_valid_state_key(folder.name)


class SignalledSuperLink(RoundsSuperLink):
    """Like RoundsSuperLink, but the runner gets SIGTERM once round 1 is checkpointed."""

    def run_polling(
        self, config_file: str, clients: int, log_path: Path, poll: float
    ) -> Iterator[None]:
        for _ in super().run_polling(config_file, clients, log_path, poll):
            folder = Path(RoundsSuperLink.configs[-1]["results-dir"]) / "run1"
            if checkpoint_round(folder) == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            yield


def test_sigterm_marks_the_run_stopped_and_exits_143(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    config = write(tmp_path / "t3.toml", "num-server-rounds = 3\n[experiment]\nname = 't3'\n")
    out = tmp_path / "out"
    monkeypatch.setattr(runner_session, "LocalSuperLink", SignalledSuperLink)
    monkeypatch.setattr(RoundsSuperLink, "configs", [])
    handler = signal.getsignal(signal.SIGTERM)
    assert main([str(config), "--out", str(out)]) == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is handler  # restored
    err = capsys.readouterr().err
    folder = out / "t3" / "fedreg" / "seed0" / "run1"
    assert read_marker(folder)["stopped"] == "stopped by SIGTERM"
    run = json.loads((folder / "results.json").read_text())["run"]
    assert (run["status"], run["stopped"]["after_round"]) == ("stopped", 1)
    assert "stopped by SIGTERM; t3 fedreg seed 0 stopped after round 1/3" in err
    assert "Continue with the same command" in err


def test_client_resources_become_flwr_runs_federation_config() -> None:
    """A GPU share reaches ``flwr run`` as ``client-resources-num-gpus``; a call naming
    its own CPUs (the benchmarks) keeps the SuperLink's GPU share."""
    assert ClientResources().federation_config(50) == (
        "num-supernodes=50 client-resources-num-cpus=1"
    )
    link = LocalSuperLink(Path("home"), resources=ClientResources(2, 0.25))
    command = link.command("x=1", 50)
    assert command[-1] == (
        "num-supernodes=50 client-resources-num-cpus=2 client-resources-num-gpus=0.25"
    )
    assert link.command("x=1", 8, cpus_per_client=3)[-1] == (
        "num-supernodes=8 client-resources-num-cpus=3 client-resources-num-gpus=0.25"
    )


@pytest.mark.parametrize(
    ("share", "actors"),
    [(0.1, 10), (0.2, 5), (0.05, 20), (0.3, 3), (0.25, 4), (1 / 3, 3), (1.0, 1), (2.0, 1)],
)
def test_a_gpu_share_gives_flowers_pool_as_many_actors_as_fit_on_a_gpu(
    share: float, actors: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through Flower's own parsing (its 32-bit field), a share of 0.1 gave a pool of 9
    actors on one GPU (seen on an H200). The share the launcher sends gives int(1 / g)."""
    from flwr.common.config import parse_config_args
    from flwr.simulation.ray_transport import ray_actor
    from flwr.supercore.utils import simulation_config_from_json

    def pool_size(config: str) -> int:
        fields = {k.replace("-", "_"): v for k, v in parse_config_args([config]).items()}
        sent = simulation_config_from_json(fields)
        resources = {
            "num_cpus": sent.client_resources_num_cpus,
            "num_gpus": sent.client_resources_num_gpus,
        }
        return ray_actor.pool_size_from_resources(resources)

    one_gpu = [{"Resources": {"CPU": 64.0, "GPU": 1.0 if share <= 1 else 2.0}}]
    monkeypatch.setattr(ray_actor.ray, "nodes", lambda: one_gpu)
    assert pool_size(ClientResources(1, share).federation_config(50)) == actors
    if share == 0.1:  # the figure as written: what the launcher no longer sends
        assert (
            pool_size("num-supernodes=50 client-resources-num-cpus=1 client-resources-num-gpus=0.1")
            == 9
        )


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--client-cpus", "0"], "--client-cpus=0"),
        (["--client-gpus", "-0.5"], "--client-gpus=-0.5"),
        (["--client-gpus", "1.5"], "--client-gpus=1.5"),
        (["--client-gpus", "nan"], "--client-gpus=nan"),
        (["--client-gpus", "inf"], "--client-gpus=inf"),
    ],
)
def test_impossible_client_resources_are_refused_naming_the_flag(
    tmp_path: Path, capsys, flags: list[str], named: str
) -> None:
    config = write(tmp_path / "t.toml", "[experiment]\nname = 't'\n")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as refused:
        main([str(config), "--out", str(out), *flags])
    assert refused.value.code == 2
    assert f"{named} is not allowed" in capsys.readouterr().err
    assert not out.exists()  # before any work


def test_client_gpus_without_a_gpu_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Ray would queue actors that ask for a GPU for ever on a machine without one."""
    import torch

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(runner_session, "LocalSuperLink", RoundsSuperLink)
    config = write(tmp_path / "t.toml", "[experiment]\nname = 't'\n")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as refused:
        main([str(config), "--out", str(out), "--client-gpus", "0.25"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "--client-gpus=0.25 asks for a GPU for each client" in err
    assert "sees no CUDA device" in err
    assert not out.exists()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # one GPU, two asked for
    with pytest.raises(SystemExit):
        main([str(config), "--out", str(out), "--client-gpus", "2"])
    assert "more GPUs for each client than this machine has (1)" in capsys.readouterr().err
    assert not out.exists()


def test_client_gpus_reach_the_superlink_of_every_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ray cluster (``RAY_ADDRESS``) has its GPUs elsewhere: the share is passed on."""
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setattr(runner_session, "LocalSuperLink", RoundsSuperLink)
    monkeypatch.setattr(RoundsSuperLink, "configs", [])
    config = write(tmp_path / "t.toml", "num-server-rounds = 1\n[experiment]\nname = 't'\n")
    out = tmp_path / "out"
    assert main([str(config), "--out", str(out), "--client-gpus", "0.25",
                 "--client-cpus", "2"]) == 0  # fmt: skip
    assert RoundsSuperLink.options["resources"] == ClientResources(2, 0.25)
    assert len(RoundsSuperLink.configs) == 1


def test_a_slice_ending_at_the_last_round_lets_the_run_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """On the GPU machine a slice's time ran out as the last round was checkpointed: the
    runner stopped the run before it wrote ``completed``, and said no run had finished.
    The last round's boundary is the run's end: the runner waits for it."""
    config = write(tmp_path / "t2.toml", "num-server-rounds = 2\n[experiment]\nname = 't2'\n")
    out = tmp_path / "out"
    monkeypatch.setattr(runner_session, "LocalSuperLink", RoundsSuperLink)
    monkeypatch.setattr(RoundsSuperLink, "configs", [])
    command = [str(config), "--out", str(out), "--max-minutes", "0"]
    assert main(command) == 3  # stopped after round 1 of 2
    capsys.readouterr()
    assert main(command) == 0  # round 2, the last: the run finishes
    printed = capsys.readouterr()
    (spec,) = plan([Experiment.load(config, DECLARED)], out, DECLARED, {})
    folder = spec.folder / "run1"
    assert json.loads((folder / "results.json").read_text())["run"]["status"] == "completed"
    assert not read_marker(folder)
    assert "done: t2 fedreg seed 0" in printed.out and "stopped" not in printed.err


def test_a_killed_runners_leftovers_are_tidied_once_nothing_resumes_them(tmp_path: Path) -> None:
    """A run finished by a process other than the runner (an orphaned simulation), or a
    runner killed between a run's end and its cleanup, leaves the seed folder's `state/`
    (64 MB for one run) and a `tmp*.toml` behind. The next runner removes them, but never
    the state a run may still resume from."""
    [spec] = one_cell_specs(tmp_path, 1)
    assert spec.own_state_dir
    folder = interrupted_run(spec, "running")
    (spec.folder / "tmpab12cd.toml").write_text("algo = 'fedreg'\n")
    assert tidy(spec) == [spec.folder / "tmpab12cd.toml"]  # resumable: its state stays
    assert spec.state_dir.is_dir()
    write_marker(folder, stopped="stopped by SIGTERM")
    document = json.loads((folder / "results.json").read_text())
    (folder / "results.json").write_text(json.dumps({**document, "run": {
        **document["run"], "status": "failed"}}))  # fmt: skip
    assert tidy(spec) == [] and spec.state_dir.is_dir()  # stopped by the runner: resumed
    finished = results_document("completed", spec.setting, spec.clients)
    (folder / "results.json").write_text(json.dumps(finished))
    assert tidy(spec) == [spec.state_dir] and not spec.state_dir.exists()


def test_a_run_stopped_before_its_first_checkpoint_is_said_to_start_anew(tmp_path: Path) -> None:
    """Such a run is not reported as `stopped after round 0/5 (checkpoint in <folder>)`,
    with no checkpoint there: the next invocation says that it starts the run anew, as
    the documentation promises."""
    [spec] = one_cell_specs(tmp_path, 1)
    write_results(spec, "running")
    attempt = decide(spec, DECLARED)
    assert attempt.resume is None
    assert "stopped before its first checkpoint; starting the run anew" in attempt.note
