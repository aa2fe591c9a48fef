"""Share of a round spent evaluating, two ways of evaluating measured in one invocation,
interleaved (before, now, before) so that a drifting machine shows:

* ``--compare global-eval`` (the default): the global model evaluated by the ServerApp on
  its own copy of the union test set (``global-eval=server``)
  or by each client on its test split in the same pass as its personal model
  (``global-eval=clients``);
* ``--compare eval-batch``: clients evaluating in batches of 512 (``FEDREG_EVAL_BATCH=512``,
  what every run used before 0.3.0) or of the CPU default (128 per thread).

Each run: ``flwr run`` in Flower's simulation, every round evaluated (``eval-every=1``),
all clients evaluated. From ``results.json``: evaluation seconds over the round's seconds,
rounds 2..N (round 1 decodes the data), and whether the accuracies agree exactly. Beside
the wall-clock share, the *compute share*: the clients' evaluation work over all their work
(``eval_compute_seconds`` over ``client_compute_seconds``, summed over the same rounds),
what the share would be if messages, process set-up and idle actors cost nothing.

    python benchmarks/eval_share.py --dataset-path ../shared/data/fashion_mnist \\
        --algos fedavg,fedreg --clients 20 --rounds 5 --data-fraction 0.25 \\
        [--compare eval-batch]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from fedreg_app.core.training import EVAL_BATCH_ENV
from fedreg_tools.launcher import HF_OFFLINE_ENV, LocalSuperLink

#: For each comparison: (before, now) and how each runs (global-eval, environment).
WAYS = {
    "global-eval": {"server": ("server", {}), "clients": ("clients", {})},
    "eval-batch": {"512": ("clients", {EVAL_BATCH_ENV: "512"}), "default": ("clients", {})},
}


def run_once(args: argparse.Namespace, algo: str, way: str, tmp: Path) -> dict[str, Any]:
    """One ``flwr run`` on its own local SuperLink (the environment reaches its actors)."""
    global_eval, env = WAYS[args.compare][way]
    out = tmp / "runs"
    results_dir = out / f"{algo}-{way}-{len(list(out.glob(f'{algo}-{way}-*')))}"
    config = (
        f"algo='{algo}' dataset-path='{Path(args.dataset_path).resolve()}' "
        f"results-dir='{results_dir}' num-server-rounds={args.rounds} local-epochs=1 "
        f"fraction-train=0.25 data-fraction={args.data_fraction} eval-every=1 "
        f"global-eval='{global_eval}' seed=0"
    )
    home = tmp / f"home-{results_dir.name}"
    with LocalSuperLink(home, extra_env={**HF_OFFLINE_ENV, **env}) as link:
        log = link.run(config, supernodes=args.clients, cpus_per_client=1, timeout=7200)
    paths = list(results_dir.glob("*/results.json"))
    if not paths:
        raise RuntimeError(f"{algo} {way}: no results\n{log[-3000:]}")
    return json.loads(paths[0].read_text())


def share(document: dict[str, Any]) -> tuple[float, float, float]:
    """(evaluation share, seconds per round, evaluation seconds per round), rounds 2..N."""
    rounds = document["rounds"][1:]
    train = sum(r["train_seconds"] for r in rounds)
    evaluate = sum(r["eval_seconds"] for r in rounds)
    return evaluate / (train + evaluate), (train + evaluate) / len(rounds), evaluate / len(rounds)


def compute_share(document: dict[str, Any]) -> float:
    """The clients' evaluation work over all their work, rounds 2..N."""
    rounds = document["rounds"][1:]
    evaluate = sum(r.get("eval_compute_seconds", 0.0) for r in rounds)
    return evaluate / sum(r["client_compute_seconds"] for r in rounds)


def accuracies(document: dict[str, Any]) -> list[tuple]:
    return [(r["global_accuracy"], r["personal_accuracy"]) for r in document["rounds"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset-path", required=True)
    parser.add_argument("--algos", default="fedavg,fedreg")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--data-fraction", type=float, default=0.25)
    parser.add_argument("--compare", choices=sorted(WAYS), default="global-eval")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        summary = measure(args, Path(tmp))
    print(f"eval_share: compare={args.compare} clients={args.clients} rounds={args.rounds} "
          f"data_fraction={args.data_fraction} " + " ".join(summary))  # fmt: skip


def measure(args: argparse.Namespace, tmp: Path) -> list[str]:
    """Every algorithm interleaved before / now / before; one summary part each."""
    before, now = WAYS[args.compare]
    summary = []
    for algo in args.algos.split(","):
        documents = [(way, run_once(args, algo, way, tmp)) for way in (before, now, before)]
        for way, document in documents:
            fraction, per_round, evaluating = share(document)
            print(f"{algo:8s} {args.compare}={way:7s} eval share {100 * fraction:5.1f}% "
                  f"(compute share {100 * compute_share(document):5.1f}%) | "
                  f"{per_round:6.1f} s/round, {evaluating:5.1f} s evaluating",
                  flush=True)  # fmt: skip
        same = all(accuracies(d) == accuracies(documents[0][1]) for _, d in documents)
        shares = {way: [share(d)[0] for w, d in documents if w == way] for way in (before, now)}
        summary.append(
            f"{algo}_{before}={100 * statistics.mean(shares[before]):.1f}% "
            f"{algo}_{now}={100 * shares[now][0]:.1f}% "
            f"{algo}_{now}_compute={100 * compute_share(documents[1][1]):.1f}% "
            f"{algo}_identical={same}"
        )
    return summary


if __name__ == "__main__":
    main()
