"""Run the app through ``flwr run`` in Flower's simulation, with a SuperLink we own.

``flwr run .`` would start a detached local SuperLink and leave it running. Here the
SuperLink is started on free loopback ports, with its own ``FLWR_HOME``, and stopped —
with everything it spawned (SuperExec, simulation, Ray) — by process group on exit.
Used by the experiment runner and by the end-to-end tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from fedreg_app.core.persist import FolderInUseError

PROJECT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
#: For runs on local dataset copies: Hugging Face libraries never reach for the network.
HF_OFFLINE_ENV = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
QUIET_OFFLINE_ENV = {
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",  # use this environment, no uv sync
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
}


#: The folder under a runner's or a replay's output where its SuperLink keeps its home.
SUPERLINK_HOME = ".flwr_home"


def stage_app(app: Path, target: Path) -> Path:
    """A copy of the app's source files in ``target`` (replaced), for ``flwr run``.

    ``flwr run <app>`` resolves every file under the app folder before its ignore rules
    apply: in a checkout holding its virtual environment (.venv, ~47,000 files) that took
    7 s of every run here. The copy keeps what Flower's own rules would put in a FAB (its
    include patterns, narrowed by the app's ``fab-include``, less what ``.gitignore``
    names: the venv, the results, the experiments), ``pyproject.toml``
    and the ``.gitignore`` itself, so the FAB built from it is the one ``flwr run`` would
    build from the app; Flower filters the copy again as usual. An
    output folder inside the app (a ``--out`` of the runner or a replay: one that holds a
    ``.flwr_home``) is left out too, whatever ``.gitignore`` says: its run records and
    earlier staged copies are not the app, and ``target`` may lie in it."""
    from flwr.cli.utils import build_pathspec, load_gitignore_patterns
    from flwr.common.constant import FAB_INCLUDE_PATTERNS

    ignored = build_pathspec(load_gitignore_patterns(app / ".gitignore"))
    included = build_pathspec(FAB_INCLUDE_PATTERNS)
    # not fab-exclude: Flower refuses a pattern that matches no file of the copy
    app_include = app_fab_include(app)
    shutil.rmtree(target, ignore_errors=True)
    for folder, subfolders, files in os.walk(app):
        relative = Path(folder).relative_to(app)
        subfolders[:] = [
            d for d in subfolders
            if not ignored.match_file(f"{(relative / d).as_posix()}/")
            and not (Path(folder) / d / SUPERLINK_HOME).exists()
        ]  # fmt: skip
        for name in files:
            path = (relative / name).as_posix()
            wanted = path in (".gitignore", "pyproject.toml") or (
                included.match_file(path) and not ignored.match_file(path)
                and (app_include is None or app_include.match_file(path))
            )  # fmt: skip
            if wanted and not (Path(folder) / name).is_symlink():
                (target / relative).mkdir(parents=True, exist_ok=True)
                shutil.copy2(Path(folder) / name, target / relative / name)
    return target


def app_fab_include(app: Path) -> Any:
    """The app's ``fab-include`` as a path spec (None where it sets none, or its
    ``pyproject.toml`` cannot be read: Flower names that when it builds)."""
    from flwr.cli.build import get_user_fab_patterns
    from flwr.cli.utils import build_pathspec

    try:
        config = tomllib.loads((app / "pyproject.toml").read_text())
        include, _ = get_user_fab_patterns(config)
    except (OSError, ValueError):  # tomllib's errors are ValueErrors, and Flower's
        return None
    return None if include is None else build_pathspec(include)


#: A SuperExec (the SuperLink's, which starts the simulation; a SuperNode's, which starts
#: a ``flwr-clientapp`` process per message) asks for new work once a second by default.
#: Deployed, every message waits for that poll, half a second on average: the local
#: deployment's SuperNodes poll every 0.1 s. A simulation waits for it once, at its start,
#: while the polls (each a request the SuperLink answers) go on for the whole run: at 0.1 s
#: they took about a tenth of a core from the client actors (``benchmarks/round_limit.py
#: --settings FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.1 FLWR_SUPEREXEC_TASK_POLL_INTERVAL=1``),
#: so the simulation's SuperLink keeps Flower's default. Flower reads the interval from
#: the environment (0.01-60 s); the environment's own value wins.
TASK_POLL_ENV = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """PIDs of every process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, stack = [], list(children.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children.get(child, []))
    return found


def kill_tree(process: subprocess.Popen | None) -> None:
    """SIGKILL a process and everything below it at once, like a machine losing power."""
    if process is None or process.poll() is not None:
        return
    for pid in [*descendants(process.pid), process.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=30)


def stop_process(process: subprocess.Popen | None, grace: float = 20.0) -> None:
    """SIGTERM the process's group (it was started in its own session) and the groups its
    descendants lead (Flower's SuperExec starts one of its own, with the simulation and
    Ray below it), then SIGKILL whatever of them lingers. Only processes this one started
    are signalled; its group is signalled even if the process itself has exited."""
    if process is None:
        return
    stop_tree(process.pid, grace, process.wait)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10.0)


def stop_tree(pid: int, grace: float = 20.0, wait: Callable[..., Any] | None = None) -> None:
    """:func:`stop_process` by PID (``wait``: the caller's way to reap ``pid``)."""
    below = descendants(pid)
    groups = {pid} | {child for child in below if _leads_group(child)}
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
    if wait is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            wait(timeout=grace)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in [pid, *below]):
        time.sleep(0.2)
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    for child in below:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


#: How often a SuperLink's watchdog looks whether the process that started it still runs.
WATCH_POLL_S = 1.0


def watchdog(owner: int, superlink: int) -> None:
    """Stop ``superlink`` and everything below it once ``owner`` (the runner that started
    it) is gone. A runner killed by SIGKILL cannot stop its SuperLink: without this
    watchdog it runs on, the simulation finishes the run unsupervised, and the next
    runner deletes the database of the live SuperLink. Run in a process of its own."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the owner's to handle
    while _alive(owner) and _alive(superlink):
        time.sleep(WATCH_POLL_S)
    if _alive(superlink):
        stop_tree(superlink)


def start_watchdog(superlink: int) -> subprocess.Popen:
    """A process that stops ``superlink``'s tree if this process dies first."""
    code = f"from fedreg_tools.launcher import watchdog; watchdog({os.getpid()}, {superlink})"
    quiet = subprocess.DEVNULL  # a pipe on the owner's output would wait for it to end
    return subprocess.Popen([sys.executable, "-c", code], cwd=PROJECT, start_new_session=True,
                            stdin=quiet, stdout=quiet, stderr=quiet)  # fmt: skip


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing


@dataclass(frozen=True)
class ClientResources:
    """What Ray reserves for each client actor. A ``gpus`` share below 1 lets actors share
    a GPU (0.25: four actors on each GPU), and each of them trains on it (``device =
    "auto"``); with ``gpus = 0`` Ray hides the GPUs from the actors."""

    cpus: int = 1
    gpus: float = 0.0

    def problem(self) -> str | None:
        """Why Ray would refuse these figures, naming the flag, or None."""
        if isinstance(self.cpus, bool) or not isinstance(self.cpus, int) or self.cpus < 1:
            return f"--client-cpus={self.cpus} is not allowed: expected a whole number >= 1"
        if not 0 <= self.gpus < math.inf or (self.gpus > 1 and self.gpus != int(self.gpus)):
            return (
                f"--client-gpus={self.gpus} is not allowed: expected a share of one GPU "
                "(0 < g <= 1, e.g. 0.1 for ten client actors per GPU), a whole number of "
                "GPUs, or 0 (CPU only)"
            )
        return None

    def federation_config(self, supernodes: int) -> str:
        """The ``--federation-config`` of ``flwr run`` for ``supernodes`` clients."""
        text = f"num-supernodes={supernodes} client-resources-num-cpus={self.cpus}"
        if not self.gpus:
            return text
        return text + f" client-resources-num-gpus={flower_gpu_share(self.gpus)!r}"


def flower_gpu_share(share: float) -> float:
    """``share`` as Flower must be told it for ``int(1 / share)`` actors to share a GPU.

    Flower keeps ``client-resources-num-gpus`` in a 32-bit float (``SimulationConfig``),
    and 0.1 becomes 0.10000000149..., so its actor pool (``int(GPUs / share)``) held 9
    actors, not 10, on one GPU; 0.2 gave 4. The largest 32-bit float not above ``share``
    keeps the count; Ray reserves it to 1e-4, so the actors still fit."""
    narrow = np.float32(share)
    if float(narrow) > share:
        narrow = np.nextafter(narrow, np.float32(0))
    return float(narrow)


#: One CPU per client actor, no GPU: the runner's default (``flwr run``'s own is two CPUs).
ONE_CPU = ClientResources()


def gpu_problem(resources: ClientResources, env: dict[str, str] | os._Environ) -> str | None:
    """Why actors asking for a GPU would wait for ever here: Ray would queue them on a
    machine without one. A cluster named by ``RAY_ADDRESS`` has GPUs elsewhere: trusted."""
    if not resources.gpus or env.get("RAY_ADDRESS"):
        return None
    import torch

    present = torch.cuda.device_count()
    if present == 0:
        return (
            f"--client-gpus={resources.gpus:g} asks for a GPU for each client, but torch "
            f"{torch.__version__} sees no CUDA device on this machine (and RAY_ADDRESS names "
            "no Ray cluster): leave --client-gpus out to train on the CPUs"
        )
    if resources.gpus > present:
        return (
            f"--client-gpus={resources.gpus:g} asks for more GPUs for each client than this "
            f"machine has ({present}): no client could start"
        )
    return None


def add_resource_arguments(parser: argparse.ArgumentParser) -> None:
    """``--client-cpus`` and ``--client-gpus``, as the runner and the replay take them."""
    parser.add_argument("--client-cpus", type=int, default=1, metavar="N",
                        help="CPUs Ray reserves for each client actor (default 1)")  # fmt: skip
    parser.add_argument("--client-gpus", type=float, default=0.0, metavar="G",
                        help="share of a GPU for each client actor, e.g. 0.1 for ten actors "
                        "per GPU, each training on CUDA (default 0: CPUs only)")  # fmt: skip


def resources_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> ClientResources:
    """The client resources the flags ask for; a parser error (exit 2) before any work
    where Ray would refuse them or wait for ever."""
    resources = ClientResources(args.client_cpus, args.client_gpus)
    if problem := resources.problem() or gpu_problem(resources, os.environ):
        parser.error(problem)
    return resources


#: The SuperLink's database in its ``FLWR_HOME`` (SQLite, with its -wal/-shm/-journal).
DATABASE = "state.db"
SQLITE_SIDES = ("-wal", "-shm", "-journal")


def forget_earlier_runs(database: Path) -> list[Path]:
    """Delete an earlier SuperLink's database. A run still pending there when that
    SuperLink was stopped (``fedreg-experiment`` stopped by SIGTERM just after it
    submitted a run) is started by the next SuperLink on the same database: a second copy
    of the run the runner goes on to resume, each at half speed, the copy writing a run
    folder of its own. Our runs are resumed by the app from their checkpoints, never by
    the SuperLink, so nothing in its database is needed once it has stopped. Returns the
    files deleted."""
    removed = []
    for path in (database, *(database.with_name(database.name + s) for s in SQLITE_SIDES)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    return removed


def processes_naming(path: Path) -> list[int]:
    """PIDs (not this one) whose command line names ``path``: a SuperLink on a database in
    it, a run of an app staged in it."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if str(path) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
    return [pid for pid in found if _alive(pid)]


def wait_until_unused(database: Path, timeout: float = 60.0) -> None:
    """Wait for an earlier SuperLink on ``database`` to end (a runner killed a moment ago:
    its watchdog is stopping it); raise naming it if it does not, before its database is
    deleted under it."""
    deadline = time.monotonic() + timeout
    while (left := processes_naming(database)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        raise FolderInUseError(
            f"processes {left[:5]} still use {database} (the SuperLink of an earlier "
            "fedreg-experiment on this --out?): stop them by their PIDs, then run the same "
            "command"
        )


class LocalSuperLink:
    """A simulation SuperLink on loopback for the duration of a ``with`` block; ``resources``
    are each client actor's unless a call names its own CPUs."""

    def __init__(
        self,
        home: Path,
        app: Path = PROJECT,
        extra_env: dict[str, str] | None = None,
        resources: ClientResources = ONE_CPU,
    ) -> None:
        # absolute: ``flwr run`` is given the staged app's path and runs inside it, so a
        # relative one (a runner's ``--out experiments/x``) would name a folder below it
        self.home = home.resolve()
        self.resources = resources
        self.source = app  # ``flwr run`` gets a staged copy of it (see :func:`stage_app`)
        self.app = app
        self.http_port, self.control_port = free_port(), free_port()
        self.env = {
            **os.environ,
            **QUIET_OFFLINE_ENV,
            **(extra_env or {}),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "FLWR_HOME": str(self.home),
            # `flwr run` finds its ":local:" SuperLink on these ports: ours.
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(self.http_port),
            "FLWR_LOCAL_CONTROL_API_PORT": str(self.control_port),
        }
        self.process: subprocess.Popen | None = None
        self.watchdog: subprocess.Popen | None = None

    def __enter__(self) -> LocalSuperLink:
        self.home.mkdir(parents=True, exist_ok=True)
        self.app = stage_app(self.source, self.home / "app")
        wait_until_unused(self.home / DATABASE)  # a killed runner's SuperLink, being stopped
        forget_earlier_runs(self.home / DATABASE)
        self._log = (self.home / "superlink.log").open("w")
        self.process = subprocess.Popen(
            self.superlink_command(),
            env=self.env,
            cwd=self.home,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.watchdog = start_watchdog(self.process.pid)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def superlink_command(self, isolation: str = "subprocess") -> list[str]:
        """``flower-superlink`` on our ports and database; with ``subprocess`` isolation
        it starts the SuperExec that launches each submitted run."""
        return [
            str(BIN / "flower-superlink"), "--insecure", "--simulation",
            "--isolation", isolation, "--disable-runtime-dependency-installation",
            "--control-api-address", f"127.0.0.1:{self.control_port}",
            "--host", "127.0.0.1", "--port", str(self.http_port),
            "--database", str(self.home / DATABASE),
        ]  # fmt: skip

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _wait_healthy(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"flower-superlink exited with {self.process.returncode}; "
                    f"see {self.home / 'superlink.log'}"
                )
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/health", timeout=1)
                return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError("flower-superlink did not become healthy in time")

    def stop(self) -> None:
        """SIGTERM the SuperLink's process group, then SIGKILL what is left. Its watchdog
        goes first: once the SuperLink is reaped its PID may be another process's."""
        if self.watchdog is not None:
            self.watchdog.kill()
            self.watchdog.wait()
            self.watchdog = None
        stop_process(self.process)
        if self.process is not None:
            self._log.close()
        self.process = None

    def command(
        self, run_config: str, supernodes: int, cpus_per_client: int | None = None
    ) -> list[str]:
        """``flwr run <app> --stream`` as a user types it. ``run_config`` is
        ``"key=value ..."`` or the path of a TOML file."""
        resources = self.resources
        if cpus_per_client is not None:
            resources = ClientResources(cpus_per_client, resources.gpus)
        return [
            str(BIN / "flwr"), "run", str(self.app), "--stream",
            "--run-config", run_config,
            "--federation-config", resources.federation_config(supernodes),
        ]  # fmt: skip

    def run(
        self,
        run_config: str,
        supernodes: int,
        cpus_per_client: int | None = None,
        timeout: float = 86400,
    ) -> str:
        """Run to the end and return the streamed log. ``flwr run --stream`` exits 0 even
        when the run failed: read the results."""
        result = subprocess.run(
            self.command(run_config, supernodes, cpus_per_client),
            cwd=self.app, env=self.env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        return result.stdout + result.stderr

    def run_polling(
        self,
        run_config: str,
        supernodes: int,
        log_path: Path,
        poll_seconds: float = 5.0,
        cpus_per_client: int | None = None,
    ) -> Iterator[None]:
        """Run with the log streamed to ``log_path``, yielding every ``poll_seconds``
        while the run goes on (for progress reports)."""
        with log_path.open("w") as log:
            process = subprocess.Popen(
                self.command(run_config, supernodes, cpus_per_client),
                cwd=self.app, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                while process.poll() is None:
                    yield
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(timeout=poll_seconds)
                yield
            finally:
                if process.poll() is None:
                    process.terminate()
                    process.wait(timeout=30)


def toml_value(value: Any) -> str:
    """A run-config or node-config value as TOML: booleans lowercase, numbers as they are,
    everything else a quoted string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string


def config_text(config: dict[str, Any]) -> str:
    """``--run-config`` / ``--node-config`` text: ``algo="fedreg" num-server-rounds=3``."""
    return " ".join(f"{key}={toml_value(value)}" for key, value in config.items())
