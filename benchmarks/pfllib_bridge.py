"""What the benchmarks that run PFLlib beside this project share.

This project's partition written in PFLlib's layout, our initial weights carried into
PFLlib's model, the run's seeded client draw, the arguments PFLlib's ``main.py`` would
build, and a worker process in PFLlib's own interpreter. The peer gets its data in a
temporary folder: nothing is installed and nothing in the PFLlib clone is changed.

The worker side (:func:`load_weights`, :func:`pfllib_namespace`, :func:`use_pfllib`)
needs only numpy and torch: a worker runs in PFLlib's environment, which may lack this
project's packages.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

#: Seconds a worker (one framework's whole run) may take.
WORKER_TIMEOUT = 3600


# ------------------------------------------------------------------ figures
def add_work_arguments(
    parser: argparse.ArgumentParser, *, rounds: int, fraction: float, lr: float
) -> None:
    """The arguments both comparisons share, with each one's defaults for the work: our
    data and a PFLlib clone, the rounds, clients, sampling, batch, learning rate and
    partition, and those a worker process is started with."""
    parser.add_argument("--dataset-path", help="our offline copy (hub layout)")
    parser.add_argument("--pfllib", default="", help="a PFLlib clone (folder with system/)")
    parser.add_argument("--pfllib-python", default=sys.executable,
                        help="interpreter for PFLlib (needs torch, h5py, scikit-learn, "
                             "matplotlib); default: this one")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--fraction", type=float, default=fraction)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--data-fraction", type=float, default=1.0)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def steady(values: list[float]) -> list[float]:
    """Rounds 2..N (the first starts things up)."""
    return values[1:] or values


# ------------------------------------------------------------------ this project's side
def shared_config(
    args: argparse.Namespace, algo: str, seed: int, results_dir: Path
) -> dict[str, Any]:
    """Our run config for the work both frameworks do: PFLlib's FedAvgCNN, the head at its
    ``model.fc`` (one Linear layer), plain SGD, one local epoch, every round evaluated on
    every client."""
    return {
        "algo": algo,
        "model": "fedavgcnn",
        "head-depth": 1,
        "dataset-path": str(Path(args.dataset_path).resolve()),
        "data-fraction": args.data_fraction,
        "alpha": args.alpha,
        "seed": seed,
        "num-server-rounds": args.rounds,
        "local-epochs": 1,
        "batch-size": args.batch_size,
        "lr": args.lr,
        "momentum": 0.0,
        "fraction-train": args.fraction,
        "eval-every": 1,
        "global-eval": "clients",
        "results-dir": str(results_dir),
    }


def write_pfllib_dataset(clients: Iterable[Any], root: Path, name: str) -> None:
    """PFLlib's layout under ``root``: ``dataset/<name>/{train,test}/<i>.npz`` holding
    ``data={'x': float32, 'y': int64}``, and an empty ``system/`` beside it (PFLlib reads
    ``../dataset`` from its working directory). Its own generators store the images
    normalised by (x - 0.5) / 0.5, as ours are."""
    import numpy as np

    from fedreg_app.core.data import normalise

    for split in ("train", "test"):
        (root / "dataset" / name / split).mkdir(parents=True)
    (root / "system").mkdir()
    for client in clients:
        for split in ("train", "test"):
            part = getattr(client, split)
            x, y = normalise(part.x).numpy(), part.y.numpy()
            path = root / "dataset" / name / split / f"{client.partition_id}.npz"
            with path.open("wb") as handle:  # PFLlib's format is a pickled dict
                np.savez_compressed(handle, data={"x": x, "y": y})


def save_weights(path: Path, parameters: Iterable[Any]) -> None:
    """Parameters in order as ``p0, p1, ...``: PFLlib's models take them in the same order."""
    import numpy as np

    arrays = [p.detach().cpu().numpy().copy() for p in parameters]
    np.savez(path, **{f"p{i}": a for i, a in enumerate(arrays)})


def client_schedule(seed: int, clients: int, fraction: float, draws: int) -> list[list[int]]:
    """The clients our strategy samples in each of ``draws`` rounds
    (``strategies.base.sample_partitions`` with every node connected)."""
    from fedreg_app.core.seeds import rng
    from strategies.base import sample_size

    draw = rng(seed, "sampling")
    k = sample_size(clients, fraction)
    return [
        sorted(int(p) for p in draw.choice(list(range(clients)), size=k, replace=False))
        for _ in range(draws)
    ]


def git_commit(path: str) -> str:
    """The short commit of a clone, for the record of what ran."""
    if not path:
        return "none"
    found = subprocess.run(
        ["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return found.stdout.strip() or "unknown (not a git clone)"


def run_worker(
    script: Path, name: str, python: str, spec_path: Path, cwd: Path, extra: Sequence[str] = (),
    launcher: Sequence[str] = (),
) -> dict[str, Any]:  # fmt: skip
    """Run ``script --worker name`` in the peer's interpreter (through ``launcher``'s
    module arguments, e.g. ``-m torch.distributed.run ...``, where given); its JSON
    result, or ``{"error": <the last lines of its output>}``."""
    out = spec_path.parent / f"{name}-result.json"
    out.unlink(missing_ok=True)
    command = [python, *launcher, str(script.resolve()), "--worker", name,
               "--spec", str(spec_path), "--out", str(out), *extra]  # fmt: skip
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        result = subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, timeout=WORKER_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {WORKER_TIMEOUT} s"}
    if result.returncode != 0 or not out.exists():
        tail = (result.stdout + result.stderr).strip().splitlines()[-15:]
        return {"error": "\n".join(tail) or f"exit {result.returncode}"}
    return json.loads(out.read_text())


# ------------------------------------------------------------------ PFLlib's side (worker)
def load_weights(model: Any, path: Path) -> None:
    """Copy saved parameters in, one by one (same order and shapes)."""
    import numpy as np
    import torch

    saved = np.load(path)
    parameters = list(model.parameters())
    assert len(parameters) == len(saved.files), (len(parameters), saved.files)
    with torch.no_grad():
        for i, parameter in enumerate(parameters):
            parameter.copy_(torch.from_numpy(saved[f"p{i}"]))


def use_pfllib(spec: dict[str, Any]) -> None:
    """Make PFLlib's ``system/`` importable and fix this process's threads."""
    import torch

    sys.path.insert(0, str(Path(spec["pfllib"]) / "system"))
    torch.set_num_threads(spec["threads"])


def fedavgcnn(spec: dict[str, Any]) -> Any:
    """PFLlib's FedAvgCNN for the dataset's shape (its ``main.py``: ``dim`` from the
    input side)."""
    from flcore.trainmodel.models import FedAvgCNN

    side = ((spec["height"] - 4) // 2 - 4) // 2
    return FedAvgCNN(spec["channels"], spec["num_classes"], dim=64 * side * side)


def pfllib_namespace(
    spec: dict[str, Any], algorithm: str, model: Any, goal: str, **extra: Any
) -> argparse.Namespace:
    """PFLlib's ``main.py`` defaults with the shared settings, plus ``extra`` (the
    algorithm's own arguments)."""
    return argparse.Namespace(
        device="cpu", dataset=spec["dataset"], num_classes=spec["num_classes"], model=model,
        batch_size=spec["batch_size"], local_learning_rate=spec["lr"],
        learning_rate_decay=False, learning_rate_decay_gamma=0.99,
        global_rounds=spec["rounds"], local_epochs=1, algorithm=algorithm,
        join_ratio=spec["per_round"] / spec["clients"], random_join_ratio=False,
        num_clients=spec["clients"], few_shot=0, time_select=False, goal=goal,
        time_threthold=10000, save_folder_name="items", top_cnt=100, auto_break=False,
        eval_gap=1, client_drop_rate=0.0, train_slow_rate=0.0, send_slow_rate=0.0,
        dlg_eval=False, dlg_gap=100, batch_num_per_client=2, num_new_clients=0,
        fine_tuning_epoch_new=0, prev=0, times=1, **extra,
    )  # fmt: skip


def time_evaluation(server_class: type, timings: dict[str, list[float]]) -> None:
    """Record the seconds of each call of the server's two evaluation passes (test
    accuracy; training loss, which FedCP's ``evaluate`` skips)."""

    def timed(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *a: Any, **kw: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(self, *a, **kw)
            finally:
                timings[name].append(time.perf_counter() - start)

        return wrapper

    for name in timings:
        setattr(server_class, name, timed(name, getattr(server_class, name)))


def use_our_draw(server: Any, spec: dict[str, Any]) -> None:
    """Our seeded client draw in place of ``np.random.choice``."""
    schedule = iter(spec["schedule"])
    server.select_clients = lambda: [server.clients[i] for i in next(schedule)]
    if [c.train_samples for c in server.clients] != spec["train_samples"]:
        raise RuntimeError("PFLlib read other training sets than we wrote")
