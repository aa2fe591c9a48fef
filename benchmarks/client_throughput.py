"""Benchmark (a): samples per second inside a client's local training, against a bare
PyTorch loop training the same model on the same in-memory tensors with the same batch
size. Both run in this process, alternating, so the ratio is measured in one run on the
same (possibly busy) machine.

The client side is the real procedure (``procedure.train``: load the global arrays, train
through ``fedreg_app.core.training``, export the reply's arrays). The bare loop is what one
would write by hand for the same computation: pre-normalised float tensors, ``randperm``
batches, SGD, cross entropy; for FedReG its own two steps (step 1 on the original data
through both heads, base and private head moving; step 2 on the rebalanced data through
the global head, base and global head moving), for every other algorithm the plain
model. One torch thread by default, as a Ray client actor with one CPU gets.

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
from fedreg_app.core.config import RunConfig
from fedreg_app.core.data import (
    ClientData,
    DatasetInfo,
    PartitionKey,
    TensorData,
    load_client_data,
    load_info,
    normalise,
)
from fedreg_app.core.models import BASE, HEAD_G, HEAD_P, SplitModel, build_model
from fedreg_app.core.protocol import NUM_PROCESSED
from fedreg_app.core.training import Forward
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


def bare_steps(
    model: SplitModel,
    steps: list[tuple[list[torch.nn.Parameter], Forward, torch.Tensor, torch.Tensor]],
    config: RunConfig,
) -> int:
    """The hand-written loop: for each step (parameters that move, forward pass, float
    inputs prepared once, labels), a fresh SGD and ``local-epochs`` shuffled passes."""
    generator = torch.Generator().manual_seed(1)
    model.train()
    processed = 0
    for params, forward, x, y in steps:
        moving = {id(p) for p in params}
        for p in model.parameters():
            p.requires_grad_(id(p) in moving)
        optimizer = torch.optim.SGD(params, lr=config.lr, momentum=config.momentum)
        for _ in range(config.local_epochs):
            order = torch.randperm(len(y), generator=generator)
            stop = len(y) - len(y) % config.batch_size if config.drop_last else len(y)
            for start in range(0, stop, config.batch_size):
                idx = order[start : start + config.batch_size]
                optimizer.zero_grad(set_to_none=True)
                F.cross_entropy(forward(x[idx]), y[idx]).backward()
                optimizer.step()
                processed += len(idx)
    return processed


def bare_reference(
    algo: str, info: DatasetInfo, config: RunConfig, data: ClientData, procedure
) -> tuple[SplitModel, list]:
    """The model and steps of the bare loop: FedReG's own two steps, else the plain model."""
    x, y = normalise(data.train.x.clone()), data.train.y
    if algo != "fedreg":
        model = build_model(info, config.head_depth, config.seed, model=config.model)
        return model, [(list(model.parameters()), model, x, y)]
    model = build_model(info, config.head_depth, config.seed, private_head=True,
                        model=config.model)  # fmt: skip
    rebalanced = procedure.rebalanced().data
    xr = rebalanced.x if rebalanced.x.dtype != torch.uint8 else normalise(rebalanced.x.clone())

    def personal(inputs: torch.Tensor) -> torch.Tensor:
        features = model.base(inputs)
        return model.head_g(features) + model.head_p(features)

    return model, [
        (model.parameters_of(BASE, HEAD_P), personal, x, y),
        (model.parameters_of(BASE, HEAD_G), model, xr, rebalanced.y),
    ]


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
    global_arrays = build_model(
        info, config.head_depth, config.seed, model=config.model
    ).group_state(BASE, HEAD_G)

    procedure = get_algorithm(args.algo).client(
        ClientSetup(config, info, data, RecordDict())
    )  # one procedure across repeats: its per-process caches (rebalanced set) stay warm
    procedure.train(global_arrays, server_round=1)  # warm-up, builds caches, not timed
    bare_steps(*bare_reference(args.algo, info, config, data, procedure), config)  # warm-up
    client_rates, bare_rates = [], []
    for repeat in range(args.repeats):
        seconds, processed = timed(
            lambda r=repeat: int(procedure.train(global_arrays, r + 2).metrics[NUM_PROCESSED])
        )
        client_rates.append(processed / seconds)
        model, steps = bare_reference(args.algo, info, config, data, procedure)
        seconds, processed = timed(lambda m=model, s=steps: bare_steps(m, s, config))
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
    print(
        f"client_throughput: algo={args.algo} ratio={client / bare:.3f} "
        f"client_per_s={client:.1f} bare_per_s={bare:.1f} train_samples={len(data.train)} "
        f"batch={config.batch_size} threads={args.threads} repeats={args.repeats} "
        f"model={config.model} real_data={bool(args.dataset_path)}"
    )


def _argv(args: argparse.Namespace) -> list[str]:
    pairs = {k.replace("_", "-"): v for k, v in vars(args).items() if v not in (None, False)}
    return [f"--{k} {v}" for k, v in pairs.items() if k != "out"]


if __name__ == "__main__":
    main()
