"""Benchmark (a): samples per second inside a client's local training, against a bare
PyTorch loop training the same model on the same in-memory tensors with the same batch
size. Both run in this process, alternating, so the ratio is measured in one run on the
same (possibly busy) machine.

The client side is the real procedure (``procedure.train``: load the global arrays, train
through ``fedreg_app.training``, export the reply's arrays). The bare loop is what one
would write by hand: pre-normalised float tensors, ``randperm`` batches, SGD, cross
entropy. One torch thread by default, as a Ray client actor with one CPU gets.

    python benchmarks/client_throughput.py --dataset-path ../shared/data/fashion_mnist
    python benchmarks/client_throughput.py --algo fedreg --repeats 5      # synthetic data
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from flwr.app import RecordDict
from torch.nn import functional as F  # noqa: N812

from clients.base import ClientSetup
from fedreg_app.config import RunConfig
from fedreg_app.data import (
    ClientData,
    DatasetInfo,
    PartitionKey,
    TensorData,
    load_client_data,
    load_info,
    normalise,
)
from fedreg_app.models import BASE, HEAD_G, SplitModel, build_model
from fedreg_app.protocol import NUM_PROCESSED
from fedreg_app.registry import algorithm_names, get_algorithm, load_config


def client_data(args: argparse.Namespace, config: RunConfig) -> tuple[DatasetInfo, ClientData]:
    """A real partition of the offline copy, or synthetic FMNIST-shaped tensors."""
    if args.dataset_path:
        key = PartitionKey.from_config(config, args.clients)
        return load_info(key), load_client_data(key, args.partition)
    g = torch.Generator().manual_seed(0)
    n = args.samples
    x = torch.randint(0, 256, (n, 1, 28, 28), generator=g, dtype=torch.uint8)
    y = torch.randint(0, 10, (n,), generator=g)
    data = TensorData(x=x, y=y)
    return DatasetInfo(10, 1, 28, 28), ClientData(args.partition, data, data)


def bare_loop(model: SplitModel, x: torch.Tensor, y: torch.Tensor, config: RunConfig) -> int:
    """The hand-written loop: the whole model, float inputs prepared once."""
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    generator = torch.Generator().manual_seed(1)
    model.train()
    processed = 0
    for _ in range(config.local_epochs):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), config.batch_size):
            idx = order[start : start + config.batch_size]
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            optimizer.step()
            processed += len(idx)
    return processed


def timed(fn) -> tuple[float, int]:
    started = time.perf_counter()
    processed = fn()
    return time.perf_counter() - started, processed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=algorithm_names(), default="fedavg")
    parser.add_argument("--dataset-path", help="offline copy (else synthetic data)")
    parser.add_argument("--clients", type=int, default=20, help="partitions (real data)")
    parser.add_argument("--partition", type=int, default=0)
    parser.add_argument("--samples", type=int, default=2600, help="synthetic train size")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    run_config = {"algo": args.algo, "batch-size": args.batch_size, "local-epochs": args.epochs}
    if args.dataset_path:
        run_config["dataset-path"] = args.dataset_path
    config = load_config(run_config)
    info, data = client_data(args, config)
    global_arrays = build_model(info, config.head_depth, config.seed).group_state(BASE, HEAD_G)
    x_float, y = normalise(data.train.x.clone()), data.train.y

    procedure = get_algorithm(args.algo).client(
        ClientSetup(config, info, data, RecordDict())
    )  # one procedure across repeats: its per-process caches (rebalanced set) stay warm
    procedure.train(global_arrays, server_round=1)  # warm-up, builds caches, not timed
    client_rates, bare_rates = [], []
    for repeat in range(args.repeats):
        seconds, processed = timed(
            lambda r=repeat: int(procedure.train(global_arrays, r + 2).metrics[NUM_PROCESSED])
        )
        client_rates.append(processed / seconds)
        model = build_model(info, config.head_depth, config.seed)
        seconds, processed = timed(lambda m=model: bare_loop(m, x_float, y, config))
        bare_rates.append(processed / seconds)

    client, bare = statistics.median(client_rates), statistics.median(bare_rates)
    figures = {
        "algo": args.algo,
        "train_samples": len(data.train),
        "batch_size": config.batch_size,
        "threads": args.threads,
        "client_samples_per_s": round(client, 1),
        "bare_samples_per_s": round(bare, 1),
        "ratio_client_over_bare": round(client / bare, 3),
        "repeats": args.repeats,
    }
    print(
        f"{args.algo}: {len(data.train)} train samples, batch {config.batch_size}, "
        f"{args.threads} thread(s), median of {args.repeats}"
    )
    print(f"  client procedure : {client:8.1f} samples/s")
    print(f"  bare PyTorch loop: {bare:8.1f} samples/s")
    print(f"  ratio client/bare: {client / bare:.3f}")
    print("rerun: python benchmarks/client_throughput.py " + " ".join(_argv(args)))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")


def _argv(args: argparse.Namespace) -> list[str]:
    pairs = {k.replace("_", "-"): v for k, v in vars(args).items() if v not in (None, False)}
    return [f"--{k} {v}" for k, v in pairs.items() if k != "out"]


if __name__ == "__main__":
    main()
