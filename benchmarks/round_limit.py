"""A simulated round against its physical limit on this machine, in one run.

The simulation is the real thing: ``flwr run`` on a local SuperLink, Flower's Ray
backend, one client actor per core (one CPU and one torch thread each). Its rounds'
timings come from ``results.json``: each phase's wall time, the seconds the clients
spent inside their procedures (``client_compute_seconds``: training and evaluation,
summed over the round's clients; ``eval_compute_seconds``: the evaluation's part) and in
their whole message handlers.

The limit is the same work done by hand on the same cores: a pool of as many worker
processes as the simulation had actors (one torch thread each), which train the round's
sampled clients on their own partitions with ``client_throughput.py``'s hand-written loop
(the same samples, model, batch size, epochs, learning rate and momentum; inputs
normalised once, ``torch.optim.SGD``, no messages, no state, no checks) longest first,
then run one forward pass over each evaluated client's test split. Its wall time is the
round's floor; the sum of its per-client training seconds is what the clients' training
would take without the framework around it. Every worker decodes every partition before
the first pass, so no pass pays for decoding.

The ratios, per round after the first (which decodes every partition once), and their
medians over the rounds in the summary line:

* ``sim_over_bare``: the clients' training rate inside the simulation over the bare
  loop's, at the same concurrency (bare per-client training seconds / the simulated
  clients' training seconds, ``client_compute_seconds − eval_compute_seconds``, each
  summed over the round's clients); 1.0 means the framework costs the training loop
  nothing. ``eval_sim_over_bare`` is the same for the forward passes of evaluation;
* ``beyond_compute_share_of_handler``: the share of the clients' handler time, both
  phases, outside their procedures (setup, state, reading and writing the messages);
* ``round_over_limit``: the simulated round's wall time (train and evaluate phases) over
  the bare pool's.

Beside them, how the kernel scheduled the training threads (``/proc/PID/schedstat``):
how often the actors' and the bare workers' main threads were preempted per CPU second,
and which share of their runnable time they waited for a CPU.

The rounds' clients are known before the simulation (a dry run of the run's seeded
sampler; the simulation must draw the same), so the bare pool runs before and after each
simulation (bare, simulation, bare, ...): each simulation's limit is the mean of the two
bare passes beside it. ``--settings`` runs one simulation per setting
(``NAME=VALUE,NAME=VALUE``, ``-`` for none: a run-config key such as
``flush-denormals=false``, else an environment variable), interleaved the same way: a
setting's cost measured against another in one run. Settings that change a round here: Flower's
SuperExec task poll (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``), the niceness Ray gives its
workers (``RAY_worker_niceness``, 15 unless the app or the environment says otherwise) and
``flush-denormals``. ``SCHED_POLICY=batch`` (or ``idle``) starts every process of the
simulation under that scheduling policy.

Beside the ratios, the CPU seconds of every process of the simulation by role (client
actors, the simulation process with the ServerApp, SuperLink, SuperExec, Ray), over the
whole run and over the measured rounds: what the processes around the clients take from
them.

    python benchmarks/round_limit.py --dataset-path ../shared/data/fashion_mnist
    python benchmarks/round_limit.py --dataset-path ../shared/data/fashion_mnist \\
        --rounds 5 --state-dir --settings RAY_worker_niceness=15,flush-denormals=false -

It ends with one line ``round_limit: key=value ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import torch

from fedreg_app.core.config import RunConfig
from fedreg_app.core.data import PartitionKey, load_client_data, load_info, normalise
from fedreg_app.core.models import build_model
from fedreg_app.core.partition_map import PartitionMap
from fedreg_app.core.training import eval_batches, set_denormals
from fedreg_app.registry import load_config
from fedreg_tools.launcher import HF_OFFLINE_ENV, LocalSuperLink, config_text, descendants
from strategies.sampling import ClientSampler

sys.path.insert(0, str(Path(__file__).parent))
from client_throughput import bare_steps  # noqa: E402
from simulation import TreeSampler, role_of, run_once  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
SCHED_POLICIES = {"other": os.SCHED_OTHER, "batch": os.SCHED_BATCH, "idle": os.SCHED_IDLE}

# --------------------------------------------------------------- bare workers
_WORKER: dict[str, Any] = {}


def _start_worker(run_config: dict[str, Any], clients: int) -> None:
    """One torch thread, the run's config, every partition's data decoded (no pass pays
    for decoding, as no measured simulated round does) and a warm-up, before any timing."""
    torch.set_num_threads(1)
    config = load_config(run_config)
    set_denormals(config.flush_denormals)  # as the clients do
    key = PartitionKey.from_config(config, clients)
    _WORKER.update(config=config, key=key, info=load_info(key), data={})
    for partition in range(clients):
        _data(partition)
    train_client(0, warm_up=True)


def scheduler_counts(pid: int | str = "self") -> tuple[float, float, int]:
    """A process's main thread as the kernel's scheduler saw it so far: seconds on a CPU,
    seconds runnable but waiting for one, and how many times it was preempted (switched
    out while it could still run)."""
    on_cpu, waiting, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    status = Path(f"/proc/{pid}/status").read_text()
    preempted = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
    return int(on_cpu) / 1e9, int(waiting) / 1e9, preempted


def _data(partition: int):
    held = _WORKER["data"]
    if partition not in held:
        held[partition] = load_client_data(_WORKER["key"], partition)
    return held[partition]


def train_client(
    partition: int, warm_up: bool = False
) -> tuple[int, float, int, tuple[float, float, int]]:
    """The partition's training split trained by ``client_throughput.bare_steps``, the
    hand-written loop (a few batches when ``warm_up``); returns (partition, seconds,
    samples, the worker's ``scheduler_counts`` over the training)."""
    config: RunConfig = _WORKER["config"]
    data = _data(partition)
    x, y = normalise(data.train.x.clone()), data.train.y
    if warm_up:
        x, y = x[: 20 * config.batch_size], y[: 20 * config.batch_size]
    model = build_model(_WORKER["info"], config.head_depth, config.seed, model=config.model)
    before, started = scheduler_counts(), time.perf_counter()
    processed = bare_steps(model, [(list(model.parameters()), model, x, y)], config)
    seconds, after = time.perf_counter() - started, scheduler_counts()
    return partition, seconds, processed, tuple(b - a for a, b in zip(before, after, strict=True))


def evaluate_client(partition: int) -> tuple[int, float, int]:
    """One forward pass over the partition's test split, in the product's eval batches."""
    config: RunConfig = _WORKER["config"]
    data = _data(partition)
    model = build_model(_WORKER["info"], config.head_depth, config.seed, model=config.model)
    model.eval()
    started = time.perf_counter()
    with torch.inference_mode():
        for x, _ in eval_batches(data.test, torch.device("cpu")):
            model(x)
    return partition, time.perf_counter() - started, len(data.test)


def bare_round(pool, sizes: dict[int, int], trained: list[int], evaluated: list[int]) -> dict:
    """The round's work by hand on the pool: training longest first, then evaluation."""
    order = sorted(trained, key=lambda p: -sizes[p])
    started = time.perf_counter()
    train = list(pool.imap_unordered(train_client, order))
    train_wall = time.perf_counter() - started
    started = time.perf_counter()
    evaluate = list(pool.imap_unordered(evaluate_client, evaluated)) if evaluated else []
    eval_wall = time.perf_counter() - started
    return {
        "train_wall_s": train_wall,
        "train_client_s": sum(s for _, s, _, _ in train),
        "train_samples": sum(n for _, _, n, _ in train),
        "train_on_cpu_s": sum(c[0] for *_, c in train),
        "train_waiting_s": sum(c[1] for *_, c in train),
        "train_preempted": sum(c[2] for *_, c in train),
        "eval_wall_s": eval_wall,
        "eval_client_s": sum(s for _, s, _ in evaluate),
    }


# ------------------------------------------------------------------ the run
class CpuByRole(TreeSampler):
    """CPU seconds (user + system) of every process under ``root`` by role (client actor,
    simulation process, SuperLink, Ray, ...), so that the CPU of a stretch of the run can
    be told apart."""

    def __init__(self, root: int, every: float = 0.25) -> None:
        super().__init__(root, every)
        self.roles: dict[int, str] = {}
        #: (monotonic time, {pid: CPU seconds so far}) per sample
        self.samples: list[tuple[float, dict[int, float]]] = []
        #: {pid: ``scheduler_counts``} per sample, for the client actors' main threads
        self.scheduling: list[dict[int, tuple[float, float, int]]] = []

    def sample(self) -> None:
        seconds, scheduling = {}, {}
        for pid in [self.root, *descendants(self.root)]:
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                seconds[pid] = (int(fields[11]) + int(fields[12])) / TICKS
                if self.roles.get(pid) != "client actor":  # a Ray worker names it late
                    self.roles[pid] = role_of(pid)
                if self.roles[pid] == "client actor":
                    scheduling[pid] = scheduler_counts(pid)
        self.samples.append((time.monotonic(), seconds))
        self.scheduling.append(scheduling)

    def window(self, last_seconds: float) -> tuple[int, int]:
        """The indices of the samples that open and close the ``last_seconds`` before
        the client actors ended."""
        times = [t for t, _ in self.samples]
        actors = [i for i, (_, seconds) in enumerate(self.samples)
                  if any(self.roles.get(pid) == "client actor" for pid in seconds)]  # fmt: skip
        end = actors[-1] if actors else len(times) - 1
        start = next((i for i in range(end, -1, -1) if times[i] <= times[end] - last_seconds), 0)
        return start, end

    def actor_scheduling(self, last_seconds: float) -> tuple[float, float, int]:
        """The client actors' main threads over the ``last_seconds`` before they ended:
        ``scheduler_counts`` summed over the actors."""
        start, end = self.window(last_seconds)
        before, after = self.scheduling[start], self.scheduling[end]
        deltas = [tuple(b - a for a, b in zip(before[pid], after[pid], strict=True))
                  for pid in after if pid in before]  # fmt: skip
        return tuple(sum(d[i] for d in deltas) for i in range(3))  # type: ignore[return-value]

    def by_role(self, last_seconds: float | None = None) -> dict[str, float]:
        """CPU seconds by role over the whole run, or over the ``last_seconds`` before the
        client actors ended (the run's last rounds)."""
        if last_seconds is None:  # each process's last sample
            before, after = {}, {pid: cpu for _, seconds in self.samples
                                 for pid, cpu in seconds.items()}  # fmt: skip
        else:
            start, end = self.window(last_seconds)
            before, after = self.samples[start][1], self.samples[end][1]
        totals: dict[str, float] = {}
        for pid, cpu in after.items():
            role = self.roles.get(pid, "other")
            totals[role] = totals.get(role, 0.0) + cpu - before.get(pid, 0.0)
        return totals


def simulated(
    args: argparse.Namespace, work: Path, run_config: dict[str, Any], env: dict[str, str]
) -> tuple[dict, CpuByRole, float]:
    """The run's results.json, its processes' CPU, and its wall seconds. ``SCHED_POLICY``
    in ``env`` (``batch``, ``idle``, ``other``) is no variable: every process of the
    simulation starts under that scheduling policy (``sched(7)``; they inherit it)."""
    env = {**HF_OFFLINE_ENV, **env}
    policy = SCHED_POLICIES[env.pop("SCHED_POLICY", "other")]
    own = os.sched_getscheduler(0), os.sched_getparam(0)
    os.sched_setscheduler(0, policy, os.sched_param(0))  # this thread, which starts them
    try:
        with LocalSuperLink(work / "flwr_home", extra_env=env) as superlink:
            cpu = CpuByRole(superlink.process.pid)
            cpu.start()
            started = time.perf_counter()
            try:
                results = run_once(superlink, run_config, args.clients, cpus=1)
            finally:
                cpu.stop()
            return results, cpu, time.perf_counter() - started
    finally:
        os.sched_setscheduler(0, *own)


def train_sizes(run_config: dict[str, Any], clients: int) -> dict[int, int]:
    key = PartitionKey.from_config(load_config(run_config), clients)
    return {p: len(load_client_data(key, p).train) for p in range(clients)}


def setting_of(text: str) -> dict[str, str]:
    """``NAME=VALUE,NAME=VALUE`` (or ``-``: nothing) as a dict."""
    if text == "-":
        return {}
    pairs = [item.split("=", 1) for item in text.split(",")]
    if any(len(pair) != 2 or not pair[0] for pair in pairs):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE[,NAME=VALUE...] or '-': {text!r}")
    return dict(pairs)


def split_setting(setting: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """A setting's run-config keys (lowercase, values read as TOML scalars) and its
    environment variables."""
    keys = {k: tomllib.loads(f"v = {v}")["v"] for k, v in setting.items() if k.islower()}
    return keys, {k: v for k, v in setting.items() if not k.islower()}


def drawn_clients(run_config: dict[str, Any], clients: int, rounds: int) -> list[list[int]]:
    """The partitions each round trains, from the run's seeded sampler with every
    partition's node connected."""
    sampler = ClientSampler(load_config(run_config))
    sampler.set_population(clients)
    partitions = PartitionMap(clients, {p: 1000 + p for p in range(clients)})
    return [sampler.sample(partitions) for _ in range(rounds)]


def evaluated_of(round_: dict[str, Any], clients: int) -> list[int]:
    """The partitions whose test splits the round evaluated (all, when not recorded)."""
    accuracies = round_.get("client_accuracies")
    if not round_.get("eval_replies"):
        return []
    return sorted(int(p) for p in accuracies) if accuracies else list(range(clients))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset-path", required=True, help="offline copy in hub layout")
    parser.add_argument("--algo", default="fedavg")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="the first is not measured")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="client actors and bare workers (one core each)")  # fmt: skip
    parser.add_argument("--state-dir", action="store_true",
                        help="give the simulation a state-dir (private state on disk)")  # fmt: skip
    parser.add_argument(
        "--settings", nargs="+", type=setting_of, default=[{}], metavar="NAME=VALUE[,...]",
        help="settings to simulate with, one run each between bare passes: run-config keys "
        "(lowercase) or environment variables ('-': none, the default)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_round_limit_"))
    run_config: dict[str, Any] = {
        "algo": args.algo, "num-server-rounds": args.rounds, "fraction-train": args.fraction,
        "local-epochs": args.epochs, "eval-every": 1,
        "dataset-path": str(Path(args.dataset_path).resolve()),
    }  # fmt: skip
    bare_config = dict(run_config)
    os.environ.update(HF_OFFLINE_ENV)
    sizes = train_sizes(bare_config, args.clients)
    # the rounds' clients come from a dry run of the run's seeded sampler; each
    # simulation must then have drawn the same
    drawn = drawn_clients(bare_config, args.clients, args.rounds)[1:]
    everyone = list(range(args.clients))

    context = multiprocessing.get_context("spawn")
    runs = []
    with context.Pool(args.workers, _start_worker, (bare_config, args.clients)) as pool:
        bare = [[bare_round(pool, sizes, t, everyone) for t in drawn]]
        for index, setting in enumerate(args.settings):
            folder = work / f"run{index}"
            keys, env = split_setting(setting)
            config = {**run_config, **keys, "results-dir": str(folder / "results")}
            if args.state_dir:
                config["state-dir"] = str(folder / "state")
            runs.append((setting, config, *simulated(args, folder, config, env)))
            rounds = runs[-1][2]["rounds"][1:]
            work_of = [(r["sampled_clients"], evaluated_of(r, args.clients)) for r in rounds]
            if [t for t, _ in work_of] != drawn or any(e != everyone for _, e in work_of):
                raise RuntimeError(f"the simulation trained or evaluated other clients: {work_of}")
            bare.append([bare_round(pool, sizes, t, everyone) for t in drawn])
    figures: dict[str, Any] = {
        "algo": args.algo, "clients": args.clients, "fraction": args.fraction,
        "epochs": args.epochs, "workers": args.workers, "rounds_measured": len(drawn),
        "state_dir": args.state_dir,
    }  # fmt: skip
    report = []
    for index, (setting, config, results, cpu, wall) in enumerate(runs):
        rows = [row(r, a, b) for r, a, b in
                zip(results["rounds"][1:], bare[index], bare[index + 1], strict=True)]  # fmt: skip
        print_table(args, rows, config_text(config), setting)
        measured_s = sum(r["sim_train_s"] + r["sim_eval_s"] for r in rows)
        print_cpu("the whole simulated run", cpu.by_role(), wall)
        in_rounds = cpu.by_role(measured_s)
        print_cpu(f"the measured rounds (the last {measured_s:.1f} s of the actors' life)",
                  in_rounds, measured_s)  # fmt: skip
        around = sum(s for role, s in in_rounds.items() if role != "client actor")
        scheduling = scheduling_figures(cpu.actor_scheduling(measured_s), bare[index : index + 2])
        these = {**summary(rows), "cpu_outside_actors_cores": f"{around / measured_s:.3f}",
                 **scheduling}  # fmt: skip
        print_scheduling(these)
        prefix = "" if len(runs) == 1 else f"run{index + 1}_"
        figures |= {prefix + key: value for key, value in these.items()}
        report.append({"setting": setting, "rows": rows, "summary": these,
                       "cpu_in_measured_rounds": in_rounds})  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"runs": report, "summary": figures}, indent=2) + "\n")
    print("round_limit: " + " ".join(f"{k}={v}" for k, v in figures.items()), flush=True)


def row(simulated_round: dict[str, Any], first: dict, second: dict) -> dict[str, float]:
    """One round's figures. A record's ``client_compute_seconds`` holds both phases'
    client work; its ``eval_compute_seconds`` is the evaluation's part, so the training's
    is the difference: that, and only that, is set against the bare training."""
    bare = {k: (first[k] + second[k]) / 2 for k in first}
    sim_wall = simulated_round["train_seconds"] + simulated_round["eval_seconds"]
    limit = bare["train_wall_s"] + bare["eval_wall_s"]
    compute, handler = (
        simulated_round["client_compute_seconds"],
        simulated_round["client_handler_seconds"],
    )
    eval_compute = simulated_round["eval_compute_seconds"]
    return {
        "round": simulated_round["round"],
        "samples": bare["train_samples"],
        "sim_train_s": simulated_round["train_seconds"],
        "sim_train_compute_s": compute - eval_compute,
        "sim_eval_compute_s": eval_compute,
        "sim_client_handler_s": handler,
        "sim_eval_s": simulated_round["eval_seconds"],
        "sim_client_setup_s": simulated_round.get("client_setup_seconds", 0.0),
        "sim_client_state_s": simulated_round.get("client_state_seconds", 0.0),
        "bare_train_s": bare["train_wall_s"],
        "bare_client_s": bare["train_client_s"],
        "bare_eval_s": bare["eval_wall_s"],
        "bare_eval_client_s": bare["eval_client_s"],
        "bare_passes_differ": abs(first["train_wall_s"] - second["train_wall_s"])
        / max(bare["train_wall_s"], 1e-9),
        "sim_over_bare": bare["train_client_s"] / (compute - eval_compute),
        "eval_sim_over_bare": bare["eval_client_s"] / eval_compute
        if eval_compute
        else float("nan"),
        "beyond_compute_share": (handler - compute) / handler,
        "train_over_limit": simulated_round["train_seconds"] / bare["train_wall_s"],
        "eval_over_limit": (
            simulated_round["eval_seconds"] / bare["eval_wall_s"]
            if bare["eval_wall_s"]
            else float("nan")
        ),  # fmt: skip
        "round_over_limit": sim_wall / limit,
        "sim_round_s": sim_wall,
        "state_share": simulated_round.get("client_state_seconds", 0.0) / handler,
        "setup_share": simulated_round.get("client_setup_seconds", 0.0) / handler,
    }


def print_table(
    args: argparse.Namespace, rows: list[dict], run_config: str, setting: dict[str, str]
) -> None:
    shown = ",".join(f"{k}={v}" for k, v in setting.items()) or "the defaults"
    print(f"\n{args.algo}, {args.clients} clients, fraction {args.fraction}, E = {args.epochs}, "
          f"{args.workers} actors / workers of one thread, setting: {shown}; "
          f"run config: {run_config}")  # fmt: skip
    print(
        "round | samples | sim train s | Σ train compute s | Σ eval compute s | Σ handler s "
        "| Σ setup s | Σ state s | bare train s | Σ bare s | sim eval s | bare eval s "
        "| sim/bare | round/limit"
    )
    for r in rows:
        print(
            f"{r['round']:5d} | {r['samples']:7.0f} | {r['sim_train_s']:11.1f} | "
            f"{r['sim_train_compute_s']:17.1f} | {r['sim_eval_compute_s']:16.1f} | "
            f"{r['sim_client_handler_s']:11.1f} | "
            f"{r['sim_client_setup_s']:9.2f} | {r['sim_client_state_s']:9.2f} | "
            f"{r['bare_train_s']:12.1f} | {r['bare_client_s']:8.1f} | {r['sim_eval_s']:10.1f} | "
            f"{r['bare_eval_s']:11.1f} | {r['sim_over_bare']:8.3f} | {r['round_over_limit']:.3f}"
        )


def print_cpu(what: str, by_role: dict[str, float], wall: float) -> None:
    """Where the simulation's CPU time went, by role."""
    total = sum(by_role.values())
    print(f"CPU seconds over {what}: {wall:.1f} s wall, {total:.1f} s CPU")
    for role, seconds in sorted(by_role.items(), key=lambda item: -item[1]):
        print(f"  {role:40s} {seconds:8.1f} s  {100 * seconds / total:5.1f}%  "
              f"{seconds / wall:5.2f} cores")  # fmt: skip


def scheduling_figures(
    actors: tuple[float, float, int], bare_passes: list[list[dict]]
) -> dict[str, str]:
    """How the kernel treated the training: per CPU second, how often the client actors'
    main threads (over the measured rounds, evaluation included) and the bare workers
    (over their training, in the passes beside the run) were preempted, and the share of
    their runnable time spent waiting for a CPU."""
    on_cpu, waiting, preempted = actors
    bare = [sum(r[key] for passes in bare_passes for r in passes)
            for key in ("train_on_cpu_s", "train_waiting_s", "train_preempted")]  # fmt: skip
    return {
        "actor_preempted_per_cpu_s": f"{preempted / max(on_cpu, 1e-9):.1f}",
        "bare_preempted_per_cpu_s": f"{bare[2] / max(bare[0], 1e-9):.1f}",
        "actor_waiting_share": f"{waiting / max(on_cpu + waiting, 1e-9):.3f}",
        "bare_waiting_share": f"{bare[1] / max(bare[0] + bare[1], 1e-9):.3f}",
    }


def print_scheduling(figures: dict[str, str]) -> None:
    print(
        "Scheduling of the training threads: preempted per CPU second "
        f"{figures['actor_preempted_per_cpu_s']} (actors) / "
        f"{figures['bare_preempted_per_cpu_s']} (bare workers); waiting for a CPU "
        f"{figures['actor_waiting_share']} / {figures['bare_waiting_share']} of their "
        "runnable time"
    )


def summary(rows: list[dict]) -> dict[str, Any]:
    """Medians of the per-round figures: a round that a stall outside the run slowed
    (a shared machine) moves a median little and a sum a lot."""

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    return {
        "sim_over_bare": f"{median('sim_over_bare'):.3f}",
        "eval_sim_over_bare": f"{median('eval_sim_over_bare'):.3f}",
        "beyond_compute_share_of_handler": f"{median('beyond_compute_share'):.4f}",
        "train_over_limit": f"{median('train_over_limit'):.3f}",
        "eval_over_limit": f"{median('eval_over_limit'):.3f}",
        "round_over_limit": f"{median('round_over_limit'):.3f}",
        "state_share_of_handler": f"{median('state_share'):.4f}",
        "setup_share_of_handler": f"{median('setup_share'):.4f}",
        "bare_passes_differ_max": f"{max(r['bare_passes_differ'] for r in rows):.3f}",
        "s_per_round": f"{median('sim_round_s'):.1f}",
    }


if __name__ == "__main__":
    main()
