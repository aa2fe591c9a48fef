"""What ``dirichlet-balance`` changes in a partition: client sizes, classes per client and
the share of each client's largest class, for the balanced and the plain Dirichlet split
of the same dataset, client count, alpha and seed (labels only: no image is decoded).

    python benchmarks/partition_stats.py --dataset-path ../shared/data/fashion_mnist \
        --clients 50 --data-fraction 0.25

Ends with one line ``partition_stats: ...`` holding both settings' figures.
"""

from __future__ import annotations

import argparse

import numpy as np

from fedreg_app.core.data import PartitionKey, client_splits
from fedreg_app.registry import load_config


def class_counts(key: PartitionKey, clients: int, num_classes: int) -> np.ndarray:
    """Per client, its samples of each class (train and test splits together)."""
    rows = []
    for pid in range(clients):
        splits = client_splits(key, pid)
        labels = np.concatenate([np.asarray(splits[s]["label"]) for s in ("train", "test")])
        rows.append(np.bincount(labels, minlength=num_classes))
    return np.stack(rows)


def describe(counts: np.ndarray) -> dict[str, float]:
    """Sizes, mean classes held, mean share of the largest class."""
    sizes = counts.sum(axis=1)
    return {
        "min": int(sizes.min()),
        "median": int(np.median(sizes)),
        "max": int(sizes.max()),
        "classes": round(float((counts > 0).sum(axis=1).mean()), 2),
        "dominant": round(float((counts.max(axis=1) / sizes).mean()), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset-path", required=True)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-fraction", type=float, default=1.0)
    parser.add_argument("--num-classes", type=int, default=10)
    args = parser.parse_args()
    figures = {}
    for balance in (False, True):
        config = load_config({
            "dataset-path": args.dataset_path, "alpha": args.alpha, "seed": args.seed,
            "data-fraction": args.data_fraction, "dirichlet-balance": balance,
        })  # fmt: skip
        key = PartitionKey.from_config(config, args.clients)
        figures[balance] = describe(class_counts(key, args.clients, args.num_classes))
        print(f"dirichlet-balance={str(balance).lower()}: {figures[balance]}")
    summary = " ".join(
        f"{name}_{'balanced' if balance else 'plain'}={value}"
        for balance, values in figures.items()
        for name, value in values.items()
    )
    print(f"partition_stats: clients={args.clients} alpha={args.alpha} seed={args.seed} "
          f"data_fraction={args.data_fraction} {summary}")  # fmt: skip


if __name__ == "__main__":
    main()
