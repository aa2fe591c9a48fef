"""The same small run in Flower's simulation and as a real deployment on loopback
(SuperLink + one SuperNode per client, ``fedreg_tools.deployment.LocalDeployment``):
seconds per round, and where a deployed round's time goes.

Per round, from ``results.json``: wall time, the clients' own compute (summed), their
whole handler time (summed; handler - compute = setup in the ClientApp, e.g. loading the
node's cached data), the slowest handler of each phase and the server's evaluation.
Transport is the wall time beyond the slowest handlers and the server's evaluation: in
deployment every message starts a fresh ``flwr-clientapp`` process (interpreter, imports:
timed here on its own as "cold start"), SuperExec polls for it, and SuperNodes poll the
SuperLink every 3 s (fixed in Flower 1.41/1.42).

    python benchmarks/deployment_vs_simulation.py --dataset-path ../shared/data/fashion_mnist
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fedreg_tools.deployment import LocalDeployment
from fedreg_tools.launcher import HF_OFFLINE_ENV, LocalSuperLink, config_text


def per_round(results: dict[str, Any]) -> dict[str, float]:
    """Medians over the rounds after the first (which decodes and caches data)."""
    rounds = results["rounds"][1:] or results["rounds"]

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 2)

    return {
        "wall_s": median([r["train_seconds"] + r["eval_seconds"] for r in rounds]),
        "client_compute_s": median([r["client_compute_seconds"] for r in rounds]),
        "client_handler_s": median([r["client_handler_seconds"] for r in rounds]),
        "server_eval_s": median([r["server_eval_seconds"] for r in rounds]),
        "transport_s": median(
            [
                r["train_seconds"]
                + r["eval_seconds"]
                - r.get("slowest_handlers_seconds", 0.0)
                - r["server_eval_seconds"]
                for r in rounds
            ]
        ),
        "first_round_s": round(
            results["rounds"][0]["train_seconds"] + results["rounds"][0]["eval_seconds"], 2
        ),
    }


def cold_start_seconds(repeats: int = 3) -> float:
    """What a fresh ClientApp process pays before its handler runs: the interpreter and
    the imports of Flower's ClientApp runtime and of this app (median of ``repeats``)."""
    code = "import flwr.clientapp, fedreg_app.client_app"
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - started)
    return round(statistics.median(times), 2)


def latest(folder: Path) -> dict[str, Any]:
    paths = sorted(folder.glob("*/results.json"))
    results = json.loads(paths[-1].read_text()) if paths else {}
    if results.get("run", {}).get("status") != "completed":
        raise RuntimeError(f"run in {folder} did not complete")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset-path", required=True)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--algo", default="fedreg")
    parser.add_argument("--data-fraction", type=float, default=0.05)
    parser.add_argument(
        "--node-threads",
        type=int,
        default=1,
        help="torch threads per SuperNode's ClientApp (0: torch's default)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="deploy_vs_sim_"))
    config = {
        "algo": args.algo, "dataset-path": str(Path(args.dataset_path).resolve()),
        "data-fraction": args.data_fraction, "num-server-rounds": args.rounds,
        "local-epochs": 1, "fraction-train": 1.0, "seed": 0,
    }  # fmt: skip

    sim_dir = work / "simulation"
    with LocalSuperLink(work / "sim_home", extra_env=HF_OFFLINE_ENV) as superlink:
        superlink.run(config_text({**config, "results-dir": str(sim_dir)}), args.clients)
    simulation = per_round(latest(sim_dir))

    dep_dir = work / "deployment"
    nodes = [
        {
            "partition-id": i,
            "num-partitions": args.clients,
            "state-dir": str(work / f"node{i}"),
            "num-threads": args.node_threads,
        }
        for i in range(args.clients)
    ]
    with LocalDeployment(work / "deploy", nodes, extra_env=HF_OFFLINE_ENV) as deployment:
        deployment.run(config_text({**config, "results-dir": str(dep_dir)}))
    deployed = per_round(latest(dep_dir))

    print(
        f"{args.algo}, {args.clients} clients (all train every round), "
        f"data-fraction {args.data_fraction}, {args.rounds} rounds; medians of rounds 2+"
    )
    cold = cold_start_seconds()
    print("mode | s/round | client compute s | client handler s | transport s | round 1 s")
    for name, f in (("simulation", simulation), ("deployment", deployed)):
        print(f"{name} | {f['wall_s']} | {f['client_compute_s']} | {f['client_handler_s']} | "
              f"{f['transport_s']} | {f['first_round_s']}")  # fmt: skip
    print(f"cold start of one ClientApp process (interpreter + imports): {cold} s")
    ratio = deployed["wall_s"] / simulation["wall_s"]
    print(f"deployment / simulation: {ratio:.1f}x per round")
    if args.out:
        figures = {"simulation": simulation, "deployment": deployed, "config": config,
                   "cold_start_s": cold}  # fmt: skip
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"results under {work}")
    print(
        f"deployment_vs_simulation: ratio={ratio:.2f} simulation_s={simulation['wall_s']} "
        f"deployment_s={deployed['wall_s']} deployment_transport_s={deployed['transport_s']} "
        f"simulation_transport_s={simulation['transport_s']} cold_start_s={cold} "
        f"algo={args.algo} clients={args.clients} rounds={args.rounds} "
        f"data_fraction={args.data_fraction} node_threads={args.node_threads}"
    )


if __name__ == "__main__":
    main()
