"""Side by side with peers: the same FedAvg work in PFLlib, in Apple's
pfl-research (``pfl``) and in this project, one after another in one invocation.

The work: PFLlib's FedAvgCNN (``model='fedavgcnn'`` here), this project's partition of the
dataset (Dirichlet ``alpha``, ``--clients`` clients, the 75/25 split of each), the same
initial weights, the same clients trained in every round (this project's seeded draw of
``fraction`` of the clients), one local epoch of plain SGD (no momentum) at batch 10, the
training replies averaged by sample count, and after every round the global model
evaluated on every client's test split. Each peer gets that partition written in its own
format in a temporary folder (PFLlib: ``dataset/<name>/{train,test}/<i>.npz``; pfl: user
datasets in memory); nothing is installed and nothing in the peer's folder is changed.

Order: every peer, then this project, ``--repeats`` times, then every peer once more, so
that each of our runs sits between two runs of each peer. Seconds per round are medians of
rounds 2..N (round 1 starts things up); the train/evaluation split is each framework's own
(PFLlib: its evaluation also computes the training loss over every client's training data,
shown apart; pfl: the central evaluation callback; ours: ``results.json``).

    python benchmarks/vs_peers.py --dataset-path ../shared/data/fashion_mnist \\
        --pfllib /tmp/pfllib --pfllib-python /tmp/pflvenv/bin/python \\
        --pfl-python /tmp/pflvenv/bin/python --rounds 5 --repeats 1

``--pfllib``: a PFLlib clone (its ``system/`` folder is imported; PFLlib needs ``h5py``,
``scikit-learn`` and ``matplotlib`` next to torch). ``--pfl-python``: an interpreter that
has ``pfl`` (and torch); pfl runs twice, as one process with all the threads, and in its
documented multi-process mode under ``torchrun`` (``--pfl-workers``, 2: the cohort and the
central evaluation sharded across the workers, the threads shared among them). A peer that
is not given, or cannot run, is skipped with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from pfllib_bridge import (
    WORKER_TIMEOUT,
    add_work_arguments,
    client_schedule,
    fedavgcnn,
    git_commit,
    load_weights,
    median,
    pfllib_namespace,
    run_worker,
    save_weights,
    shared_config,
    steady,
    time_evaluation,
    use_our_draw,
    use_pfllib,
    write_pfllib_dataset,
)

PFLLIB_DATASET = "FashionMNIST_vs_peers"


# ------------------------------------------------------------------ the work, written out
def prepare(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Our partition, initial weights and sampling schedule, written for the peers."""
    import numpy as np

    from fedreg_app.core.data import PartitionKey, load_client_data, load_info
    from fedreg_app.core.models import build_model
    from fedreg_app.registry import load_config
    from strategies.base import sample_size

    config = load_config(our_config(args, folder / "unused"))
    key = PartitionKey.from_config(config, args.clients)
    info = load_info(key)
    clients = [load_client_data(key, i) for i in range(args.clients)]

    write_pfllib_dataset(clients, folder / "pfllib", PFLLIB_DATASET)
    arrays: dict[str, np.ndarray] = {}
    for client in clients:
        for split in ("train", "test"):
            part = getattr(client, split)
            arrays[f"{split}_x_{client.partition_id}"] = part.x.numpy()
            arrays[f"{split}_y_{client.partition_id}"] = part.y.numpy()
    np.savez(folder / "clients.npz", **arrays)  # uint8 images, for pfl

    model = build_model(info, 1, config.seed, model="fedavgcnn")
    save_weights(folder / "initial.npz", model.parameters())
    # one more round than needed, for PFLlib's extra iteration
    schedule = client_schedule(config.seed, args.clients, args.fraction, args.rounds + 1)
    return {
        "dataset": PFLLIB_DATASET,
        "rounds": args.rounds,
        "clients": args.clients,
        "per_round": sample_size(args.clients, args.fraction),
        "lr": args.lr,
        "batch_size": args.batch_size,
        "threads": args.threads,
        "workers": args.pfl_workers,
        "schedule": schedule,
        "channels": info.channels,
        "height": info.height,
        "width": info.width,
        "num_classes": info.num_classes,
        "folder": str(folder),
        "pfllib": str(Path(args.pfllib).resolve()) if args.pfllib else "",
        "train_samples": [len(c.train) for c in clients],
        "test_samples": [len(c.test) for c in clients],
    }


def our_config(args: argparse.Namespace, results_dir: Path) -> dict[str, Any]:
    return shared_config(args, "fedavg", 0, results_dir)


# ------------------------------------------------------------------ this project
def run_ours(link: Any, args: argparse.Namespace, spec: dict[str, Any], index: int) -> dict:
    results_dir = Path(spec["folder"]) / f"ours-{index}"
    config = our_config(args, results_dir)
    from fedreg_tools.launcher import config_text

    log = link.run(
        config_text(config), supernodes=args.clients, cpus_per_client=1, timeout=WORKER_TIMEOUT
    )
    paths = sorted(results_dir.glob("*/results.json"))
    document = json.loads(paths[-1].read_text()) if paths else {}
    if document.get("run", {}).get("status") != "completed":
        raise RuntimeError(f"our run did not complete\n{log[-3000:]}")
    rounds = document["rounds"]
    sampled = [r["sampled_clients"] for r in rounds]
    if sampled != spec["schedule"][: len(rounds)]:
        print(f"WARNING: our run sampled {sampled}, the peers were given {spec['schedule']}")
    return {
        "round_s": [r["train_seconds"] + r["eval_seconds"] for r in rounds],
        "train_s": [r["train_seconds"] for r in rounds],
        "eval_s": [r["eval_seconds"] for r in rounds],
        "accuracy": [r["global_accuracy"] for r in rounds],
        "client_train_s": [queue_ordered(r.get("client_train_seconds") or {}) for r in rounds],
    }


def queue_ordered(seconds_by_client: dict[str, float]) -> list[float]:
    """A round's trained clients' handler seconds in the order Flower's simulation
    queues their messages: its node mapping's, which is partition order."""
    return [seconds for _, seconds in sorted((int(p), s) for p, s in seconds_by_client.items())]


def makespan(durations: list[float], actors: int) -> float:
    """When the last of ``durations`` ends, each handed in turn to the first actor free
    (Flower's simulation hands a queued message to the first free actor)."""
    free = [0.0] * max(1, actors)
    for duration in durations:
        first = free.index(min(free))
        free[first] += duration
    return max(free)


def actor_spread(client_train_s: list[list[float]], actors: int) -> dict[str, float]:
    """How a round's training fell on ``actors`` actors, from each client's measured
    seconds (rounds 2..N, medians): in the queue's order (partition order, as Flower's
    simulation queues them), largest first (as pfl shares a cohort out), and the floor of
    a perfect split (the sum over the actors, or the longest client); and per round, the
    queue order's end over largest first's."""
    steady_rounds = [d for d in client_train_s[1:] if d]
    if not steady_rounds:
        return {}
    queue = [makespan(d, actors) for d in steady_rounds]
    largest_first = [makespan(sorted(d, reverse=True), actors) for d in steady_rounds]
    return {
        "queue": median(queue),
        "largest_first": median(largest_first),
        "floor": median([max(max(d), sum(d) / actors) for d in steady_rounds]),
        "ratios": [round(q / f, 3) for q, f in zip(queue, largest_first, strict=True)],
    }


# ------------------------------------------------------------------ peers (subprocesses)
#: pfl in its documented multi-process mode: ``torchrun`` starts the workers, pfl shards
#: each cohort and the central evaluation across them (``torch.distributed``, gloo).
PFL_TORCHRUN = "pfl-torchrun"


def run_peer(name: str, python: str, spec_path: Path, cwd: Path) -> dict[str, Any]:
    """Run a worker of this script in the peer's interpreter; its JSON result or the error.
    ``pfl-torchrun``: pfl's worker under ``torchrun`` with the spec's ``workers``
    processes, each with its share of the threads; rank 0 reports."""
    if name != PFL_TORCHRUN:
        return run_worker(Path(__file__), name, python, spec_path, cwd)
    spec = json.loads(spec_path.read_text())
    workers = spec["workers"]
    shared = spec_path.with_name("spec-torchrun.json")
    shared.write_text(json.dumps({**spec, "threads": max(1, spec["threads"] // workers)}))
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={workers}"]
    return run_worker(Path(__file__), "pfl", python, shared, cwd, launcher=launcher)


def pfl_users_trained(folder: Path) -> list[list[int]]:
    """The users pfl's processes trained, per round (sorted), from the files each wrote."""
    rounds: dict[int, list[int]] = {}
    for path in sorted(folder.glob("pfl-users-*.json")):
        for iteration, user in json.loads(path.read_text()):
            rounds.setdefault(iteration, []).append(user)
    return [sorted(rounds[t]) for t in sorted(rounds)]


def load_initial(model: Any, folder: Path) -> None:
    """Copy our initial weights in, parameter by parameter (same order and shapes)."""
    load_weights(model, folder / "initial.npz")


def pfllib_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """PFLlib's own FedAvg server and clients (``flcore.servers.serveravg.FedAvg``) with
    its own FedAvgCNN; we only give it its arguments, our initial weights and the clients
    to sample, and time its two evaluation passes."""
    import numpy as np
    import torch

    use_pfllib(spec)
    torch.manual_seed(0)  # as PFLlib's main.py
    np.random.seed(0)
    from flcore.servers import serverbase  # noqa: I001 - PFLlib's modules
    from flcore.servers.serveravg import FedAvg

    model = fedavgcnn(spec)
    load_initial(model, Path(spec["folder"]))
    args = pfllib_namespace(spec, "FedAvg", model, goal="vs_peers")
    timings: dict[str, list[float]] = {"test_metrics": [], "train_metrics": []}
    time_evaluation(serverbase.Server, timings)
    server = FedAvg(args, 0)
    use_our_draw(server, spec)
    server.train()
    # Iteration i evaluates the model after i rounds, then trains round i + 1.
    return {
        "round_s": list(server.Budget),
        "test_s": timings["test_metrics"],
        "train_loss_s": timings["train_metrics"],
        "accuracy": [float(a) for a in server.rs_test_acc],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def pfl_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """pfl's ``FederatedAveraging`` in its ``SimulatedBackend``, PyTorch model, users from
    our partition in memory, samples weighted by count (``WeightByDatapoints``), the
    global model evaluated centrally on the union of the clients' test splits."""
    from importlib.metadata import version

    import numpy as np
    import torch
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.callback.central_evaluation import CentralEvaluationCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.metrics import Metrics, Weighted, get_overall_value
    from pfl.model.pytorch import PyTorchModel
    from torch import nn

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    side = ((spec["height"] - 4) // 2 - 4) // 2

    class FedAvgCNN(nn.Module):
        """PFLlib's FedAvgCNN, with the ``loss`` and ``metrics`` pfl calls."""

        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.Sequential(
                nn.Conv2d(spec["channels"], 32, 5), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                nn.Linear(64 * side * side, 512), nn.ReLU(),
                nn.Linear(512, spec["num_classes"]),
            )  # fmt: skip

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layers(x)

        def loss(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> torch.Tensor:  # noqa: A002
            self.eval() if eval else self.train()
            return nn.functional.cross_entropy(self(x), y)

        @torch.no_grad()
        def metrics(self, x: torch.Tensor, y: torch.Tensor, eval: bool = True) -> dict:  # noqa: A002
            self.eval()
            correct = (self(x).argmax(1) == y).sum().item()
            return {"accuracy": Weighted(correct, len(y))}

    data = np.load(Path(spec["folder"]) / "clients.npz")

    def tensors(split: str, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.from_numpy(data[f"{split}_x_{i}"]).float().div_(127.5).sub_(1.0)
        return x, torch.from_numpy(data[f"{split}_y_{i}"])

    users = {i: tensors("train", i) for i in range(spec["clients"])}
    tests = [tensors("test", i) for i in range(spec["clients"])]
    union = Dataset((torch.cat([x for x, _ in tests]), torch.cat([y for _, y in tests])))
    # The users in the schedule's order. With the weights, pfl's workers take each cohort
    # as the next cohort-size users of this sequence and share it out by weight (largest
    # first, to the least loaded worker: its documented balancing); without them, each of
    # a worker's draws would consume one user per worker and the workers would train other
    # users than the schedule's. Its sampler prefetches, so the sequence is padded.
    flat = [i for chosen in spec["schedule"] for i in chosen]
    order = iter(flat)
    iteration = [0]
    trained: list[list[int]] = []  # (iteration, user) that this process trained

    def user_dataset(i: int) -> Dataset:
        trained.append([iteration[0], int(i)])
        return Dataset(users[i], user_id=str(i))

    training = FederatedDataset(
        user_dataset,
        lambda: next(order, flat[-1]),
        user_id_to_weight={i: len(users[i][1]) for i in users},
    )

    timing = {"eval": [], "ends": []}
    accuracy: list[float] = []

    class TimedCentralEvaluation(CentralEvaluationCallback):
        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):  # noqa: ANN001, ANN201
            start = time.perf_counter()
            stop, metrics = super().after_central_iteration(
                aggregate_metrics, model, central_iteration=central_iteration
            )
            timing["eval"].append(time.perf_counter() - start)
            for name, value in metrics:
                if "accuracy" in str(name):
                    accuracy.append(float(get_overall_value(value)))
            return stop, metrics

    class IterationClock(TrainingProcessCallback):
        def on_train_begin(self, *, model):  # noqa: ANN001, ANN201
            timing["ends"].append(time.perf_counter())
            return super().on_train_begin(model=model)

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):  # noqa: ANN001, ANN201
            timing["ends"].append(time.perf_counter())
            iteration[0] += 1
            return False, Metrics()

    net = FedAvgCNN()
    load_initial(net, Path(spec["folder"]))
    model = PyTorchModel(
        model=net,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0),
    )
    rounds = spec["rounds"]
    algorithm_params = NNAlgorithmParams(
        central_num_iterations=rounds,
        # Federated evaluation of the training users (before and after their local
        # training, on their training data) only at iteration 0; every round's evaluation
        # is the central one below.
        evaluation_frequency=rounds + 1,
        train_cohort_size=spec["per_round"],
        val_cohort_size=0,
    )
    train_params = NNTrainHyperParams(
        local_num_epochs=1, local_learning_rate=spec["lr"], local_batch_size=spec["batch_size"]
    )
    # ours evaluates in batches of CPU_EVAL_BATCH_PER_THREAD (fedreg_app.core.training) = 128
    # per thread; this process may run in pfl's own environment, without the app
    eval_batch = 128 * torch.get_num_threads()
    eval_params = NNEvalHyperParams(local_batch_size=eval_batch)
    backend = SimulatedBackend(
        training_data=training, val_data=training, postprocessors=[WeightByDatapoints()]
    )
    callbacks = [TimedCentralEvaluation(union, model_eval_params=eval_params), IterationClock()]
    FederatedAveraging().run(
        algorithm_params=algorithm_params,
        backend=backend,
        model=model,
        model_train_params=train_params,
        model_eval_params=eval_params,
        callbacks=callbacks,
    )
    rank = int(os.environ.get("RANK", "0"))
    (Path(spec["folder"]) / f"pfl-users-{rank}.json").write_text(json.dumps(trained))
    ends = timing["ends"]
    return {
        "round_s": [b - a for a, b in zip(ends, ends[1:], strict=False)],
        "eval_s": timing["eval"],
        "accuracy": accuracy,
        "torch": torch.__version__,
        "pfl": version("pfl"),
        "threads": torch.get_num_threads(),
    }


def worker_main(args: argparse.Namespace) -> None:
    spec = json.loads(Path(args.spec).read_text())
    try:
        result = {"pfllib": pfllib_worker, "pfl": pfl_worker}[args.worker](spec)
    except Exception:
        traceback.print_exc()
        sys.exit(1)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, rank 0 reports
        result["workers"] = int(os.environ.get("WORLD_SIZE", "1"))
        Path(args.out).write_text(json.dumps(result))


# ------------------------------------------------------------------ report
def summarise(name: str, run: dict[str, Any], rounds: int) -> dict[str, Any]:
    """Per-round figures, aligned: round r (r >= 1) = training round r and the evaluation
    of the model it produced. PFLlib evaluates at the start of an iteration, so its round
    r's seconds are iteration r - 1's (evaluation of the round r - 1 model + training of
    round r) and its accuracy after round r is the evaluation at iteration r."""
    if name == "pfllib":
        round_s = run["round_s"][:rounds]
        test_s, loss_s = run["test_s"][:rounds], run["train_loss_s"][:rounds]
        eval_s = [t + loss for t, loss in zip(test_s, loss_s, strict=True)]
        accuracy = run["accuracy"][1 : rounds + 1]
    else:
        round_s, eval_s, accuracy = run["round_s"], run["eval_s"], run["accuracy"]
        loss_s = []
        if name in ("pfl", PFL_TORCHRUN):  # its central evaluation skips iteration 0
            accuracy = [None, *accuracy]
    train_s = [r - e for r, e in zip(round_s, eval_s, strict=True)]
    return {
        "s": median(steady(round_s)),
        "train": median(steady(train_s)),
        "eval": median(steady(eval_s)),
        "train_loss": median(steady(loss_s)) if loss_s else None,
        "first": round_s[0],
        "accuracy": accuracy,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_work_arguments(parser, rounds=5, fraction=0.25, lr=0.01)
    parser.add_argument("--pfl-python", default="", help="an interpreter that has pfl")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch threads of a peer's single process (ours: one client "
                             "process per core, one thread each)")  # fmt: skip
    parser.add_argument("--pfl-workers", type=int, default=2,
                        help="also run pfl under torchrun with this many worker "
                             "processes, sharing the threads (1: one process)")  # fmt: skip
    parser.add_argument("--worker", choices=("pfllib", "pfl"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(args)
        return
    if not args.dataset_path:
        parser.error("--dataset-path is required")
    if args.rounds < 2:
        parser.error("--rounds must be >= 2 (round 1 is start-up)")
    compare(args)


def peer_versions(args: argparse.Namespace) -> dict[str, str]:
    return {"pfllib_commit": git_commit(args.pfllib)}


def compare(args: argparse.Namespace) -> None:
    from importlib.metadata import version

    import torch

    from fedreg_tools.launcher import HF_OFFLINE_ENV, LocalSuperLink

    peers = []
    skipped: dict[str, str] = {}
    if args.pfllib and (Path(args.pfllib) / "system" / "flcore").is_dir():
        peers.append(("pfllib", args.pfllib_python))
    else:
        skipped["pfllib"] = (
            f"not a PFLlib clone: {args.pfllib!r}" if args.pfllib else "--pfllib not given"
        )
    if args.pfl_python:
        peers.append(("pfl", args.pfl_python))
        if args.pfl_workers > 1:
            peers.append((PFL_TORCHRUN, args.pfl_python))
    else:
        skipped["pfl"] = "--pfl-python not given"
    runs: dict[str, list[dict[str, Any]]] = {"ours": []}
    with tempfile.TemporaryDirectory(prefix="vs_peers-") as tmp:
        folder = Path(tmp)
        started = time.perf_counter()
        spec = prepare(args, folder)
        spec_path = folder / "spec.json"
        spec_path.write_text(json.dumps(spec))
        print(f"partition and formats written in {time.perf_counter() - started:.0f} s; "
              f"train samples per client {spec['train_samples']}; schedule "
              f"{spec['schedule'][: args.rounds]}", flush=True)  # fmt: skip

        def peer(name: str, python: str) -> None:
            if name in skipped:
                return
            started = time.perf_counter()
            for stale in folder.glob("pfl-users-*.json"):
                stale.unlink()
            result = run_peer(name, python, spec_path, folder / "pfllib" / "system")
            if name in ("pfl", PFL_TORCHRUN) and "error" not in result:
                expected = [sorted(chosen) for chosen in spec["schedule"][: args.rounds]]
                if pfl_users_trained(folder) != expected:
                    print(f"WARNING: {name} trained {pfl_users_trained(folder)}, the "
                          f"schedule is {expected}", flush=True)  # fmt: skip
            if "error" in result:
                skipped[name] = result["error"]
                print(f"{name}: cannot run, skipped:\n{result['error']}", flush=True)
                return
            runs.setdefault(name, []).append(result)
            seconds = [round(s, 1) for s in result["round_s"]]
            print(f"{name} run {len(runs[name])}: {time.perf_counter() - started:.0f} s, "
                  f"s per iteration {seconds}", flush=True)  # fmt: skip

        home = folder / "home"
        with LocalSuperLink(home, extra_env=HF_OFFLINE_ENV) as link:
            for repeat in range(args.repeats):
                for name, python in peers:
                    peer(name, python)
                started = time.perf_counter()
                runs["ours"].append(run_ours(link, args, spec, repeat))
                seconds = [round(s, 1) for s in runs["ours"][-1]["round_s"]]
                print(f"ours run {repeat + 1}: {time.perf_counter() - started:.0f} s, "
                      f"s per round {seconds}", flush=True)  # fmt: skip
            for name, python in peers:
                peer(name, python)
    report(args, runs, skipped, version("flwr"), torch.__version__)


def report(args: argparse.Namespace, runs: dict[str, list], skipped: dict[str, str],
           flwr: str, torch_version: str) -> None:  # fmt: skip
    rows = {name: [summarise(name, r, args.rounds) for r in found] for name, found in runs.items()}
    print()
    print(f"FedAvg, FedAvgCNN, {args.clients} clients, {args.fraction:g} a round, E=1, batch "
          f"{args.batch_size}, lr {args.lr}, all clients evaluated every round; "
          f"seconds per round: medians of rounds 2..{args.rounds}")  # fmt: skip
    print(
        "| framework | run | s/round | training | evaluation | of which train-loss pass "
        "| round 1 | global accuracy after rounds 1..N |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, found in rows.items():
        for i, row in enumerate(found, 1):
            loss = "-" if row["train_loss"] is None else f"{row['train_loss']:.1f}"
            accuracy = ", ".join("-" if a is None else f"{100 * a:.1f}" for a in row["accuracy"])
            print(f"| {name} | {i} | {row['s']:.2f} | {row['train']:.2f} | {row['eval']:.2f} "
                  f"| {loss} | {row['first']:.1f} | {accuracy} |")  # fmt: skip
    for name, reason in skipped.items():
        print(f"{name}: skipped: {reason.splitlines()[-1] if reason else ''}")
    actors = len(os.sched_getaffinity(0))  # Ray's actors: one a core (client CPUs 1)
    spreads = [actor_spread(r["client_train_s"], actors) for r in runs["ours"]]
    spreads = [spread for spread in spreads if spread]
    for i, spread in enumerate(spreads, 1):
        print(
            f"ours run {i}, the clients' training on {actors} actors (measured seconds, "
            f"medians of rounds 2..N): queue order {spread['queue']:.2f} s, largest "
            f"first {spread['largest_first']:.2f} s, perfect split {spread['floor']:.2f} s; "
            f"queue order over largest first per round {spread['ratios']}"
        )
    ours = statistics.mean(r["s"] for r in rows["ours"]) if rows["ours"] else float("nan")
    parts = [f"rounds={args.rounds}", f"clients={args.clients}", f"ours_s={ours:.2f}"]
    for name in ("pfllib", "pfl", PFL_TORCHRUN):
        if name == PFL_TORCHRUN and name not in rows and args.pfl_workers <= 1:
            continue
        if rows.get(name):
            theirs = statistics.mean(r["s"] for r in rows[name])
            key = name.replace("-", "_")
            parts += [f"{key}_s={theirs:.2f}", f"ratio_{key}={ours / theirs:.2f}"]
            if name == "pfllib":
                extra = statistics.mean(r["train_loss"] for r in rows[name])
                parts.append(f"ratio_pfllib_without_train_loss={ours / (theirs - extra):.2f}")
        else:
            parts.append(f"{name.replace('-', '_')}=skipped")
    if spreads:
        queue = statistics.mean(spread["queue"] for spread in spreads)
        largest = statistics.mean(spread["largest_first"] for spread in spreads)
        parts += [f"ours_train_queue_s={queue:.2f}", f"ours_train_largest_first_s={largest:.2f}"]
    versions = peer_versions(args)
    pfl_version = runs["pfl"][0]["pfl"] if runs.get("pfl") else "none"
    peer_torch = {r["torch"] for found in runs.values() for r in found if "torch" in r}
    if peer_torch - {torch_version}:
        print(f"WARNING: the peers ran torch {sorted(peer_torch)}, we ran {torch_version}")
    parts += [f"pfllib_commit={versions['pfllib_commit']}", f"pfl={pfl_version}",
              f"flwr={flwr}", f"torch={torch_version}"]  # fmt: skip
    print("vs_peers: " + " ".join(parts))


if __name__ == "__main__":
    main()
