"""The recent methods beside their reference implementations: PFLlib's code (the authors'
own for FedALA, FedCP, FedDBE and FedAS) and ours, on the same work.

The work, alike for every algorithm: this project's partition of the dataset (Dirichlet
``alpha``, ``--clients`` clients, the 75/25 split of each), PFLlib's FedAvgCNN with the
same initial weights (``model='fedavgcnn'``, the head at its ``fc``: ``head-depth = 1``),
one local epoch of plain SGD at batch 10, the clients of our seeded draw (all of them at
``--fraction 1``), every client evaluated after every round. Each algorithm's own
hyperparameters are this project's defaults, handed to PFLlib under its names; where
PFLlib's ``main.py`` wraps the model in ``BaseHeadSplit`` for an algorithm, so does the
worker.

| ours | PFLlib | PFLlib's arguments, from our keys |
|---|---|---|
| fedavg | FedAvg | - |
| fedavg-ft | none (FedAvg shown beside it) | - |
| fedala | FedALA | eta, rand_percent <- ala-eta, ala-sample-percent; layer_idx <- (*) |
| fedas | FedAS | none: clientas.py fixes the alignment at lr 0.01, 1 epoch (= fedas-align-*) |
| fedcp | FedCP | lamda <- fedcp-lambda; its policy network starts from our initial one |
| feddbe | FedDBE | kl_weight, momentum <- feddbe-kappa, feddbe-momentum |

(*) the parameter tensors of the top ``ala-layers`` layers: PFLlib counts tensors, a
Linear layer is two (weight, bias).

Rounds. PFLlib evaluates at the start of each iteration (iteration 0: the initial models)
and then trains; here its accuracy after round r is its evaluation at iteration r, and its
round r's seconds are iteration r - 1's (an evaluation, with its training-loss pass, and a
training). Ours: ``results.json``'s ``personal_accuracy`` and ``global_accuracy`` after
round r, ``train_seconds + eval_seconds``. Seconds per round are medians of rounds 2..N.
FedDBE: PFLlib trains every client once before iteration 0 (the pass its global mean comes
from; the training itself is thrown away), shown as set-up seconds; ours makes round 1
that pass (``strategies/feddbe.py``), so it has one DBE round fewer at each round.

    python benchmarks/vs_reference.py --dataset-path ../shared/data/fashion_mnist \\
        --pfllib /tmp/pfllib --pfllib-python /tmp/pflvenv/bin/python --rounds 20

``--pfllib``: a PFLlib clone (its ``system/`` is imported; PFLlib needs ``h5py``,
``scikit-learn`` and ``matplotlib`` beside torch). An algorithm whose PFLlib run fails is
reported with the last lines of its traceback, and the others go on.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import random
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
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

PFLLIB_DATASET = "FashionMNIST_vs_reference"
ALGORITHMS = ("fedavg", "fedavg-ft", "fedala", "fedas", "fedcp", "feddbe")
#: The PFLlib algorithm each of ours is compared with.
REFERENCE = {
    "fedavg": "FedAvg",
    "fedavg-ft": "FedAvg",  # PFLlib has no FedAvg-FT: its FedAvg stands beside ours
    "fedala": "FedALA",
    "fedas": "FedAS",
    "fedcp": "FedCP",
    "feddbe": "FedDBE",
}
#: PFLlib's server class of each algorithm: module under ``system/``, class.
SERVERS = {
    "FedAvg": ("flcore.servers.serveravg", "FedAvg"),
    "FedALA": ("flcore.servers.serverala", "FedALA"),
    "FedAS": ("flcore.servers.serveras", "FedAS"),
    "FedCP": ("flcore.servers.servercp", "FedCP"),
    "FedDBE": ("flcore.servers.serverdbe", "FedDBE"),
}
#: The algorithms PFLlib's ``main.py`` runs on ``BaseHeadSplit(model, model.fc)``.
HEAD_SPLIT = {"FedAS", "FedCP", "FedDBE"}
#: PFLlib's fixed FedAS alignment (``clientas.py`` ``set_parameters``): lr, epochs.
FEDAS_ALIGNMENT = (0.01, 1)
#: A gap in final personal accuracy (points) that the report flags.
FLAG_POINTS = 2.0


# ------------------------------------------------------------------ the work, written out
def prepare(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Our partition, initial weights (and FedCP's initial policy network) and client draw,
    written for PFLlib; the spec its workers read."""
    from fedreg_app.core.data import PartitionKey, load_client_data, load_info
    from fedreg_app.core.models import build_model
    from fedreg_app.registry import load_config
    from strategies.base import sample_size

    config = load_config(shared_config(args, "fedavg", args.seed, folder / "unused"))
    key = PartitionKey.from_config(config, args.clients)
    info = load_info(key)
    clients = [load_client_data(key, i) for i in range(args.clients)]
    write_pfllib_dataset(clients, folder / "pfllib", PFLLIB_DATASET)
    model = build_model(info, 1, config.seed, model="fedavgcnn")
    save_weights(folder / "initial.npz", model.parameters())
    save_weights(folder / "cpn.npz", initial_policy_network(info, config.seed).parameters())
    return {
        "dataset": PFLLIB_DATASET,
        "seed": args.seed,
        "rounds": args.rounds,
        "clients": args.clients,
        "per_round": sample_size(args.clients, args.fraction),
        "lr": args.lr,
        "batch_size": args.batch_size,
        "threads": args.threads,
        # one draw more than rounds: PFLlib's loop runs global_rounds + 1 iterations
        "schedule": client_schedule(config.seed, args.clients, args.fraction, args.rounds + 1),
        "channels": info.channels,
        "height": info.height,
        "width": info.width,
        "num_classes": info.num_classes,
        "folder": str(folder),
        "pfllib": str(Path(args.pfllib).resolve()),
        "train_samples": [len(c.train) for c in clients],
        "reference": reference_arguments(args, model),
    }


def initial_policy_network(info: Any, seed: int) -> Any:
    """FedCP's CPN as our runs start it (``clients.fedcp.attach_fedcp_modules``)."""
    from clients.fedcp import CPN, attach_fedcp_modules
    from fedreg_app.core.models import build_model

    model = build_model(info, 1, seed, private_head=True, model="fedavgcnn")
    attach_fedcp_modules(model, seed)
    return model.extra[CPN]


def our_options(args: argparse.Namespace, algo: str, kind: type) -> Any:
    """The options our run of ``algo`` uses: its defaults, through the config loader."""
    from fedreg_app.registry import load_config

    config = load_config(shared_config(args, algo, args.seed, Path("unused")))
    return config.options_as(kind)


def reference_arguments(args: argparse.Namespace, model: Any) -> dict[str, dict[str, Any]]:
    """PFLlib's arguments for each algorithm, from our options (see the module's table)."""
    from clients.fedala import FedALAOptions, merge_layers
    from clients.fedas import FedASOptions
    from clients.fedcp import FedCPOptions
    from clients.feddbe import FedDBEOptions

    ala = our_options(args, "fedala", FedALAOptions)
    fedas = our_options(args, "fedas", FedASOptions)
    if (fedas.align_lr, fedas.align_epochs) != FEDAS_ALIGNMENT:
        print(f"WARNING: our FedAS alignment (lr {fedas.align_lr}, {fedas.align_epochs} "
              f"epochs) is not PFLlib's fixed {FEDAS_ALIGNMENT}")  # fmt: skip
    dbe = our_options(args, "feddbe", FedDBEOptions)
    return {
        "FedALA": {
            "eta": ala.eta,
            "rand_percent": ala.sample_percent,
            "layer_idx": len(merge_layers(model, ala.layers)),
        },
        "FedCP": {"lamda": our_options(args, "fedcp", FedCPOptions).lam},
        "FedDBE": {"kl_weight": dbe.kappa, "momentum": dbe.momentum},
    }


# ------------------------------------------------------------------ this project
def run_ours(link: Any, args: argparse.Namespace, algo: str, spec: dict[str, Any]) -> dict:
    """Our run of ``algo`` through the launcher; its per-round figures, or the error."""
    from fedreg_tools.launcher import config_text

    results_dir = Path(spec["folder"]) / f"ours-{algo}"
    config = shared_config(args, algo, args.seed, results_dir)
    log = link.run(
        config_text(config), supernodes=args.clients, cpus_per_client=1, timeout=WORKER_TIMEOUT
    )
    paths = sorted(results_dir.glob("*/results.json"))
    document = json.loads(paths[-1].read_text()) if paths else {}
    if document.get("run", {}).get("status") != "completed":
        return {"error": "\n".join(log.strip().splitlines()[-15:]) or "no results.json"}
    rounds = document["rounds"]
    sampled = [r["sampled_clients"] for r in rounds]
    if sampled != spec["schedule"][: len(rounds)]:
        print(f"WARNING: our {algo} sampled {sampled}, PFLlib was given {spec['schedule']}")
    return {
        "personal": [r["personal_accuracy"] for r in rounds],
        "global": [r["global_accuracy"] for r in rounds],
        "round_s": [r["train_seconds"] + r["eval_seconds"] for r in rounds],
        "eval_s": [r["eval_seconds"] for r in rounds],
    }


# ------------------------------------------------------------------ PFLlib (worker)
def seed_all(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def reference_model(spec: dict[str, Any], algorithm: str) -> Any:
    """PFLlib's FedAvgCNN with our initial weights, wrapped as its ``main.py`` wraps it
    for ``algorithm`` (``BaseHeadSplit`` with ``model.fc`` as the head)."""
    from torch import nn

    model = fedavgcnn(spec)
    load_weights(model, Path(spec["folder"]) / "initial.npz")
    if algorithm not in HEAD_SPLIT:
        return model
    from flcore.trainmodel.models import BaseHeadSplit

    head = copy.deepcopy(model.fc)
    model.fc = nn.Identity()
    return BaseHeadSplit(model, head)


def load_policy_network(server: Any, spec: dict[str, Any]) -> None:
    """FedCP: every client's policy network (``gate.cs``) from our initial CPN, whose
    layers are the same (Linear, LayerNorm, ReLU)."""
    for client in server.clients:
        load_weights(client.model.gate.cs, Path(spec["folder"]) / "cpn.npz")


def train_through(server: Any, rounds: int) -> str:
    """PFLlib's ``train()``. An error after every evaluation was made (its bookkeeping at
    the end) keeps the results and is returned; an earlier one is raised."""
    try:
        server.train()
    except Exception:
        if len(server.rs_test_acc) < rounds + 1:
            raise
        return traceback.format_exc().strip().splitlines()[-1]
    return ""


def reference_worker(spec: dict[str, Any], algorithm: str) -> dict[str, Any]:
    """PFLlib's own server and clients for ``algorithm``; we give it its arguments, our
    initial weights and our client draw, and time its rounds and evaluation passes."""
    import torch

    use_pfllib(spec)
    seed_all(spec["seed"])
    from flcore.servers import serverbase  # noqa: I001 - PFLlib's modules

    module, name = SERVERS[algorithm]
    server_class = getattr(importlib.import_module(module), name)
    model = reference_model(spec, algorithm)
    extra = spec["reference"].get(algorithm, {})
    args = pfllib_namespace(spec, algorithm, model, goal="vs_reference", **extra)
    timings: dict[str, list[float]] = {"test_metrics": [], "train_metrics": []}
    time_evaluation(serverbase.Server, timings)
    started = time.perf_counter()
    server = server_class(args, 0)
    setup_s = time.perf_counter() - started
    use_our_draw(server, spec)
    if algorithm == "FedCP":
        load_policy_network(server, spec)
    seed_all(spec["seed"])  # each PFLlib client seeds torch with 0 as it is built
    ended_with = train_through(server, spec["rounds"])
    return {
        "accuracy": [float(a) for a in server.rs_test_acc],
        "round_s": list(server.Budget),
        "test_s": timings["test_metrics"],
        "train_loss_s": timings["train_metrics"],
        "setup_s": setup_s,
        "ended_with": ended_with,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def worker_main(args: argparse.Namespace) -> None:
    spec = json.loads(Path(args.spec).read_text())
    try:
        result = reference_worker(spec, args.worker)
    except Exception:
        traceback.print_exc()
        sys.exit(1)
    Path(args.out).write_text(json.dumps(result))


# ------------------------------------------------------------------ report
@dataclass
class Side:
    """One framework's run of one algorithm, aligned: entry r - 1 is round r."""

    label: str
    personal: list[float]
    global_: list[float] | None
    round_s: list[float]
    eval_s: list[float]
    setup_s: float | None = None
    note: str = ""


def reference_side(label: str, run: dict[str, Any], rounds: int) -> Side:
    """PFLlib's iteration r's evaluation is the model after round r; its round r's time is
    iteration r - 1's."""
    test_s, loss_s = run["test_s"], run["train_loss_s"]
    eval_s = [t + (loss_s[i] if i < len(loss_s) else 0.0) for i, t in enumerate(test_s)]
    note = f"PFLlib's train() ended with {run['ended_with']}" if run["ended_with"] else ""
    return Side(
        label=label,
        personal=run["accuracy"][1 : rounds + 1],
        global_=None,
        round_s=run["round_s"][:rounds],
        eval_s=eval_s[:rounds],
        setup_s=run["setup_s"],
        note=note,
    )


def our_side(label: str, run: dict[str, Any]) -> Side:
    return Side(label, run["personal"], run["global"], run["round_s"], run["eval_s"])


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}"


def best_and_final(values: list[float] | None) -> tuple[str, str]:
    """'best (round)' and final, in percent."""
    if not values:
        return "-", "-"
    top = max(range(len(values)), key=lambda i: values[i])
    return f"{pct(values[top])} (r{top + 1})", pct(values[-1])


def side_row(side: Side) -> str:
    personal_best, personal_final = best_and_final(side.personal)
    global_best, global_final = best_and_final(side.global_)
    setup = "-" if side.setup_s is None else f"{side.setup_s:.1f}"
    return (f"| {side.label} | {personal_best} | {personal_final} | {global_best} "
            f"| {global_final} | {median(steady(side.round_s)):.1f} "
            f"| {median(steady(side.eval_s)):.1f} | {setup} |")  # fmt: skip


def algorithm_section(algo: str, sides: list[Side], errors: dict[str, str]) -> list[str]:
    """The Markdown table of one algorithm, its accuracy curves, notes and failures."""
    lines = [f"### {algo} (PFLlib {REFERENCE[algo]})", ""]
    if algo == "fedavg-ft":
        lines += ["PFLlib has no FedAvg-FT: its FedAvg stands beside ours.", ""]
    if sides:
        lines += [
            "| run | personal best (round) | personal final | global best (round) "
            "| global final | s/round | of which evaluation | set-up s |",
            "|---|---|---|---|---|---|---|---|",
            *(side_row(side) for side in sides),
            "",
        ]
    for side in sides:
        curve = ", ".join(pct(a) for a in side.personal)
        lines.append(f"- {side.label}, personal accuracy after rounds 1..N: {curve}")
        if side.note:
            lines.append(f"- {side.label}: {side.note}")
    for label, error in errors.items():
        lines += [f"- {label} failed:", "", "```", error, "```"]
    return [*lines, ""]


def final(side: Side | None) -> float | None:
    return side.personal[-1] if side and side.personal else None


def summary(args: argparse.Namespace, results: dict[str, dict[str, Side]]) -> list[str]:
    """Final personal accuracies of both, and their gap, per algorithm."""
    lines = [
        "### Summary: final personal accuracy (%)",
        "",
        "| ours | PFLlib | PFLlib final | ours final | ours - PFLlib |",
        "|---|---|---|---|---|",
    ]
    for algo in args.algorithms:
        theirs, ours = final(results[algo].get("pfllib")), final(results[algo].get("ours"))
        gap = "-"
        if theirs is not None and ours is not None:
            points = 100 * (ours - theirs)
            gap = f"{points:+.2f}" + (" (!)" if abs(points) > FLAG_POINTS else "")
        lines.append(f"| {algo} | {REFERENCE[algo]} | {pct(theirs)} | {pct(ours)} | {gap} |")
    return [*lines, "", f"(!): a gap of more than {FLAG_POINTS:g} points.", ""]


def result_line(args: argparse.Namespace, results: dict[str, dict[str, Side]]) -> str:
    """``vs_reference: ...`` with the final personal accuracies (fractions)."""
    from importlib.metadata import version

    import torch

    parts = [f"rounds={args.rounds}", f"clients={args.clients}"]
    shown: set[str] = set()
    for algo in args.algorithms:
        reference = REFERENCE[algo]
        theirs, ours = final(results[algo].get("pfllib")), final(results[algo].get("ours"))
        if reference not in shown:
            shown.add(reference)
            parts.append(f"{reference.lower()}_pfllib=" + fraction(theirs))
        parts.append(f"{algo}_ours=" + fraction(ours))
    parts += [f"pfllib_commit={git_commit(args.pfllib)}", f"flwr={version('flwr')}",
              f"torch={torch.__version__}"]  # fmt: skip
    return "vs_reference: " + " ".join(parts)


def fraction(value: float | None) -> str:
    return "failed" if value is None else f"{value:.4f}"


def header(args: argparse.Namespace, spec: dict[str, Any]) -> list[str]:
    return [
        f"## vs_reference: {args.rounds} rounds, {args.clients} clients",
        "",
        f"FMNIST (data-fraction {args.data_fraction:g}), Dirichlet alpha {args.alpha:g}, "
        f"{spec['per_round']} clients a round, FedAvgCNN (head = fc), E = 1, batch "
        f"{args.batch_size}, lr {args.lr:g}, momentum 0, seed {args.seed}; every client "
        f"evaluated every round. PFLlib arguments: {spec['reference']}. Accuracy in %: "
        f"PFLlib's evaluate() figure; ours results.json. Seconds per round: medians of "
        f"rounds 2..{args.rounds}; PFLlib in one process with {args.threads} torch threads "
        "(its evaluation includes a training-loss pass, except FedCP's), ours one client "
        "process per core with one thread each.",
        "",
    ]


# ------------------------------------------------------------------ driver
def run_algorithm(
    algo: str, link: Any, args: argparse.Namespace, spec: dict[str, Any], spec_path: Path,
    references: dict[str, dict[str, Any]],
) -> tuple[dict[str, Side], dict[str, str]]:  # fmt: skip
    """PFLlib's run (once per PFLlib algorithm), then ours; the sides and the failures."""
    name = REFERENCE[algo]
    label = f"PFLlib {name}"
    if name not in references:
        started = time.perf_counter()
        cwd = Path(spec["folder"]) / "pfllib" / "system"
        references[name] = run_worker(Path(__file__), name, args.pfllib_python, spec_path, cwd)
        progress(label, references[name], started)
    started = time.perf_counter()
    ours = run_ours(link, args, algo, spec)
    progress(f"ours {algo}", ours, started)
    sides: dict[str, Side] = {}
    errors: dict[str, str] = {}
    if "error" in references[name]:
        errors[label] = references[name]["error"]
    else:
        sides["pfllib"] = reference_side(label, references[name], args.rounds)
    if "error" in ours:
        errors[f"ours {algo}"] = ours["error"]
    else:
        sides["ours"] = our_side(f"ours {algo}", ours)
    return sides, errors


def progress(label: str, run: dict[str, Any], started: float) -> None:
    seconds = time.perf_counter() - started
    state = "failed" if "error" in run else "done"
    print(f"{label}: {state} in {seconds:.0f} s", file=sys.stderr, flush=True)


def compare(args: argparse.Namespace) -> None:
    from fedreg_tools.launcher import HF_OFFLINE_ENV, LocalSuperLink

    results: dict[str, dict[str, Side]] = {}
    failures: dict[str, dict[str, str]] = {}
    references: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="vs_reference-") as tmp:
        folder = Path(tmp)
        spec = prepare(args, folder)
        spec_path = folder / "spec.json"
        spec_path.write_text(json.dumps(spec))
        with LocalSuperLink(folder / "home", extra_env=HF_OFFLINE_ENV) as link:
            for algo in args.algorithms:
                results[algo], failures[algo] = run_algorithm(
                    algo, link, args, spec, spec_path, references
                )
    lines = header(args, spec)
    for algo in args.algorithms:
        lines += algorithm_section(algo, list(results[algo].values()), failures[algo])
    lines += summary(args, results)
    print("\n".join(lines))
    print(result_line(args, results))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_work_arguments(parser, rounds=20, fraction=1.0, lr=0.005)
    parser.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of PFLlib's process (ours: one client process "
                             "per core, one thread each); 1, as on a shared machine "
                             "torch's threads wait on each other (batch 10: 30x slower "
                             "on 2)")  # fmt: skip
    parser.add_argument("--worker", choices=tuple(SERVERS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.worker:
        if not args.dataset_path:
            parser.error("--dataset-path is required")
        if not (Path(args.pfllib) / "system" / "flcore").is_dir():
            parser.error(f"--pfllib: not a PFLlib clone: {args.pfllib!r}")
        if args.rounds < 2:
            parser.error("--rounds must be >= 2 (round 1 is start-up)")
    return args


def main() -> None:
    args = parse_args()
    if args.worker:
        worker_main(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
