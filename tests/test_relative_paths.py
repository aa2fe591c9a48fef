"""Input paths given relative. ``flwr run`` passes the app neither the folder it was
called from nor the app's own path, and the ServerApp and ClientApps run in the
SuperLink's working directory: a relative ``dataset-path`` or ``init-model`` in the run
config is refused before any work, naming the key. The tools that submit runs from the
user's own folder (``fedreg-experiment``, ``fedreg-replay``) make them absolute first, and
a SuperNode's own ``--node-config dataset-path`` is read in the folder the node runs in."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Context, RecordDict

from fedreg_app import client_app
from fedreg_app.core.config import ConfigError, refuse_relative_paths
from fedreg_tools.overrides import declared_run_config
from fedreg_tools.replay import read_recording, replay_config
from fedreg_tools.runner_plan import Experiment, plan
from tests.inprocess import results, run_server
from tests.test_replay import results_file

DECLARED = declared_run_config()


def small_run(dataset: Path | str, results_dir: Path) -> dict[str, Any]:
    return {
        "algo": "fedavg", "dataset-path": str(dataset), "local-epochs": 1,
        "fraction-train": 0.5, "min-partition-size": 5, "num-server-rounds": 1,
        "results-dir": str(results_dir),
    }  # fmt: skip


@pytest.mark.parametrize("key", ["dataset-path", "init-model"])
def test_a_relative_input_path_in_the_run_config_is_refused_before_any_work(
    key: str, grey_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even where the path would be found from the ServerApp's folder (here the test's),
    it is refused: in a real run that folder is the SuperLink's, not the user's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.npz").touch()
    relative = {"dataset-path": os.path.relpath(grey_dataset), "init-model": "w.npz"}[key]
    config = {**small_run(grey_dataset, tmp_path / "results"), key: relative}
    grid, stopped = run_server(config)
    assert isinstance(stopped, ConfigError)
    message = str(stopped)
    assert f"{key}={relative!r} is a relative path" in message
    assert "absolute" in message and "SuperLink's working directory" in message
    assert grid.delivered == []  # not even a query
    document = results(tmp_path / "results")
    assert document["run"]["status"] == "failed" and key in document["run"]["error"]


def test_absolute_paths_and_the_home_folder_pass() -> None:
    refuse_relative_paths({"dataset-path": "/data/fashion_mnist", "init-model": ""})
    refuse_relative_paths({"dataset-path": "~/data/fashion_mnist"})
    refuse_relative_paths({})
    with pytest.raises(ConfigError, match=r"^dataset-path='\./data' is a relative path"):
        refuse_relative_paths({"dataset-path": "./data"})


def node_context(run_config: dict[str, Any], **node: Any) -> Context:
    return Context(
        run_id=1, node_id=1, state=RecordDict(), run_config=run_config,
        node_config={"partition-id": 0, "num-partitions": 2, **node},
    )  # fmt: skip


def test_a_nodes_own_relative_copy_is_read_in_its_folder_and_the_run_configs_is_refused(
    grey_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    relative = os.path.relpath(grey_dataset)
    own = client_app.run_config_of(
        node_context({"dataset-path": "/elsewhere/data"}, **{"dataset-path": relative})
    )
    assert own.dataset_path == str(grey_dataset.resolve())
    with pytest.raises(ConfigError, match=r"the run config's dataset-path='\.\./.*' is a relative"):
        client_app.run_config_of(node_context({"dataset-path": relative}))


def test_a_deployed_node_with_a_relative_copy_trains(
    grey_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's copy hidden from the nodes, each node names its own relative to the
    folder it runs in: the run completes on the same partition."""
    server_copy = tmp_path / "server-data"
    server_copy.mkdir()
    for path in grey_dataset.glob("*.parquet"):
        (server_copy / path.name).write_bytes(path.read_bytes())
    monkeypatch.chdir(tmp_path)
    config = small_run(server_copy, tmp_path / "results")
    _, stopped = run_server(config, node_config={"dataset-path": os.path.relpath(grey_dataset)},
                            hidden_from_nodes=server_copy)  # fmt: skip
    assert stopped is None
    assert results(tmp_path / "results")["run"]["status"] == "completed"


def test_the_runner_makes_relative_input_paths_absolute(
    grey_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--set dataset-path=../x`` is read where the runner is started."""
    experiment_file = tmp_path / "e.toml"
    experiment_file.write_text(textwrap.dedent("""
        [experiment]
        name = "rel"
        algos = ["fedavg"]
    """))  # fmt: skip
    monkeypatch.chdir(tmp_path)
    overrides = {"dataset-path": os.path.relpath(grey_dataset)}
    assert overrides["dataset-path"].startswith("..")
    [spec] = plan([Experiment.load(experiment_file, DECLARED)], tmp_path / "out", DECLARED,
                  overrides, seeds=1)  # fmt: skip
    assert spec.run_config["dataset-path"] == str(grey_dataset.resolve())
    refuse_relative_paths(spec.run_config)  # what the ServerApp will accept


def test_a_replay_makes_a_relative_set_path_absolute(
    grey_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recording = read_recording(results_file(tmp_path, **{"dataset-path": "/gone/data"}))
    monkeypatch.chdir(tmp_path)
    overrides = {"dataset-path": os.path.relpath(grey_dataset)}
    config, _ = replay_config(recording, overrides, tmp_path / "r", DECLARED)
    assert config["dataset-path"] == str(grey_dataset.resolve())
    refuse_relative_paths(config)
