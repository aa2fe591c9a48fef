"""What a run's numbers depend on beyond its config: the software and the CPU kind.

The same seeded run gives bit-identical figures only where the same kernels run: a
replay of a record made on another CPU (AVX2 against AVX-512 here) or with another torch
build trains with the same operations in another order of float additions, and its
accuracies drift apart within the first round. Recording this with every run lets
``fedreg-replay`` say which kind of difference to expect.
"""

from __future__ import annotations

import platform
from importlib import metadata
from pathlib import Path

import torch

#: Keys whose values decide whether a replay can be bit-identical.
NUMERIC_KEYS = ("torch", "cpu_capability", "cpu", "machine", "cuda_device")
CPUINFO = Path("/proc/cpuinfo")


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
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "flwr": _version("flwr"),
        "numpy": _version("numpy"),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
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
    if not differing:
        return None
    return (
        f"recorded in another environment ({'; '.join(differing)}): bit-identical "
        "figures are expected only on the same CPU kind and torch build"
    )
