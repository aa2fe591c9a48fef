"""What a run's numbers depend on beyond its config: the software and the CPU kind.

The same seeded run gives bit-identical figures only where the same kernels run: a
replay of a record made on another CPU (AVX2 against AVX-512 here) or with another torch
build trains with the same operations in another order of float additions, and its
accuracies drift apart within the first round. Recording this with every run lets
``fedreg-replay`` say which kind of difference to expect.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

#: Keys whose values decide whether a replay can be bit-identical.
NUMERIC_KEYS = ("torch", "cpu_capability", "cpu", "machine", "cuda_device")
CPUINFO = Path("/proc/cpuinfo")
#: The packages whose code computes a run's figures (the app, its strategies, its clients).
CODE_PACKAGES = ("fedreg_app", "strategies", "clients")
#: Where those packages lie: the project's root, or the app's install folder under flwr.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=4)
def code_fingerprint(root: Path = PROJECT_ROOT) -> str:
    """A short SHA-256 of the app's Python sources (path and bytes of every ``.py`` file
    of :data:`CODE_PACKAGES`): the same in a checkout and in the app ``flwr run``
    installs from it, so a record says which code made its figures even where no git
    history travels with the app (a FAB, a device)."""
    digest = hashlib.sha256()
    for package in CODE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name (Linux), else what the platform module says."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.lower().startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe_environment() -> dict[str, str | None]:
    """This process's software versions and CPU kind, as a results file records them."""
    import torch  # here, not above: the tools that only read records stay light

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "flwr": _version("flwr"),
        "numpy": _version("numpy"),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "code": code_fingerprint(),
    }


def environment_note(recorded: object, current: dict[str, str | None]) -> str | None:
    """None when ``recorded`` matches ``current`` in every key that decides the numbers;
    else a sentence for the user naming what differs (or that nothing was recorded)."""
    if not isinstance(recorded, dict):
        return (
            "the record names no environment (made before records kept one): "
            "bit-identical figures are expected only on the CPU kind and torch build "
            "that made it"
        )
    differing = [
        f"{key} {recorded.get(key)!r} -> {current.get(key)!r}"
        for key in NUMERIC_KEYS
        if recorded.get(key) != current.get(key)
    ]
    notes = []
    if differing:
        notes.append(
            f"recorded in another environment ({'; '.join(differing)}): bit-identical "
            "figures are expected only on the same CPU kind and torch build"
        )
    if "code" in recorded and recorded["code"] != current.get("code"):
        notes.append(
            f"made by other code (code {recorded['code']!r} -> {current.get('code')!r}): "
            "figures are expected to match only where the changes since leave training "
            "and evaluation alone"
        )
    return "; ".join(notes) or None


def client_devices(rounds: list[dict[str, Any]], upto: int | None = None) -> set[str]:
    """What the clients of rounds 1..``upto`` (all by default) of a results file said they
    computed on (``cpu`` or a CUDA device's name); records made before clients said it
    give none, and a malformed ``client_hosts`` gives none (a file is not trusted)."""
    return {
        host["device"]
        for record in rounds[:upto]
        if isinstance(record.get("client_hosts"), dict)
        for host in record["client_hosts"].values()
        if isinstance(host, dict) and isinstance(host.get("device"), str)
    }


#: Ray starts its workers (a simulation's client actors) at this niceness unless told
#: otherwise; its default is 15.
RAY_WORKER_NICENESS = "RAY_worker_niceness"


def run_ray_workers_at_normal_priority() -> None:
    """Have the client actors of a simulation started in this process run at niceness 0.

    At Ray's default of 15 every wake-up of a process at 0 (the SuperLink answering
    polls, the ServerApp's process, Ray's own daemons) preempted a training client: its
    training ran 10-20% slower than the same work in a plain process
    (``benchmarks/round_limit.py --settings RAY_worker_niceness=15 -``). The simulation process
    imports the ClientApp before it starts Ray, whose processes inherit the environment,
    so the ClientApp's import sets it; a value already in the environment wins."""
    os.environ.setdefault(RAY_WORKER_NICENESS, "0")


if __name__ == "__main__":  # what a run made here would record
    print(json.dumps(describe_environment(), indent=1))
