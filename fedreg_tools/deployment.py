"""A real Flower deployment on one machine: a SuperLink and SuperNodes as separate
processes on loopback, for tests, for measuring deployment against simulation, and for
trying the app the way devices run it before going to real hardware.

    with LocalDeployment(tmp, nodes=[{"partition-id": 0, "num-partitions": 3}, ...]) as d:
        log = d.run("algo='fedreg' num-server-rounds=3")
        d.kill_supernode(1)      # a device drops out
        d.start_supernode(1)     # ...and comes back (a new node id, same state-dir)

Every process is started in its own session and stopped by its PID (SIGTERM, then
SIGKILL), together with what it spawned. With ``tls`` (a folder made by
``deploy/make_certs.sh``: ``ca.crt``, ``server.pem``, ``server.key``) all connections use
TLS; without it everything runs ``--insecure``, which is for loopback experiments only.
``supernode_auth=True`` (needs ``tls``) starts the SuperLink with
``--enable-supernode-auth``; SuperNodes added with ``add_supernode(config, extra_args)``
then pass ``--auth-supernode-private-key`` among their ``extra_args``. What this setup
protects, and what it does not, is measured in ``tests/test_deployment_security.py``.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from fedreg_tools.launcher import (
    BIN,
    DATABASE,
    PROJECT,
    QUIET_OFFLINE_ENV,
    TASK_POLL_ENV,
    config_text,
    free_port,
    kill_tree,
    stage_app,
    stop_process,
)

CONNECTION = "local-deploy"


def node_config_arg(config: dict[str, Any]) -> str:
    """``--node-config`` text: ``partition-id=0 num-partitions=3 state-dir="/x"``."""
    return config_text(config)


class LocalDeployment:
    """SuperLink + SuperNodes on 127.0.0.1 for the duration of a ``with`` block."""

    def __init__(
        self,
        home: Path,
        nodes: list[dict[str, Any]],
        app: Path = PROJECT,
        tls: Path | None = None,
        extra_env: dict[str, str] | None = None,
        supernode_auth: bool = False,
    ) -> None:
        self.home, self.nodes, self.app, self.tls = home, nodes, app, tls
        self.source = app  # ``flwr run`` gets a staged copy of it (see :func:`stage_app`)
        if supernode_auth and tls is None:
            raise ValueError("SuperNode authentication needs TLS: pass tls=<certificates>")
        self.supernode_auth = supernode_auth
        self.port = free_port()
        self.node_ports = [free_port() for _ in nodes]
        self.node_args: list[list[str]] = [[] for _ in nodes]
        self.env = {
            **TASK_POLL_ENV,
            **os.environ,
            **QUIET_OFFLINE_ENV,
            **(extra_env or {}),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "FLWR_HOME": str(home / "flwr_home"),
        }
        self.superlink: subprocess.Popen | None = None
        self.supernodes: list[subprocess.Popen | None] = [None] * len(nodes)
        self._logs: list[Any] = []

    # ----------------------------------------------------------- lifecycle
    def __enter__(self) -> LocalDeployment:
        self.home.mkdir(parents=True, exist_ok=True)
        self.app = stage_app(self.source, self.home / "app")
        self._write_connection()
        try:
            self.start_superlink()
            for index in range(len(self.nodes)):
                self.start_supernode(index)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        for index in range(len(self.supernodes)):
            self.kill_supernode(index, hard=False)
        stop_process(self.superlink)
        self.superlink = None
        for log in self._logs:
            log.close()
        self._logs.clear()

    def pids(self) -> list[int]:
        """PIDs of the processes this deployment started and that still run."""
        processes = [self.superlink, *self.supernodes]
        return [p.pid for p in processes if p is not None and p.poll() is None]

    # ------------------------------------------------------------ processes
    def _security(self, role: str) -> list[str]:
        if self.tls is None:
            return ["--insecure"]
        if role == "superlink":
            return [
                "--ssl-ca-certfile", str(self.tls / "ca.crt"),
                "--ssl-certfile", str(self.tls / "server.pem"),
                "--ssl-keyfile", str(self.tls / "server.key"),
            ]  # fmt: skip
        return ["--root-certificates", str(self.tls / "ca.crt")]

    def _spawn(self, command: list[str], log_name: str) -> subprocess.Popen:
        log = (self.home / log_name).open("a")
        self._logs.append(log)
        return subprocess.Popen(
            command, env=self.env, cwd=self.home, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def start_superlink(self) -> None:
        command = [
            str(BIN / "flower-superlink"), *self._security("superlink"),
            "--isolation", "subprocess", "--disable-runtime-dependency-installation",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--database", str(self.home / DATABASE),  # kept: SuperNodes outlive a restart
        ]  # fmt: skip
        if self.supernode_auth:
            command.append("--enable-supernode-auth")
        self.superlink = self._spawn(command, "superlink.log")
        self._wait_healthy()

    def start_supernode(self, index: int) -> None:
        """Start (or restart) SuperNode ``index`` with its node config."""
        command = [
            str(BIN / "flower-supernode"), *self._security("supernode"),
            "--superlink", f"127.0.0.1:{self.port}",
            "--port", str(self.node_ports[index]),
            "--node-config", node_config_arg(self.nodes[index]),
            *self.node_args[index],
        ]  # fmt: skip
        self.supernodes[index] = self._spawn(command, f"supernode{index}.log")

    def add_supernode(self, node_config: dict[str, Any], extra_args: Sequence[str] = ()) -> int:
        """Start one more SuperNode (e.g. after its key was registered) and return its
        index. ``extra_args`` go on its command line, here and on every restart, e.g.
        ``["--auth-supernode-private-key", "<key>"]``."""
        self.nodes = [*self.nodes, node_config]  # the caller's list stays as it was
        self.node_ports.append(free_port())
        self.node_args.append(list(extra_args))
        self.supernodes.append(None)
        index = len(self.nodes) - 1
        self.start_supernode(index)
        return index

    def kill_supernode(self, index: int, hard: bool = True) -> None:
        """Stop a SuperNode and what it spawned; ``hard`` kills at once, like a device
        losing power."""
        process = self.supernodes[index]
        if hard:
            kill_tree(process)
        stop_process(process)
        self.supernodes[index] = None

    def kill_superlink(self) -> None:
        """The server crashes: the SuperLink and its ServerApp die at once. SuperNodes keep
        running and reconnect when a SuperLink is back on the same port and database."""
        kill_tree(self.superlink)
        self.superlink = None

    def _wait_healthy(self, timeout: float = 60.0) -> None:
        scheme = "https" if self.tls else "http"
        context = None
        if self.tls:
            import ssl

            context = ssl.create_default_context(cafile=str(self.tls / "ca.crt"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.superlink.poll() is not None:
                raise RuntimeError(f"flower-superlink exited; see {self.home / 'superlink.log'}")
            try:
                urllib.request.urlopen(
                    f"{scheme}://127.0.0.1:{self.port}/health", timeout=1, context=context
                )
                return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"flower-superlink not healthy; see {self.home / 'superlink.log'}")

    # ------------------------------------------------------------------ runs
    def _write_connection(self) -> None:
        """The ``flwr`` CLI's connection to this SuperLink, in its own FLWR_HOME."""
        lines = [
            "[superlink]",
            f'default = "{CONNECTION}"',
            "",
            f"[superlink.{CONNECTION}]",
            f'address = "127.0.0.1:{self.port}"',
        ]
        if self.tls is None:
            lines.append("insecure = true")
        else:
            lines.append(f'root-certificates = "{self.tls / "ca.crt"}"')
        folder = self.home / "flwr_home"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.toml").write_text("\n".join(lines) + "\n")

    def command(self, run_config: str) -> list[str]:
        return [
            str(BIN / "flwr"), "run", str(self.app), CONNECTION, "--stream",
            "--run-config", run_config,
        ]  # fmt: skip

    def run(self, run_config: str, timeout: float = 3600) -> str:
        """Submit a run and follow it to the end; returns the streamed log."""
        result = subprocess.run(
            self.command(run_config), cwd=self.app, env=self.env, capture_output=True,
            text=True, timeout=timeout,
        )  # fmt: skip
        return result.stdout + result.stderr

    def start_run(self, run_config: str, log_path: Path) -> subprocess.Popen:
        """Submit a run and follow it in the background (its log to ``log_path``)."""
        log = log_path.open("w")
        self._logs.append(log)
        return subprocess.Popen(
            self.command(run_config), cwd=self.app, env=self.env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
