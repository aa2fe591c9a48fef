"""How much memory per-client state takes in the simulation process (where Flower keeps
every node's ``context.state``), for FedDyn's correction, Ditto's personal model and
FedReG's private head.

Runs the real client procedure for one round on tiny in-memory data per client, keeps
each client's state as Flower would, and reports the resident-memory growth. With
``--state-dir`` each client's records are committed there and released from its state,
as the ClientApp does when the node has a state-dir. One algorithm per process: memory
freed by an earlier measurement would hide the next one.

    python benchmarks/client_state_memory.py --algo feddyn --clients 500 --dataset cifar10
    python benchmarks/client_state_memory.py --algo feddyn --clients 500 --dataset cifar10 \\
        --state-dir /tmp/state
    python benchmarks/client_state_memory.py --algo fedreg --optimizer-state fresh

``--optimizer-state fresh`` measures the state without the clients' momentum buffers.
"""

from __future__ import annotations

import argparse
import gc
import resource
import time
from pathlib import Path

import torch
from flwr.app import RecordDict

from clients.base import ClientSetup
from clients.ditto import DittoClient
from clients.fedavg import FedAvgClient
from clients.feddyn import FedDynClient
from clients.fedreg import FedReGClient
from fedreg_app.core.client_state import VersionedState
from fedreg_app.core.data import ClientData, DatasetInfo, TensorData
from fedreg_app.core.models import BASE, HEAD_G, build_model
from fedreg_app.registry import load_config

SHAPES = {"fmnist": (1, 28), "cifar10": (3, 32)}
PROCEDURES = {
    "fedavg": FedAvgClient,
    "feddyn": FedDynClient,
    "ditto": DittoClient,
    "fedreg": FedReGClient,
}


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--dataset", choices=sorted(SHAPES), default="fmnist")
    parser.add_argument("--algo", choices=sorted(PROCEDURES), default="feddyn")
    parser.add_argument("--state-dir", type=Path, help="commit and release each client's state")
    parser.add_argument(
        "--optimizer-state",
        choices=("persistent", "fresh"),
        default="persistent",
        help="keep each client's momentum buffers",
    )
    args = parser.parse_args()
    channels, size = SHAPES[args.dataset]
    info = DatasetInfo(num_classes=10, channels=channels, height=size, width=size)
    tiny = TensorData(
        x=torch.zeros(4, channels, size, size, dtype=torch.uint8), y=torch.tensor([0, 1, 2, 3])
    )
    config = load_config(
        {"algo": args.algo, "local-epochs": 1, "personal-epochs": 1, "batch-size": 4,
         "optimizer-state": args.optimizer_state}
    )  # fmt: skip
    global_arrays = build_model(info, config.head_depth, 0).group_state(BASE, HEAD_G)
    model_mb = sum(a.nbytes for a in global_arrays.values()) / 2**20
    print(f"{args.dataset}: one model copy = {model_mb:.2f} MiB")
    procedure = PROCEDURES[args.algo]
    gc.collect()
    before, started = rss_mb(), time.perf_counter()
    states = []
    for pid in range(args.clients):
        state = RecordDict()
        setup = ClientSetup(config, info, ClientData(pid, tiny, tiny), state)
        procedure(setup).train(global_arrays, 1)
        if args.state_dir:
            versions = VersionedState(args.state_dir / f"partition-{pid}")
            versions.commit(state, 1)
            versions.release(state)
        states.append(state)
    gc.collect()
    grown = rss_mb() - before
    kept = "on disk, released" if args.state_dir else "in memory"
    print(
        f"{args.algo}: {args.clients} clients' state ({kept}) = {grown:.0f} MiB resident "
        f"growth ({grown / args.clients:.2f} MiB per client; "
        f"{time.perf_counter() - started:.0f} s)"
    )
    print(f"client_state_memory: algo={args.algo} clients={args.clients} "
          f"dataset={args.dataset} state={'disk' if args.state_dir else 'memory'} "
          f"optimizer_state={args.optimizer_state} "
          f"model_mib={model_mb:.2f} growth_mib={grown:.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
