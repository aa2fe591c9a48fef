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
training round and the peak memory of the whole simulation (SuperLink, ServerApp
process, Ray and its client actors), sampled from /proc every half second: the sum of
resident sizes, the sum of proportional sizes (shared pages once), and each kind of
process's peak. ``--state disk`` (default) gives the run a state-dir, so clients' private
state and decoded partitions live on disk between messages; ``--state memory`` keeps them
in Flower's ``context.state`` and the processes.

(c') ``clients``: does a training round cost more because more clients exist? The scale
setting at ``--clients`` N, fraction f (default 500, 0.1) against N/2 clients at 2f over
half the data: the same clients train a round on about the same samples, out of twice as
many. Interleaved N, N/2, N in one invocation; the line gives ``ratio_per_sample``, the
training milliseconds per sample at N over those at N/2 (1.0: the total does not
matter; per sample because the clients drawn differ in size), and ``ratio`` of the
seconds per round.

Each invocation ends with one line ``simulation <mode>: key=value ...``.

    python benchmarks/simulation.py overhead --dataset-path ../shared/data/fashion_mnist
    python benchmarks/simulation.py scale --dataset-path ../shared/data/cifar10_jpeg \\
        --algos fedreg --clients 500 --rounds 2
    python benchmarks/simulation.py clients --dataset-path ../shared/data/cifar10_jpeg \
        --algos fedreg --clients 500 --fraction 0.1 --rounds 3
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

from fedreg_tools.launcher import HF_OFFLINE_ENV, LocalSuperLink, config_text, descendants

PAGE = os.sysconf("SC_PAGE_SIZE")


# ------------------------------------------------------------------ memory
#: Short names for the simulation's processes, from their command lines (first match).
ROLES = (
    ("ClientAppActor", "client actor"),
    ("flwr-simulation", "simulation (ServerApp + node states)"),
    ("flower-superexec", "superexec"),
    ("flower-superlink", "superlink"),
    ("raylet", "ray"),
    ("gcs_server", "ray"),
    ("ray", "ray"),
)


def role_of(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "other"
    return next((role for needle, role in ROLES if needle in cmdline), "other")


def tree_rss_mib(root: int) -> dict[int, float]:
    """Resident memory (MiB) of ``root`` and each of its descendants, by PID."""
    sizes = {}
    for pid in [root, *descendants(root)]:
        with contextlib.suppress(OSError, IndexError, ValueError):  # it ended meanwhile
            pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
            sizes[pid] = pages * PAGE / 2**20
    return sizes


def tree_pss_mib(pids: list[int]) -> float:
    """Proportional set size (MiB) of ``pids``: shared pages (the libraries every Python
    process maps, torch's above all) counted once in all, not once per process."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) / 1024
                    break
    return total


class TreeSampler(threading.Thread):
    """Samples the process tree under ``root`` every ``every`` seconds until stopped (a
    process living less than that is missed); subclasses say what a sample keeps."""

    def __init__(self, root: int, every: float) -> None:
        super().__init__(daemon=True)
        self.root, self.every = root, every
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.every)

    def sample(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self._halt.set()
        self.join()


class PeakMemory(TreeSampler):
    """A process tree's resident memory: the peak of the total, the largest single
    process, each role's peak (summed over its processes), the breakdown by role at the
    moment of the total's peak, and the peak of the total proportional set size (shared
    pages counted once)."""

    def __init__(self, root: int, every: float = 0.5) -> None:
        super().__init__(root, every)
        self.peak_total = self.peak_process = self.peak_pss = 0.0
        self.peak_by_role: dict[str, float] = {}
        self.at_peak: dict[str, float] = {}

    def sample(self) -> None:
        sizes = tree_rss_mib(self.root)
        by_role: dict[str, float] = {}
        for pid, mib in sizes.items():
            role = role_of(pid)  # not cached: a Ray worker names its role once it has one
            by_role[role] = by_role.get(role, 0.0) + mib
        total = sum(sizes.values())
        if total > self.peak_total:
            self.peak_total, self.at_peak = total, by_role
        self.peak_process = max(self.peak_process, *sizes.values(), 0.0)
        self.peak_pss = max(self.peak_pss, tree_pss_mib(list(sizes)))
        for role, mib in by_role.items():
            self.peak_by_role[role] = max(self.peak_by_role.get(role, 0.0), mib)


# -------------------------------------------------------------------- runs
def run_once(
    superlink: LocalSuperLink, run_config: dict[str, Any], clients: int, cpus: int
) -> dict[str, Any]:
    """One ``flwr run``; returns its results.json (raises if it did not complete)."""
    results_dir = Path(run_config["results-dir"])
    pairs = config_text(run_config)
    log = superlink.run(pairs, supernodes=clients, cpus_per_client=cpus)
    paths = sorted(results_dir.glob("*/results.json"))
    results = json.loads(paths[-1].read_text()) if paths else {}
    # "degraded": a round lost replies (at batch 1 a client can diverge to NaN and be
    # rejected); the run still measures what it costs.
    if results.get("run", {}).get("status") not in ("completed", "degraded"):
        raise RuntimeError(f"run did not complete:\n{log[-3000:]}")
    return results


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


def measure_scale(
    args: argparse.Namespace,
    superlink: LocalSuperLink,
    out: Path,
    algo: str,
    clients: int,
    fraction: float,
    data_fraction: float = 1.0,
    tag: str = "",
) -> dict[str, Any]:
    """One run of the scale setting: seconds per training round and peak memory."""
    name = f"{algo}{tag}"
    run_config = {
        "algo": algo, "num-server-rounds": args.rounds, "fraction-train": fraction,
        "alpha": 0.1, "batch-size": args.batch_size, "local-epochs": 1,
        "eval-every": args.rounds, "partition": "dirichlet-topup",
        "data-fraction": data_fraction,
        "dataset": args.dataset, "results-dir": str(out / f"scale_{name}"),
    }  # fmt: skip
    if args.dataset_path:
        run_config["dataset-path"] = str(Path(args.dataset_path).resolve())
    if args.state == "disk":  # private state and decoded partitions on disk
        run_config["state-dir"] = str(out / f"state_{name}")
    sampler = PeakMemory(superlink.process.pid)
    sampler.start()
    started = time.perf_counter()
    try:
        results = run_once(superlink, run_config, clients, cpus=1)
    finally:
        sampler.stop()
    train = [r["train_seconds"] for r in results["rounds"]]
    samples = [r["num_train_examples"] for r in results["rounds"]]
    per_sample = [1000 * t / n for t, n in zip(train, samples, strict=True) if n]
    return {
        "clients": clients,
        "fraction": fraction,
        "data_fraction": data_fraction,
        "wall_s": round(time.perf_counter() - started, 1),
        "train_s_per_round_median": round(statistics.median(train[1:] or train), 2),
        "train_s_round_1": round(train[0], 2),
        "train_samples_per_round": samples,
        # the clients drawn differ in size: seconds per sample compare rounds of unequal work
        "train_ms_per_sample_median": round(statistics.median(per_sample[1:] or per_sample), 3),
        "train_replies_per_round": [r["train_replies"] for r in results["rounds"]],
        "eval_s_last_round": round(results["rounds"][-1]["eval_seconds"], 2),
        "peak_rss_total_mib": round(sampler.peak_total),
        "peak_rss_one_process_mib": round(sampler.peak_process),
        "peak_pss_total_mib": round(sampler.peak_pss),
        "peak_rss_by_role_mib": {k: round(v) for k, v in sampler.peak_by_role.items()},
        "at_total_peak_by_role_mib": {k: round(v) for k, v in sampler.at_peak.items()},
        "best_global_accuracy": results["best_global_accuracy"],
    }


def scale(args: argparse.Namespace, superlink: LocalSuperLink, out: Path) -> dict:
    figures = {}
    for algo in args.algos.split(","):
        figures[algo] = measure_scale(args, superlink, out, algo, args.clients, args.fraction)
        print(f"(c) {algo}: {json.dumps(figures[algo])}", flush=True)
    print(f"(c) scale: {args.clients} clients, fraction {args.fraction}, batch {args.batch_size}, "
          f"{args.rounds} rounds, state {args.state}, {os.cpu_count()} cores")  # fmt: skip
    print("algo | s/train round (median, r>1) | round 1 s | peak RSS total MiB | "
          "largest process MiB | by role at the peak (MiB)")  # fmt: skip
    for algo, f in figures.items():
        roles = ", ".join(f"{k} {v}" for k, v in sorted(f["at_total_peak_by_role_mib"].items()))
        print(f"{algo} | {f['train_s_per_round_median']} | {f['train_s_round_1']} | "
              f"{f['peak_rss_total_mib']} | {f['peak_rss_one_process_mib']} | {roles}")  # fmt: skip
    return figures


def total_clients(args: argparse.Namespace, superlink: LocalSuperLink, out: Path) -> dict:
    """(c') Does a round cost more when more clients exist but the same number train on
    the same number of samples? ``--clients`` N at fraction f over all the data against
    N/2 clients at 2f over half the data (each client the same size on average): the
    same participating clients and samples a round, twice the total. Interleaved
    (large, small, large) so that drift of a shared machine shows."""
    algo = args.algos.split(",")[0]
    large = (args.clients, args.fraction, 1.0)
    small = (args.clients // 2, 2 * args.fraction, 0.5)
    runs = []
    for index, (clients, fraction, data_fraction) in enumerate((large, small, large)):
        figures = measure_scale(args, superlink, out, algo, clients, fraction,
                                data_fraction, tag=f"_{index}_{clients}")  # fmt: skip
        runs.append(figures)
        print(f"(c') {algo} {clients} clients: {json.dumps(figures)}", flush=True)
    print("clients | fraction | data fraction | trained a round | samples a round | "
          "s/train round | ms per sample | round 1 s | peak PSS MiB")  # fmt: skip
    for f in runs:
        print(f"{f['clients']} | {f['fraction']} | {f['data_fraction']} | "
              f"{f['train_replies_per_round']} | {f['train_samples_per_round']} | "
              f"{f['train_s_per_round_median']} | {f['train_ms_per_sample_median']} | "
              f"{f['train_s_round_1']} | {f['peak_pss_total_mib']}")  # fmt: skip
    return {"algo": algo, "runs": runs}


def summary_line(args: argparse.Namespace, figures: dict) -> str:
    """The one line a log search finds: ``simulation <mode>: key=value ...``."""
    if args.mode == "clients":
        runs = figures["runs"]
        large = statistics.median([r["train_s_per_round_median"] for r in runs[::2]])
        small = runs[1]["train_s_per_round_median"]
        large_ms = statistics.median([r["train_ms_per_sample_median"] for r in runs[::2]])
        small_ms = runs[1]["train_ms_per_sample_median"]
        pairs = {
            "algo": figures["algo"], "large_clients": runs[0]["clients"],
            "small_clients": runs[1]["clients"], "fraction_large": runs[0]["fraction"],
            "rounds": args.rounds, "batch": args.batch_size, "state": args.state,
            "large_s_per_round": f"{large:.1f}", "small_s_per_round": f"{small:.1f}",
            "large_ms_per_sample": f"{large_ms:.2f}", "small_ms_per_sample": f"{small_ms:.2f}",
            "ratio_per_sample": f"{large_ms / small_ms:.2f}", "ratio": f"{large / small:.2f}",
            "large_pss_gib": f"{max(r['peak_pss_total_mib'] for r in runs[::2]) / 1024:.2f}",
            "small_pss_gib": f"{runs[1]['peak_pss_total_mib'] / 1024:.2f}",
        }  # fmt: skip
    elif args.mode == "overhead":
        rows = figures["rows"]
        pairs = {
            "algo": args.algo, "clients": args.clients, "rounds": args.rounds,
            "round1_s": f"{rows[0]['wall_s']:.1f}",
            "s_per_round": f"{statistics.median(r['wall_s'] for r in rows[1:] or rows):.1f}",
            "overhead": f"{100 * figures['median_overhead_fraction_after_round_1']:.1f}%",
        }  # fmt: skip
    else:
        pairs = {"clients": args.clients, "fraction": args.fraction, "rounds": args.rounds,
                 "batch": args.batch_size, "state": args.state}  # fmt: skip
        single = len(figures) == 1
        for algo, f in figures.items():
            prefix = "" if single else f"{algo}_"
            if single:
                pairs["algo"] = algo
            pairs |= {
                f"{prefix}peak_gib": f"{f['peak_rss_total_mib'] / 1024:.2f}",
                f"{prefix}largest_gib": f"{f['peak_rss_one_process_mib'] / 1024:.2f}",
                f"{prefix}pss_gib": f"{f['peak_pss_total_mib'] / 1024:.2f}",
                f"{prefix}s_per_round": f"{f['train_s_per_round_median']:.1f}",
                f"{prefix}round1_s": f"{f['train_s_round_1']:.1f}",
            }
    return f"simulation {args.mode}: " + " ".join(f"{k}={v}" for k, v in pairs.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["overhead", "scale", "clients"])
    parser.add_argument("--dataset-path", help="offline copy in hub layout")
    parser.add_argument("--dataset", default="uoft-cs/cifar10", help="hub id (scale)")
    parser.add_argument("--algo", default="fedavg", help="overhead: the algorithm")
    parser.add_argument("--algos", default="fedreg,feddyn,ditto", help="scale: algorithms")
    parser.add_argument("--clients", type=int)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fraction", type=float)
    parser.add_argument("--batch-size", type=int, default=1, help="scale (paper: 1)")
    parser.add_argument(
        "--state", choices=["disk", "memory"], default="disk",
        help="scale: clients' private state and decoded partitions under a state-dir in the "
        "benchmark's folder (disk), or in Flower's context.state and each process (memory)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    defaults = {"overhead": (10, 0.5), "scale": (500, 0.2), "clients": (500, 0.1)}[args.mode]
    args.clients = args.clients or defaults[0]
    args.fraction = args.fraction or defaults[1]
    work = Path(tempfile.mkdtemp(prefix=f"bench_{args.mode}_"))
    with LocalSuperLink(work / "flwr_home", extra_env=HF_OFFLINE_ENV) as superlink:
        measure = {"overhead": overhead, "scale": scale, "clients": total_clients}[args.mode]
        figures = measure(args, superlink, work)
    print(f"results under {work}")
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(summary_line(args, figures), flush=True)


if __name__ == "__main__":
    main()
