"""What the documented secure deployment (TLS + SuperNode authentication, Flower 1.42)
protects and what it does not, observed on loopback. ``docs/deployment.md`` ("What the
secure setup protects, and what it does not") quotes the exit codes and messages checked
here; change both together.

Every process is started here or by ``LocalDeployment``, stopped by its PID, and the
tests assert that none of them, nor anything they spawned, is left running. Opt-in::

    python -m pytest --deployment -m deployment tests/test_deployment_security.py
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedreg_tools.deployment import LocalDeployment
from fedreg_tools.launcher import (
    BIN,
    QUIET_OFFLINE_ENV,
    LocalSuperLink,
    descendants,
    free_port,
    stop_process,
)
from tests.test_deployment import wait_for

pytestmark = [
    pytest.mark.deployment,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl"),
]
MAKE_CERTS = Path(__file__).resolve().parents[1] / "deploy" / "make_certs.sh"
CONNECTION = "target"
REFUSED = "The SuperNode could not establish a connection to the SuperLink."

# A Flower app that only leaves traces: the ServerApp writes its PID (and its parent's),
# asks `nodes` nodes one question, and writes the replies; each ClientApp writes its PID.
PROBE_FILES = {
    "pyproject.toml": """
        [build-system]
        requires = ["hatchling"]
        build-backend = "hatchling.build"

        [project]
        name = "probe-app"
        version = "1.0.0"
        dependencies = []

        [tool.hatch.build.targets.wheel]
        packages = ["probe"]

        [tool.flwr.app]
        publisher = "probe"

        [tool.flwr.app.components]
        serverapp = "probe.server:app"
        clientapp = "probe.client:app"

        [tool.flwr.app.config]
        marker-dir = ""
        nodes = 0
        hold-seconds = 0.0
        """,
    "probe/__init__.py": "",
    "probe/server.py": """
        import json
        import os
        import time
        from pathlib import Path

        from flwr.app import ConfigRecord, Context, Message, RecordDict
        from flwr.serverapp import Grid, ServerApp

        app = ServerApp()


        @app.main()
        def main(grid: Grid, context: Context) -> None:
            out = Path(str(context.run_config["marker-dir"]))
            (out / "serverapp").write_text(f"{os.getpid()} {os.getppid()}")
            time.sleep(float(context.run_config["hold-seconds"]))
            wanted, deadline = int(context.run_config["nodes"]), time.monotonic() + 120
            nodes = list(grid.get_node_ids())
            while len(nodes) < wanted and time.monotonic() < deadline:
                time.sleep(1)
                nodes = list(grid.get_node_ids())
            question = RecordDict({"question": ConfigRecord({"n": 1})})
            messages = [
                Message(question, dst_node_id=n, message_type="query") for n in nodes[:wanted]
            ]
            replies = {}
            for reply in grid.send_and_receive(messages, timeout=180):
                answer = reply.error.reason if reply.has_error() else "answered"
                replies[str(reply.metadata.src_node_id)] = answer
            (out / "replies.json").write_text(json.dumps(replies))
        """,
    "probe/client.py": """
        import os
        from pathlib import Path

        from flwr.app import ConfigRecord, Context, Message, RecordDict
        from flwr.clientapp import ClientApp

        app = ClientApp()


        @app.query()
        def query(msg: Message, context: Context) -> Message:
            out = Path(str(context.run_config["marker-dir"]))
            (out / f"clientapp-{context.node_id}").write_text(str(os.getpid()))
            return Message(RecordDict({"answer": ConfigRecord({"ok": 1})}), reply_to=msg)
        """,
}


# ------------------------------------------------------------------------ helpers
def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped counts as stopped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def tree(pids: list[int]) -> list[int]:
    return [q for p in pids for q in (p, *descendants(p))]


def assert_all_stopped(pids: list[int], timeout: float = 30.0) -> None:
    """Everything these processes were (or had spawned) ends within ``timeout``."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, "still running: " + "; ".join(f"{p} {command_line(p)}" for p in left)


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
    except OSError:
        return "(gone)"


def base_env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        **QUIET_OFFLINE_ENV,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "COLUMNS": "200",
        **extra,
    }


def stranger(root: Path, port: int, ca: Path | None, insecure: bool = False) -> dict[str, str]:
    """The ``flwr`` CLI of someone who can reach the port and holds nothing but the CA
    certificate (which every device gets): a fresh FLWR_HOME, no login."""
    home = root / "flwr_home"
    home.mkdir(parents=True, exist_ok=True)
    security = "insecure = true" if insecure else f'root-certificates = "{ca}"'
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
        f'address = "127.0.0.1:{port}"\n{security}\n'
    )
    return base_env(FLWR_HOME=str(home))


def flwr(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "flwr"), *args], env=env, cwd=env["FLWR_HOME"], capture_output=True,
        text=True, timeout=timeout,
    )  # fmt: skip


def output(result: subprocess.CompletedProcess) -> str:
    return " ".join((result.stdout + result.stderr).split())  # rich wraps long lines


def run_until_exit(command: list[str], log: Path, timeout: float = 90) -> tuple[int, str]:
    """Start a process in its own session, wait for it to exit by itself, stop what is
    left by PID; return its exit status and its log."""
    with log.open("w") as sink:
        process = subprocess.Popen(
            command, env=base_env(), cwd=log.parent, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    spawned: list[int] = []
    try:
        deadline = time.monotonic() + timeout
        while process.poll() is None and time.monotonic() < deadline:
            spawned = sorted(set(spawned) | set(descendants(process.pid)))
            time.sleep(0.2)
        returncode = process.poll()
    finally:
        spawned = sorted(set(spawned) | set(descendants(process.pid)))
        stop_process(process)
        assert_all_stopped([process.pid, *spawned])
    assert returncode is not None, f"{command[0]} still running after {timeout}s"
    return returncode, log.read_text()


def supernode(superlink_port: int, *security: str) -> list[str]:
    return [
        str(BIN / "flower-supernode"), *security, "--superlink", f"127.0.0.1:{superlink_port}",
        "--port", str(free_port()), "--node-config", "name='probe'",
    ]  # fmt: skip


def listening_ports(pid: int) -> set[int]:
    """TCP ports the process listens on (from /proc: its socket inodes in LISTEN state)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def supernodes_listed(env: dict[str, str], field: str = "status") -> dict[int, str]:
    """``flwr supernode ls --format json``: node id -> ``field`` of that node."""
    result = flwr(env, "supernode", "ls", CONNECTION, "--format", "json")
    assert result.returncode == 0, output(result)
    listed = json.loads(result.stdout)
    return {int(node["node-id"]): node[field] for node in listed["nodes"]}


def register(env: dict[str, str], public_key: Path) -> int:
    result = flwr(env, "supernode", "register", str(public_key), CONNECTION, "--format", "json")
    assert result.returncode == 0, output(result)
    return int(json.loads(result.stdout)["node-id"])


# ----------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("certificates")
    subprocess.run(
        ["bash", str(MAKE_CERTS), "--supernode-keys", "5", str(folder)],
        check=True, capture_output=True,
    )  # fmt: skip
    other = folder / "other-ca"  # a CA that did not sign the SuperLink's certificate
    subprocess.run(["bash", str(MAKE_CERTS), str(other)], check=True, capture_output=True)
    return folder


@pytest.fixture(scope="module")
def probe_app(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("probe-app")
    for name, text in PROBE_FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(textwrap.dedent(text).lstrip())
    return folder


@pytest.fixture(scope="module")
def secure(certificates: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """The documented setup: TLS and ``--enable-supernode-auth``, no SuperNode yet."""
    home = tmp_path_factory.mktemp("secure")
    deployment = LocalDeployment(home, [], tls=certificates, supernode_auth=True)
    with deployment:
        yield deployment
        started = tree(deployment.pids())
    assert_all_stopped(started)


def key(certificates: Path, index: int) -> Path:
    return certificates / "supernode-keys" / f"supernode-{index}"


# -------------------------------------------------------------------------- tests
def test_one_port_and_it_speaks_only_tls(secure: LocalDeployment, certificates: Path) -> None:
    # Fleet, Control and Runtime APIs share the one --port; no gRPC port 9092/9093 opens
    assert listening_ports(secure.superlink.pid) == {secure.port}
    url = f"127.0.0.1:{secure.port}/health"
    trusted = ssl.create_default_context(cafile=str(certificates / "ca.crt"))
    assert urllib.request.urlopen(f"https://{url}", timeout=10, context=trusted).status == 200
    with pytest.raises(ConnectionResetError):  # plain HTTP: closed without an answer
        urllib.request.urlopen(f"http://{url}", timeout=10)
    with pytest.raises(urllib.error.URLError) as untrusted:  # the system's CAs only
        urllib.request.urlopen(f"https://{url}", timeout=10)
    assert isinstance(untrusted.value.reason, ssl.SSLCertVerificationError)


def test_the_cli_needs_tls_and_the_right_ca(
    secure: LocalDeployment, certificates: Path, tmp_path: Path
) -> None:
    for name, env in {
        "insecure": stranger(tmp_path / "a", secure.port, None, insecure=True),
        "other CA": stranger(tmp_path / "b", secure.port, certificates / "other-ca" / "ca.crt"),
    }.items():
        result = flwr(env, "ls", CONNECTION)
        assert result.returncode == 1, name
        assert "Connection to the SuperLink is unavailable" in output(result), name


def test_a_supernode_without_a_key_is_refused(secure: LocalDeployment, tmp_path: Path) -> None:
    command = supernode(secure.port, "--root-certificates", str(secure.tls / "ca.crt"))
    returncode, log = run_until_exit(command, tmp_path / "supernode.log")
    assert returncode == 1  # Flower logs its own code; the process exits with 1
    assert "Exit Code: 305" in log and REFUSED in log
    assert (
        "[code: 2001] SuperNode authentication is enabled. "
        "All SuperNodes must be registered via the CLI." in log
    )


def test_an_unregistered_key_is_refused(
    secure: LocalDeployment, certificates: Path, tmp_path: Path
) -> None:
    command = supernode(
        secure.port, "--root-certificates", str(certificates / "ca.crt"),
        "--auth-supernode-private-key", str(key(certificates, 2)),
    )  # fmt: skip
    returncode, log = run_until_exit(command, tmp_path / "supernode.log")
    assert returncode == 1
    assert "Exit Code: 305" in log and "[code: 2004] Failed to activate SuperNode." in log


def test_an_insecure_supernode_cannot_connect(secure: LocalDeployment, tmp_path: Path) -> None:
    # without --max-retries it retries for ever (seen: still retrying after 40 s)
    command = supernode(secure.port, "--insecure", "--max-retries", "2")
    returncode, log = run_until_exit(command, tmp_path / "supernode.log")
    assert returncode == 1
    assert "Exit Code: 305" in log
    assert "Server disconnected without sending a response." in log


def test_a_supernode_trusting_another_ca_is_refused(
    secure: LocalDeployment, certificates: Path, tmp_path: Path
) -> None:
    other = certificates / "other-ca" / "ca.crt"
    returncode, log = run_until_exit(
        supernode(secure.port, "--root-certificates", str(other)), tmp_path / "supernode.log"
    )
    assert returncode == 1
    assert "Exit Code: 305" in log and "CERTIFICATE_VERIFY_FAILED" in log


def test_anyone_reaching_the_port_registers_and_unregisters_supernodes(
    secure: LocalDeployment, certificates: Path, tmp_path: Path
) -> None:
    env = stranger(tmp_path, secure.port, certificates / "ca.crt")
    login = flwr(env, "login", CONNECTION)
    assert login.returncode == 1
    assert "Account authentication is not enabled on this SuperLink." in output(login)

    node_id = register(env, certificates / "supernode-keys" / "supernode-3.pub")
    assert supernodes_listed(env)[node_id] == "registered"
    index = secure.add_supernode(
        {"name": "device-3"},
        ["--auth-supernode-private-key", str(key(certificates, 3))],
    )
    wait_for(lambda: supernodes_listed(env).get(node_id) == "online", 60, "node online")
    assert supernodes_listed(env, "owner-name")[node_id] == "none"  # one shared account

    result = flwr(env, "supernode", "unregister", str(node_id), CONNECTION)
    assert result.returncode == 0, output(result)
    assert supernodes_listed(env)[node_id] == "unregistered"
    process = secure.supernodes[index]
    assert process.wait(timeout=120) == 0  # the device's SuperNode stops, "gracefully"
    log = (secure.home / f"supernode{index}.log").read_text()
    assert f"SuperNode ID: {node_id}" in log and "SuperNode terminated gracefully." in log
    # the device's own Runtime API (for its ClientApp processes) is plain HTTP on loopback
    assert f"Uvicorn running on http://127.0.0.1:{secure.node_ports[index]}" in log
    secure.start_supernode(index)  # the device restarts: its key is no longer known
    assert secure.supernodes[index].wait(timeout=120) == 1
    log = (secure.home / f"supernode{index}.log").read_text()
    assert "[code: 2004] Failed to activate SuperNode." in log


def test_anyone_reaching_the_port_runs_code_on_the_server_and_the_supernodes(
    secure: LocalDeployment, certificates: Path, probe_app: Path, tmp_path: Path
) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    env = stranger(tmp_path, secure.port, certificates / "ca.crt")
    plain = register(env, certificates / "supernode-keys" / "supernode-0.pub")
    guarded = register(env, certificates / "supernode-keys" / "supernode-1.pub")
    publisher = ed25519.Ed25519PrivateKey.generate().public_key()
    openssh = publisher.public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    trusted = tmp_path / "trusted-entities.yaml"
    trusted.write_text(f"fpk_probe: '{openssh.decode()}'\n")
    secure.add_supernode(
        {"name": "plain"}, ["--auth-supernode-private-key", str(key(certificates, 0))]
    )
    secure.add_supernode(
        {"name": "guarded"},
        ["--auth-supernode-private-key", str(key(certificates, 1)),
         "--trusted-entities", str(trusted)],
    )  # fmt: skip
    marks = tmp_path / "marks"
    marks.mkdir()

    result = flwr(
        env, "run", str(probe_app), CONNECTION, "--stream",
        "--run-config", f"marker-dir='{marks}' nodes=2", timeout=600,
    )  # fmt: skip
    assert (marks / "replies.json").exists(), output(result)[-3000:]
    replies = {int(k): v for k, v in json.loads((marks / "replies.json").read_text()).items()}
    # the stranger's ServerApp ran on the server, its ClientApp on the node without
    # --trusted-entities
    assert (marks / "serverapp").exists() and (marks / f"clientapp-{plain}").exists()
    assert replies[plain] == "answered"
    # a SuperNode with --trusted-entities refuses an app that does not come signed from
    # the Flower Hub: the open-source SuperLink does not mark apps as verified
    assert not (marks / f"clientapp-{guarded}").exists()
    assert replies[guarded] == "The FAB could not be verified."
    guarded_log = (secure.home / f"supernode{len(secure.nodes) - 1}.log").read_text()
    assert (
        "The FAB could not be verified. App verification is not supported by the "
        "connected SuperLink." in guarded_log
    )
    runs = flwr(env, "ls", CONNECTION, "--format", "json")
    assert runs.returncode == 0, output(runs)
    run_ids = [run["run-id"] for run in json.loads(runs.stdout)["runs"]]
    assert run_ids
    shown = flwr(env, "log", run_ids[0], CONNECTION, "--show")
    assert shown.returncode == 0, output(shown)


def test_tls_alone_admits_any_supernode_and_any_superexec(
    certificates: Path, probe_app: Path, tmp_path: Path
) -> None:
    """Without --enable-supernode-auth a SuperNode needs only the CA certificate, and the
    Runtime API on the same port hands a run's ServerApp to any SuperExec that asks."""
    with LocalDeployment(tmp_path / "tls", [], tls=certificates) as d:
        env = stranger(tmp_path / "cli", d.port, certificates / "ca.crt")
        d.add_supernode({"name": "anyone"})
        wait_for(lambda: "online" in supernodes_listed(env).values(), 60, "a node online")
        assert (
            "SuperNode authentication is disabled. The SuperLink will accept connections "
            "from any SuperNode." in (d.home / "superlink.log").read_text()
        )

        command = [
            str(BIN / "flower-superexec"), "--root-certificates", str(certificates / "ca.crt"),
            "--runtime-api-address", f"127.0.0.1:{d.port}",
        ]  # fmt: skip
        log = (tmp_path / "superexec.log").open("w")
        superexec = subprocess.Popen(
            command, env=base_env(), cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        # The SuperLink's own SuperExec is paused (SIGSTOP) while the run is submitted, so
        # that the stranger's asks first; it is resumed (SIGCONT) right after.
        [own] = [p for p in descendants(d.superlink.pid) if "flower-superexec" in command_line(p)]
        marks = tmp_path / "marks"
        marks.mkdir()
        os.kill(own, signal.SIGSTOP)
        try:
            result = flwr(env, "run", str(probe_app), CONNECTION, "--run-config",
                          f"marker-dir='{marks}' nodes=0")  # fmt: skip
            assert result.returncode == 0, output(result)
            wait_for(lambda: (marks / "replies.json").exists(), 120, "the ServerApp")
        finally:
            os.kill(own, signal.SIGCONT)
            spawned = tree([superexec.pid])
            stop_process(superexec)
            log.close()
        _, parent = (int(x) for x in (marks / "serverapp").read_text().split())
        assert parent == superexec.pid  # the ServerApp ran under the stranger's SuperExec
        started = tree(d.pids())
    assert_all_stopped([*started, *spawned])


def test_what_the_superlink_refuses_to_start_with(certificates: Path, tmp_path: Path) -> None:
    tls = [
        "--ssl-ca-certfile", str(certificates / "ca.crt"),
        "--ssl-certfile", str(certificates / "server.pem"),
        "--ssl-keyfile", str(certificates / "server.key"),
    ]  # fmt: skip
    link = [str(BIN / "flower-superlink"), "--host", "127.0.0.1", "--port", str(free_port())]
    env = base_env(FLWR_OIDC_ENABLED="1")
    oidc = subprocess.run(
        [*link, *tls], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert oidc.returncode == 1  # account login (OIDC) is not in the open-source SuperLink
    assert "OIDC account authentication is unavailable in this Flower distribution." in (
        oidc.stdout + oidc.stderr
    )
    returncode, log = run_until_exit(
        [*link, "--insecure", "--enable-supernode-auth"], tmp_path / "superlink.log"
    )
    assert returncode == 1 and "Exit Code: 104" in log
    assert "The `--enable-supernode-auth` flag requires encrypted TLS" in log


@pytest.mark.skipif(shutil.which("lsof") is None, reason="needs lsof")
def test_the_guide_stops_exactly_the_managed_local_superlink(
    probe_app: Path, tmp_path: Path
) -> None:
    """Getting started: ``flwr run`` leaves a detached simulation SuperLink running; this
    finds it by its port and stops it with what it spawned, mid-run. Another SuperLink on
    the machine (another user's, on other ports) keeps running."""
    port = free_port()
    env = base_env(
        FLWR_HOME=str(tmp_path / "flwr_home"),
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(port),
        FLWR_LOCAL_CONTROL_API_PORT=str(free_port()),
    )
    marks = tmp_path / "marks"
    marks.mkdir()
    result = subprocess.run(
        [str(BIN / "flwr"), "run", str(probe_app), "--run-config",
         f"marker-dir='{marks}' nodes=2 hold-seconds=600.0"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, output(result)
    pid = int(subprocess.run(["lsof", "-t", f"-iTCP:{port}", "-sTCP:LISTEN"],
                             capture_output=True, text=True).stdout)  # fmt: skip
    started = [pid]
    try:
        wait_for(lambda: (marks / "serverapp").exists(), 180, "the simulation to start")
        # SuperLink, SuperExec, the simulation and Ray's processes
        wait_for(lambda: len(tree([pid])) > 5, 120, "Ray to start")
        started = tree([pid])
        with LocalSuperLink(tmp_path / "another_users_home") as other:
            assert other.process is not None and other.process.pid not in started
            subprocess.run(["bash", "-c", guide_stop_commands()], env=env, check=True,
                           timeout=120)  # fmt: skip
            assert_all_stopped(started, timeout=15)
            assert other.process.poll() is None  # the other SuperLink was left alone
    finally:
        for leftover in [p for p in started if alive(p)]:  # only if the above failed
            os.kill(leftover, 9)


def guide_stop_commands() -> str:
    """The bash block of the getting-started guide that stops the managed local
    SuperLink, as written there."""
    guide = (Path(__file__).resolve().parents[1] / "docs" / "getting-started.md").read_text()
    blocks = [b.split("```", 1)[0] for b in guide.split("```bash")[1:]]
    [block] = [b for b in blocks if "lsof -t" in b]
    return textwrap.dedent(block)
