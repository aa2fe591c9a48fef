"""The app copy ``flwr run`` is given: the same FAB as the app folder, without the walk
over the virtual environment and the run outputs."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from flwr.cli.build import build_fab_from_disk

from fedreg_app.core.persist import FolderInUseError
from fedreg_tools.launcher import (
    DATABASE,
    HF_OFFLINE_ENV,
    PROJECT,
    WATCH_POLL_S,
    LocalSuperLink,
    _alive,
    config_text,
    descendants,
    processes_naming,
    stage_app,
    wait_until_unused,
)
from fedreg_tools.runner_session import submitted_run_id


def fab_files(fab: bytes) -> dict[str, bytes]:
    """The FAB's members and contents (the zip's own timestamps left out)."""
    with zipfile.ZipFile(io.BytesIO(fab)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def small_app(root: Path) -> Path:
    """An app folder laid out like a checkout: sources, a venv, outputs, tests."""
    app = root / "app"
    (app / "fedreg_app").mkdir(parents=True)
    shutil.copy(PROJECT / "pyproject.toml", app / "pyproject.toml")
    (app / ".gitignore").write_text(".venv/\nresults/\n*.fab\n__pycache__/\n")
    (app / "README.md").write_text("# app\n")
    (app / "fedreg_app" / "__init__.py").write_text("")
    (app / "fedreg_app" / "server_app.py").write_text("app = None\n")
    for package in ("strategies", "clients"):
        (app / package).mkdir()
        (app / package / "__init__.py").write_text("")
    (app / "configs").mkdir()
    (app / "configs" / "grid.toml").write_text("alpha = 0.1\n")
    (app / "docs").mkdir()
    (app / "docs" / "figure.png").write_bytes(b"\x89PNG")  # a FAB holds no images
    for ignored in (".venv/lib/site", "results/run", "fedreg_app/__pycache__"):
        (app / ignored).mkdir(parents=True)
        (app / ignored / "module.py").write_text("x = 1\n")
        (app / ignored / "data.json").write_text("{}")
    (app / "tests").mkdir()
    (app / "tests" / "test_app.py").write_text("def test(): pass\n")
    (app / "old.fab").write_bytes(b"zip")
    return app


def test_the_staged_copy_builds_the_same_fab_and_leaves_out_ignored_folders(
    tmp_path: Path,
) -> None:
    """The copy holds what the FAB will: Flower's include patterns narrowed by the app's
    ``fab-include`` (not the README, configs and tests, which Flower would leave out of
    the FAB anyway), less what ``.gitignore`` names."""
    app = small_app(tmp_path)
    staged = stage_app(app, tmp_path / "home" / "app")
    assert fab_files(build_fab_from_disk(staged)) == fab_files(build_fab_from_disk(app))
    copied = sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file())
    assert copied == [
        ".gitignore", "clients/__init__.py", "fedreg_app/__init__.py",
        "fedreg_app/server_app.py", "pyproject.toml", "strategies/__init__.py",
    ]  # fmt: skip
    (app / "fedreg_app" / "server_app.py").write_text("app = 1\n")
    (staged / "stale.py").write_text("")  # a copy is replaced whole, never merged
    stage_app(app, staged)
    assert (staged / "fedreg_app" / "server_app.py").read_text() == "app = 1\n"
    assert not (staged / "stale.py").exists()
    # a fab-exclude is left to Flower: applied to the copy too, Flower would refuse its
    # pattern for matching no file there
    (app / "fedreg_app" / "scratch.py").write_text("x = 1\n")
    pyproject = app / "pyproject.toml"
    original = pyproject.read_text()
    with_exclude = original.replace(
        "fab-include", 'fab-exclude = ["fedreg_app/scratch.py"]\nfab-include', 1
    )
    pyproject.write_text(with_exclude)
    staged = stage_app(app, tmp_path / "home" / "app")
    assert fab_files(build_fab_from_disk(staged)) == fab_files(build_fab_from_disk(app))
    assert "fedreg_app/scratch.py" not in fab_files(build_fab_from_disk(staged))
    # an app without fab-include: Flower's own patterns, as the FAB it builds
    pyproject.write_text(original.replace("fab-include", "# fab-include"))
    staged = stage_app(app, tmp_path / "home" / "app")
    assert fab_files(build_fab_from_disk(staged)) == fab_files(build_fab_from_disk(app))
    copied = sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file())
    assert {"README.md", "configs/grid.toml", "tests/test_app.py"} <= set(copied)


def test_the_projects_fab_holds_its_code_only(tmp_path: Path) -> None:
    """The FAB every SuperNode (a Jetson-class board, say) downloads and installs held the
    tests, docs, benchmarks, configs and the 2,400-line README: 111 files, 1.0 MB. The
    project's ``fab-include`` keeps the three packages the apps import, and every one of
    their modules."""
    fab = fab_files(build_fab_from_disk(stage_app(PROJECT, tmp_path / "app")))
    code = {p.relative_to(PROJECT).as_posix() for package in ("fedreg_app", "strategies",
            "clients") for p in (PROJECT / package).rglob("*.py")}  # fmt: skip
    assert set(fab) == {".info/CONTENT", "pyproject.toml", *code}


def test_flower_homes_and_outputs_inside_the_app_folder_are_not_packed(tmp_path: Path) -> None:
    """A user's ``FLWR_HOME`` inside the checkout would get every installed copy of the
    app packed into the next FAB (111, 221, 441 files) until Flower refused a path deeper
    than 10 folders; a runner's or replay's ``--out`` inside it would be copied into its own
    staged app (``det/.flwr_home/app/...``) with every run record under it. The project's
    ``.gitignore`` leaves Flower homes out of any FAB, and the staged copy leaves out
    every folder holding a ``.flwr_home``: only the app's own files are packed."""
    app = small_app(tmp_path)
    shutil.copy(PROJECT / ".gitignore", app / ".gitignore")  # the project's own rules
    installed = app / "myhome" / "apps" / "fedreg.fedreg-app.0.1.0.2eea62cf"
    for folder in (installed / "fedreg_app", app / "det" / ".flwr_home" / "app" / "fedreg_app",
                   app / "det" / "tiny" / "fedreg" / "seed0" / "run1"):  # fmt: skip
        folder.mkdir(parents=True)
    (installed / "fedreg_app" / "server_app.py").write_text("app = None\n")
    (installed / "pyproject.toml").write_text("")
    (app / "myhome" / "config.toml").write_text("")
    (app / "det" / ".flwr_home" / "app" / "fedreg_app" / "server_app.py").write_text("")
    (app / "det" / "tiny" / "fedreg" / "seed0" / "run1" / "results.json").write_text("{}")
    (app / "det" / "summary.md").write_text("")
    (app / "replays" / "replay-k11s85ck" / "results").mkdir(parents=True)  # fedreg-replay --out
    (app / "replays" / "replay-k11s85ck" / "results" / "results.json").write_text("{}")
    packed = set(fab_files(build_fab_from_disk(app)))
    assert not {n for n in packed if "/apps/" in n or ".flwr_home" in n or "replay-" in n}, packed
    # the project's fab-include: the app's code only, wherever else files lie
    assert {n.split("/")[0] for n in packed} == {".info", "pyproject.toml", "fedreg_app",
                                                 "strategies", "clients"}, packed  # fmt: skip
    staged = stage_app(app, app / "det" / ".flwr_home" / "app")
    copied = {p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()}
    assert not {name for name in copied if name.startswith(("det/", "myhome/apps/"))}, copied
    assert {"fedreg_app/server_app.py", "pyproject.toml"} <= copied


class SuperLinkWithoutSuperExec(LocalSuperLink):
    """A SuperLink that starts no SuperExec: a run submitted to it stays pending, as one
    does when ``fedreg-experiment`` is stopped just after it submitted the run."""

    def superlink_command(self, isolation: str = "process") -> list[str]:
        return super().superlink_command(isolation)


def test_a_run_left_pending_by_a_stopped_superlink_is_not_started_by_the_next(
    tmp_path: Path, grey_dataset: Path
) -> None:
    """The runner keeps one FLWR_HOME per output folder. A run still pending in its
    SuperLink's database when the runner was stopped would be started by the next runner's
    SuperLink, beside the run the runner resumes: two copies of one run at half speed
    each, the stale copy in a run folder of its own. A SuperLink we start forgets the runs
    of the one before (the app resumes runs from its checkpoints)."""
    home, results_dir = tmp_path / "home", tmp_path / "results"
    config = config_text({"dataset-path": str(grey_dataset), "num-server-rounds": 1,
                          "min-partition-size": 5, "results-dir": str(results_dir)})  # fmt: skip
    with SuperLinkWithoutSuperExec(home, extra_env=HF_OFFLINE_ENV) as link:
        submitted = subprocess.Popen(
            link.command(config, supernodes=2), cwd=link.app, env=link.env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        printed = tmp_path / "flwr.log"
        with printed.open("w") as log:
            for line in submitted.stdout:  # `flwr run --stream` waits for the run's logs
                log.write(line)
                if "Successfully started run" in line:
                    break
        submitted.terminate()
        submitted.wait(timeout=30)
    run_id = submitted_run_id(printed)  # as the runner reads flwr run's real output
    assert run_id is not None, printed.read_text()
    assert (home / DATABASE).is_file()  # the pending run is on disk
    with LocalSuperLink(home, extra_env=HF_OFFLINE_ENV):
        time.sleep(10)  # a pending run is taken within a second (the SuperExec polls 0.1 s)
        log = (home / "superlink.log").read_text()
    assert f"of run {run_id}" not in log, log
    assert not results_dir.exists()  # no ServerApp of it ever started


def test_a_live_superlinks_database_is_not_deleted_under_it(tmp_path: Path) -> None:
    """A rerun in the seconds after a runner was SIGKILLed (its lock gone, its watchdog
    still stopping the SuperLink) must not delete the live SuperLink's database. A process
    that names the database is waited for, then named."""
    database = tmp_path / DATABASE
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                               "--database", str(database)])  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while holder.pid not in processes_naming(database):  # until it has started
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(FolderInUseError, match=rf"processes \[{holder.pid}\] still use"):
            wait_until_unused(database, timeout=1.0)
    finally:
        holder.kill()
        holder.wait()
    wait_until_unused(database, timeout=1.0)  # gone: nothing to wait for


def test_the_watchdog_stops_a_tree_whose_owner_is_gone_and_leaves_it_otherwise(
    tmp_path: Path,
) -> None:
    """The SuperLink's watchdog: while its owner runs, nothing happens; once the owner is
    gone (here a process killed by SIGKILL), the watched tree is stopped."""
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    sleeper = "import time; time.sleep(60)"
    child = f"subprocess.Popen([sys.executable, '-c', {sleeper!r}])"
    parent = f"import subprocess, sys, time; {child}; time.sleep(60)"
    tree = subprocess.Popen([sys.executable, "-c", parent], start_new_session=True)
    code = f"from fedreg_tools.launcher import watchdog; watchdog({owner.pid}, {tree.pid})"
    guard = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        time.sleep(3 * WATCH_POLL_S + 1)
        below = descendants(tree.pid)
        assert tree.poll() is None and guard.poll() is None and below  # owner alive
        owner.kill()
        owner.wait()
        assert guard.wait(timeout=60) == 0
        assert tree.wait(timeout=10) is not None and not any(map(_alive, below))
    finally:
        for process in (owner, tree, guard):
            process.kill()
            process.wait()
