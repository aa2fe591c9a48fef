"""A client's evaluation when its personal model is the global model (FedAvg, FedProx,
FedDyn): one forward pass of the base and the head for both counts (now) against the base
once and the head twice (before), timed in turns in one process on the same client, with
the correct counts required to be equal.

The client is the real procedure (``procedure.evaluate`` with the global model's parts
built as the ClientApp builds them), on a real partition of the offline copy, or on
synthetic FMNIST-shaped data without ``--dataset-path``. One torch thread by default, as
a Ray client actor with one CPU gets.

    python benchmarks/eval_passes.py --dataset-path ../shared/data/fashion_mnist --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from client_throughput import client_data  # the same real or synthetic partition
from flwr.app import RecordDict

from clients.base import ClientProcedure, ClientSetup
from fedreg_app.client_app import global_model_parts
from fedreg_app.core.models import BASE, HEAD_G, build_model
from fedreg_app.registry import get_algorithm, load_config

WAYS = ("head once", "head twice")


def client(args: argparse.Namespace) -> ClientProcedure:
    """The algorithm's client on one partition (its test split is what is evaluated)."""
    run_config = {"algo": args.algo}
    if args.dataset_path:
        run_config["dataset-path"] = args.dataset_path
    config = load_config(run_config)
    info, data = client_data(args, config)
    return get_algorithm(args.algo).client(ClientSetup(config, info, data, RecordDict()))


def evaluate(procedure: ClientProcedure, arrays: dict, way: str) -> tuple[float, dict]:
    """Seconds of one evaluation message's procedure, and its counts; ``head twice``
    withholds the check that lets the personal head serve the global model."""
    parts = global_model_parts(procedure.setup, arrays)
    if way == "head twice":
        procedure.personal_head_is = lambda head: False  # type: ignore[method-assign]
    started = time.perf_counter()
    counts = procedure.evaluate(arrays, 1, parts)
    seconds = time.perf_counter() - started
    procedure.__dict__.pop("personal_head_is", None)
    return seconds, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", choices=("fedavg", "fedprox", "feddyn"), default="fedavg")
    parser.add_argument("--dataset-path", help="offline copy (else synthetic data)")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--partition", type=int, default=0)
    parser.add_argument("--samples", type=int, default=1024, help="synthetic split size")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    procedure = client(args)
    info, config = procedure.setup.info, procedure.config
    arrays = build_model(info, config.head_depth, config.seed, model=config.model).group_state(
        BASE, HEAD_G
    )
    seconds: dict[str, list[float]] = {way: [] for way in WAYS}
    counts = {way: evaluate(procedure, arrays, way)[1] for way in WAYS}  # warm-up
    for _ in range(args.repeats):
        for way in WAYS:
            took, counted = evaluate(procedure, arrays, way)
            seconds[way].append(took)
            assert counted == counts[way]
    same = counts[WAYS[0]] == counts[WAYS[1]]
    once, twice = (statistics.median(seconds[way]) for way in WAYS)
    samples = len(procedure.data.test)
    for way in WAYS:
        print(f"{way:10s}: {1000 * statistics.median(seconds[way]):7.1f} ms for {samples} samples")
    print(f"counts {counts[WAYS[0]]} {'equal' if same else 'DIFFER'}")
    print(
        f"eval_passes: algo={args.algo} samples={samples} threads={args.threads} "
        f"repeats={args.repeats} once_ms={1000 * once:.1f} twice_ms={1000 * twice:.1f} "
        f"speedup={twice / once:.2f}x identical={same} real_data={bool(args.dataset_path)}"
    )


if __name__ == "__main__":
    main()
