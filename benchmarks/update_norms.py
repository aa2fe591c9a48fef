"""The L2 norms of the clients' first-round updates without privacy: the number a
``dp-clip`` is chosen from (the median, as adaptive clipping targets: Andrew et al. 2021),
and how far honest clients spread per parameter group, which ``update-norm-factor`` must
leave room for.

Each of the run's first-round sampled clients (``--every-client``: every client) trains
from the seeded initial model with the config's settings; the norm is over the
parameters it sends (for FedReG: base and global head jointly, as central DP clips them),
and per group each client's norm over the median of the others' (the bound's ratio).

    python benchmarks/update_norms.py configs/table2_fmnist_cpu.toml --clients 50 \\
        --algo fedreg --set dataset-path=../shared/data/fashion_mnist
"""

from __future__ import annotations

import argparse
import statistics
import tomllib
from pathlib import Path

from flwr.app import RecordDict

from clients.base import ClientSetup
from fedreg_app.core.data import PartitionKey, load_client_data, load_info
from fedreg_app.core.models import initial_model
from fedreg_app.core.partition_map import PartitionMap
from fedreg_app.core.privacy import difference, update_norm
from fedreg_app.registry import get_algorithm, load_config
from fedreg_tools.overrides import parse_overrides
from strategies.robust import group_norms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--algo", default="fedavg")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--every-client", action="store_true",
                        help="train every client, not only round 1's sample")  # fmt: skip
    args = parser.parse_args()
    raw = {k: v for k, v in tomllib.loads(args.config.read_text()).items() if k != "experiment"}
    config = load_config({**raw, **parse_overrides(args.set), "algo": args.algo})
    algorithm = get_algorithm(config.algo)
    strategy = algorithm.strategy(config)
    strategy.set_partitions(PartitionMap(args.clients, {p: p for p in range(args.clients)}))
    key = PartitionKey.from_config(config, args.clients)
    info = load_info(key)
    server_model = initial_model(info, config)
    strategy.prepare_model(server_model)
    current = {k: v.detach().numpy().copy() for k, v in server_model.state_dict().items()}
    sent = strategy.arrays_to_send(current, 1)
    norms, replies = [], []
    partitions = range(args.clients) if args.every_client else strategy.sample_partitions(1)
    for pid in partitions:
        setup = ClientSetup(config, info, load_client_data(key, pid), RecordDict(),
                            partition_key=key)  # fmt: skip
        result = algorithm.client(setup).train(dict(sent), 1)
        norms.append(update_norm(difference(result.arrays, current)))
        replies.append((result.arrays, result.metrics))
        print(f"partition {pid}: |D_k| {len(setup.data.train)}, update norm {norms[-1]:.3f}")
    ratios = {
        group: max_ratio(group_norms([a for a, _ in replies], current, group),
                         [float(m[key]) for _, m in replies])
        for group, key in strategy.group_weights.items()
    }  # fmt: skip
    norms.sort()
    print(
        f"update_norms: algo={config.algo} clients={len(norms)} "
        f"median={statistics.median(norms):.3f} min={norms[0]:.3f} max={norms[-1]:.3f} "
        + " ".join(f"max_ratio_{group}={ratio:.2f}" for group, ratio in ratios.items())
    )


def max_ratio(norms: list[float], weights: list[float]) -> float:
    """The largest norm over the median of the others', among clients with weight > 0
    (what ``update-norm-factor`` is compared with)."""
    voters = [i for i, w in enumerate(weights) if w > 0]
    ratios = [norms[i] / statistics.median([norms[j] for j in voters if j != i])
              for i in voters if len(voters) > 1]  # fmt: skip
    return max(ratios, default=0.0)


if __name__ == "__main__":
    main()
