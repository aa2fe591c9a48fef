"""Benchmarks (b) and (c): what a round of Flower's simulation costs around the clients'
own work, and what a large simulation needs.

(b) ``overhead``: a small run with one client at a time (each client gets every core),
so the clients' work is on the critical path one after the other. Per round, from
``results.json``: the round's wall time, the clients' compute time (inside the
algorithm's procedure) and their whole handler time (setup included) as reported in
their replies, and the server's own evaluation. Overhead = wall - client compute - server
evaluation, as a fraction of the round; it splits into per-message setup in the ClientApp
(handler - compute) and what Flower and Ray add around the handler (the rest).

(c) ``scale``: the FedReG paper's Table 3 setting at 500 clients (CIFAR-10, alpha 0.1,
fraction 0.2, batch size 1 as the paper used) for fedreg, feddyn and ditto: seconds per
training round and the peak resident memory of the whole simulation (SuperLink, ServerApp
process, Ray and its client actors), sampled from /proc every half second.

    python benchmarks/simulation.py overhead --dataset-path ../shared/data/fashion_mnist
    python benchmarks/simulation.py scale --dataset-path ../shared/data/cifar10_jpeg \\
        --algos fedreg,feddyn,ditto --clients 500 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fedreg_app.launcher import LocalSuperLink, descendants

PAGE = os.sysconf("SC_PAGE_SIZE")
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


# ------------------------------------------------------------------ memory
def tree_rss_mib(root: int) -> tuple[float, float]:
    """(total, largest single process) resident memory of ``root`` and its descendants."""
    sizes = []
    for pid in [root, *descendants(root)]:
        with contextlib.suppress(OSError):  # the process ended meanwhile
            sizes.append(int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2**20)
    return sum(sizes), max(sizes, default=0.0)


class PeakMemory(threading.Thread):
    """Samples a process tree's resident memory until stopped; keeps the peaks."""

    def __init__(self, root: int, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.root, self.every = root, every
        self.peak_total = self.peak_process = 0.0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            total, largest = tree_rss_mib(self.root)
            self.peak_total = max(self.peak_total, total)
            self.peak_process = max(self.peak_process, largest)
            self._halt.wait(self.every)

    def stop(self) -> None:
        self._halt.set()
        self.join()


# -------------------------------------------------------------------- runs
def run_once(
    superlink: LocalSuperLink, run_config: dict[str, Any], clients: int, cpus: int
) -> dict[str, Any]:
    """One ``flwr run``; returns its results.json (raises if it did not complete)."""
    results_dir = Path(run_config["results-dir"])
    pairs = " ".join(f"{k}={_value(v)}" for k, v in run_config.items())
    log = superlink.run(pairs, supernodes=clients, cpus_per_client=cpus)
    paths = sorted(results_dir.glob("*/results.json"))
    results = json.loads(paths[-1].read_text()) if paths else {}
    if results.get("run", {}).get("status") != "completed":
        raise RuntimeError(f"run did not complete:\n{log[-3000:]}")
    return results


def _value(value: Any) -> str:
    return f"'{value}'" if isinstance(value, str) else str(value).lower()


def overhead_rows(results: dict[str, Any]) -> list[dict[str, float]]:
    rows = []
    for r in results["rounds"]:
        wall = r["train_seconds"] + r["eval_seconds"]
        compute, handler = r["client_compute_seconds"], r["client_handler_seconds"]
        work = compute + r["server_eval_seconds"]
        rows.append(
            {
                "round": r["round"],
                "wall_s": wall,
                "client_compute_s": compute,
                "server_eval_s": r["server_eval_seconds"],
                "setup_in_clientapp_s": handler - compute,
                "outside_handler_s": wall - handler - r["server_eval_seconds"],
                "overhead_fraction": (wall - work) / wall,
            }
        )
    return rows


def overhead(args: argparse.Namespace, superlink: LocalSuperLink, out: Path) -> dict:
    run_config = {
        "algo": args.algo, "num-server-rounds": args.rounds, "fraction-train": args.fraction,
        "local-epochs": 1, "eval-every": 1, "results-dir": str(out / "overhead"),
    }  # fmt: skip
    if args.dataset_path:
        run_config["dataset-path"] = str(Path(args.dataset_path).resolve())
    results = run_once(superlink, run_config, args.clients, cpus=os.cpu_count() or 1)
    rows = overhead_rows(results)
    print(f"(b) round overhead: {args.algo}, {args.clients} clients, fraction {args.fraction}, "
          f"one client at a time with {os.cpu_count()} cores")  # fmt: skip
    print("round |  wall s | client compute s | server eval s | ClientApp setup s | "
          "Flower/Ray s | overhead")  # fmt: skip
    for row in rows:
        print(
            f"{row['round']:5d} | {row['wall_s']:7.2f} | {row['client_compute_s']:16.2f} | "
            f"{row['server_eval_s']:13.2f} | {row['setup_in_clientapp_s']:17.2f} | "
            f"{row['outside_handler_s']:12.2f} | {100 * row['overhead_fraction']:6.1f}%"
        )
    later = [r["overhead_fraction"] for r in rows[1:]] or [rows[0]["overhead_fraction"]]
    print(
        f"median overhead fraction (rounds after the first): {100 * statistics.median(later):.1f}%"
    )
    return {"rows": rows, "median_overhead_fraction_after_round_1": statistics.median(later)}


def scale(args: argparse.Namespace, superlink: LocalSuperLink, out: Path) -> dict:
    figures = {}
    for algo in args.algos.split(","):
        run_config = {
            "algo": algo, "num-server-rounds": args.rounds, "fraction-train": args.fraction,
            "alpha": 0.1, "batch-size": args.batch_size, "local-epochs": 1,
            "eval-every": args.rounds, "partition": "dirichlet-topup",
            "dataset": args.dataset, "results-dir": str(out / f"scale_{algo}"),
        }  # fmt: skip
        if args.dataset_path:
            run_config["dataset-path"] = str(Path(args.dataset_path).resolve())
        sampler = PeakMemory(superlink.process.pid)
        sampler.start()
        started = time.perf_counter()
        try:
            results = run_once(superlink, run_config, args.clients, cpus=1)
        finally:
            sampler.stop()
        train = [r["train_seconds"] for r in results["rounds"]]
        figures[algo] = {
            "wall_s": round(time.perf_counter() - started, 1),
            "train_s_per_round_median": round(statistics.median(train[1:] or train), 2),
            "train_s_round_1": train[0],
            "peak_rss_total_mib": round(sampler.peak_total),
            "peak_rss_one_process_mib": round(sampler.peak_process),
            "best_global_accuracy": results["best_global_accuracy"],
        }
        print(f"(c) {algo}: {json.dumps(figures[algo])}", flush=True)
    print(f"(c) scale: {args.clients} clients, fraction {args.fraction}, batch {args.batch_size}, "
          f"{args.rounds} rounds, {os.cpu_count()} cores")  # fmt: skip
    print("algo | s/train round (median, r>1) | round 1 s | peak RSS total MiB | "
          "largest process MiB")  # fmt: skip
    for algo, f in figures.items():
        print(f"{algo} | {f['train_s_per_round_median']} | {f['train_s_round_1']} | "
              f"{f['peak_rss_total_mib']} | {f['peak_rss_one_process_mib']}")  # fmt: skip
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["overhead", "scale"])
    parser.add_argument("--dataset-path", help="offline copy in hub layout")
    parser.add_argument("--dataset", default="uoft-cs/cifar10", help="hub id (scale)")
    parser.add_argument("--algo", default="fedavg", help="overhead: the algorithm")
    parser.add_argument("--algos", default="fedreg,feddyn,ditto", help="scale: algorithms")
    parser.add_argument("--clients", type=int)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fraction", type=float)
    parser.add_argument("--batch-size", type=int, default=1, help="scale (paper: 1)")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    defaults = {"overhead": (10, 0.5), "scale": (500, 0.2)}[args.mode]
    args.clients = args.clients or defaults[0]
    args.fraction = args.fraction or defaults[1]
    work = Path(tempfile.mkdtemp(prefix=f"bench_{args.mode}_"))
    with LocalSuperLink(work / "flwr_home", extra_env=OFFLINE) as superlink:
        figures = (overhead if args.mode == "overhead" else scale)(args, superlink, work)
    print(f"results under {work}")
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
