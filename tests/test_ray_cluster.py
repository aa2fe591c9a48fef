"""Simulation on a multi-node Ray cluster: a Ray head and a worker
node on loopback (one CPU each, as two machines would be), a SuperLink whose simulation
attaches to that cluster through ``RAY_ADDRESS``, and a small run whose records show that
clients ran on both nodes. Opt-in (``--ray-cluster``): it starts a Ray cluster of its own,
about a minute."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedreg_tools.launcher import BIN, LocalSuperLink, free_port

pytestmark = pytest.mark.ray_cluster


class RayNodes:
    """``ray start`` for a head and one worker node, each in its own process group (its
    daemons stay in it), stopped by those groups: ``ray stop`` would stop every Ray
    runtime of the user on the machine, not only these."""

    def __init__(self, temp_dir: Path) -> None:
        self.temp_dir = temp_dir
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.groups: list[int] = []

    def start(self, *arguments: str) -> None:
        process = subprocess.Popen(
            [str(BIN / "ray"), "start", "--num-cpus=1", "--disable-usage-stats", *arguments],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.groups.append(process.pid)
        output, _ = process.communicate(timeout=120)
        assert process.returncode == 0, output

    def __enter__(self) -> RayNodes:
        self.start("--head", f"--port={self.port}", f"--temp-dir={self.temp_dir}",
                   "--include-dashboard=false")  # fmt: skip
        self.start(f"--address={self.address}")
        return self

    def __exit__(self, *_: object) -> None:
        for signal_number in (signal.SIGTERM, signal.SIGKILL):
            for group in self.groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal_number)
            time.sleep(3)

    def node_ids(self) -> set[str]:
        """The live nodes' ids, as the cluster reports them."""
        script = (
            f"import json, ray; ray.init(address={self.address!r}, logging_level='ERROR');"
            "print(json.dumps([n['NodeID'] for n in ray.nodes() if n['Alive']]))"
        )
        output = subprocess.run([str(BIN / "python"), "-c", script], capture_output=True,
                                text=True, timeout=120, check=True).stdout  # fmt: skip
        return set(json.loads(output.strip().splitlines()[-1]))


@pytest.fixture
def ray_nodes() -> Iterator[RayNodes]:
    # Ray's socket paths must stay short: a temp dir directly under /tmp.
    with (
        tempfile.TemporaryDirectory(prefix="ray-", dir="/tmp") as temp_dir,
        RayNodes(Path(temp_dir)) as nodes,
    ):
        yield nodes


def test_a_simulation_spreads_its_clients_over_the_clusters_nodes(
    ray_nodes: RayNodes, grey_dataset: Path, tmp_path: Path
) -> None:
    nodes = ray_nodes.node_ids()
    assert len(nodes) == 2
    env = {"RAY_ADDRESS": ray_nodes.address, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    results_dir = tmp_path / "results"
    with LocalSuperLink(tmp_path / "flwr_home", extra_env=env) as superlink:
        log = superlink.run(
            f"algo='fedreg' dataset-path='{grey_dataset}' results-dir='{results_dir}' "
            "num-server-rounds=3 local-epochs=1 fraction-train=1.0 min-partition-size=5",
            supernodes=4,
            timeout=600,
        )
    [path] = list(results_dir.glob("*/results.json"))
    document = json.loads(path.read_text())
    assert document["run"]["status"] == "completed", log[-3000:]
    used = {
        host["ray-node"]
        for record in document["rounds"]
        for host in record["client_hosts"].values()
    }
    assert used == nodes  # every client recorded a node of this cluster, and both served
    assert all(len(r["client_hosts"]) == 4 for r in document["rounds"])
