"""Share of a round spent evaluating, with the global model evaluated by the ServerApp on
its own copy of the union test set (``global-eval=server``, the path before issue 13) or
by each client on its test split in the same pass as its personal model
(``global-eval=clients``), measured in one invocation, interleaved (server, clients,
server) so that a drifting machine shows.

Each run: ``flwr run`` in Flower's simulation, every round evaluated (``eval-every=1``),
all clients evaluated. From ``results.json``: evaluation seconds over the round's seconds,
rounds 2..N (round 1 decodes the data), and whether the accuracies agree exactly.

    python benchmarks/eval_share.py --dataset-path ../shared/data/fashion_mnist \\
        --algos fedavg,fedreg --clients 20 --rounds 5 --data-fraction 0.25
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from fedreg_app.launcher import HF_OFFLINE_ENV, LocalSuperLink

ORDER = ("server", "clients", "server")


def run_once(link: LocalSuperLink, args: argparse.Namespace, algo: str, where: str,
             out: Path) -> dict[str, Any]:  # fmt: skip
    results_dir = out / f"{algo}-{where}-{len(list(out.glob(f'{algo}-{where}*')))}"
    config = (
        f"algo='{algo}' dataset-path='{Path(args.dataset_path).resolve()}' "
        f"results-dir='{results_dir}' num-server-rounds={args.rounds} local-epochs=1 "
        f"fraction-train=0.25 data-fraction={args.data_fraction} eval-every=1 "
        f"global-eval='{where}' seed=0"
    )
    log = link.run(config, supernodes=args.clients, cpus_per_client=1, timeout=7200)
    paths = list(results_dir.glob("*/results.json"))
    if not paths:
        raise RuntimeError(f"{algo} {where}: no results\n{log[-3000:]}")
    return json.loads(paths[0].read_text())


def share(document: dict[str, Any]) -> tuple[float, float, float]:
    """(evaluation share, seconds per round, evaluation seconds per round), rounds 2..N."""
    rounds = document["rounds"][1:]
    train = sum(r["train_seconds"] for r in rounds)
    evaluate = sum(r["eval_seconds"] for r in rounds)
    return evaluate / (train + evaluate), (train + evaluate) / len(rounds), evaluate / len(rounds)


def accuracies(document: dict[str, Any]) -> list[tuple]:
    return [(r["global_accuracy"], r["personal_accuracy"]) for r in document["rounds"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset-path", required=True)
    parser.add_argument("--algos", default="fedavg,fedreg")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--data-fraction", type=float, default=0.25)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        with LocalSuperLink(home, extra_env=HF_OFFLINE_ENV) as link:  # noqa: SIM117 - needs tmp
            summary = measure(link, args, Path(tmp) / "runs")
    print(f"eval_share: clients={args.clients} rounds={args.rounds} "
          f"data_fraction={args.data_fraction} " + " ".join(summary))  # fmt: skip


def measure(link: LocalSuperLink, args: argparse.Namespace, out: Path) -> list[str]:
    """Every algorithm interleaved server / clients / server; one summary part each."""
    summary = []
    for algo in args.algos.split(","):
        documents = [(where, run_once(link, args, algo, where, out)) for where in ORDER]
        for where, document in documents:
            fraction, per_round, evaluating = share(document)
            print(f"{algo:8s} global-eval={where:7s} eval share {100 * fraction:5.1f}% | "
                  f"{per_round:6.1f} s/round, {evaluating:5.1f} s evaluating",
                  flush=True)  # fmt: skip
        same = all(accuracies(d) == accuracies(documents[0][1]) for _, d in documents)
        server = [share(d)[0] for w, d in documents if w == "server"]
        clients = [share(d)[0] for w, d in documents if w == "clients"]
        summary.append(
            f"{algo}_server={100 * sum(server) / len(server):.1f}% "
            f"{algo}_clients={100 * clients[0]:.1f}% {algo}_identical={same}"
        )
    return summary


if __name__ == "__main__":
    main()
