"""What one device needs: peak memory and seconds per round of one SuperNode's client
process, limited to one core, in the FedReG paper's testbed setting (Fashion-MNIST,
30 clients' partitions, Dirichlet 0.1).

In deployment a SuperNode starts a fresh ``flwr-clientapp`` process for every message.
This benchmark does the same thing without the network: for every round it starts a fresh
Python process pinned to one core (``taskset -c 0``, one torch thread) that runs this
app's real ClientApp handlers (``fedreg_app.client_app.train`` / ``evaluate``) on one
message, with the node's ``state-dir`` on disk (decoded partition, rebalanced set and
private head are kept there, as on a device). Each process reports its wall time, the
handler's own time and its peak resident memory (``ru_maxrss``). Flower's transport
(polling, message transfer) comes on top; see ``benchmarks/simulation.py``.

    python benchmarks/device_client.py --dataset-path ../shared/data/fashion_mnist
    python benchmarks/device_client.py --dataset-path ... --model mlp --head-depth 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROUND_KEYS = ("process_s", "handler_s", "peak_rss_mib")


def worker(args: argparse.Namespace) -> None:
    """One message in this process, as ``flwr-clientapp`` would handle it."""
    started = time.perf_counter()
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fedreg_app import client_app
    from fedreg_app.core.persist import load_arrays
    from fedreg_app.core.protocol import ARRAYS, CONFIG, SERVER_ROUND, STATE_KEY
    from fedreg_app.core.records import to_record

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    arrays: ArrayRecord = to_record(load_arrays(Path(args.arrays)))
    config = ConfigRecord({SERVER_ROUND: args.round, STATE_KEY: "device-benchmark"})
    kind = MessageType.TRAIN if args.phase == "train" else MessageType.EVALUATE
    message = Message(RecordDict({ARRAYS: arrays, CONFIG: config}), message_type=kind,
                      dst_node_id=1)  # fmt: skip
    context = Context(
        run_id=1, node_id=1, node_config=json.loads(args.node_config), state=RecordDict(),
        run_config=json.loads(args.run_config),
    )  # fmt: skip
    handler = client_app.train if args.phase == "train" else client_app.evaluate
    handled = time.perf_counter()
    handler(message, context)
    done = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"process_s": done - started, "handler_s": done - handled,
                      "peak_rss_mib": peak}))  # fmt: skip


def spawn(args: argparse.Namespace, phase: str, server_round: int, extra: list[str]) -> dict:
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}  # fmt: skip
    command = [*pin, sys.executable, __file__, "--worker", "--phase", phase,
               "--round", str(server_round), *extra]  # fmt: skip
    started = time.perf_counter()
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    figures["process_s"] = time.perf_counter() - started  # with interpreter start-up
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--phase", default="train", help=argparse.SUPPRESS)
    parser.add_argument("--round", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--arrays", help=argparse.SUPPRESS)
    parser.add_argument("--node-config", help=argparse.SUPPRESS)
    parser.add_argument("--run-config", help=argparse.SUPPRESS)
    parser.add_argument("--dataset-path", required=False)
    parser.add_argument("--algo", default="fedreg")
    parser.add_argument("--model", default="convnet")
    parser.add_argument("--head-depth", default="auto",  # "auto": the algorithm's split
                        type=lambda text: text if text == "auto" else int(text))  # fmt: skip
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--partition", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    from fedreg_app.core.data import PartitionKey, load_info
    from fedreg_app.core.models import BASE, HEAD_G, build_model
    from fedreg_app.core.persist import save_arrays
    from fedreg_app.registry import load_config

    run_config = {"algo": args.algo, "model": args.model, "head-depth": args.head_depth,
                  "local-epochs": args.local_epochs, "dataset-path": args.dataset_path or "",
                  "fraction-train": 0.2}  # fmt: skip
    config = load_config(run_config)
    info = load_info(PartitionKey.from_config(config, args.clients))
    work = Path(tempfile.mkdtemp(prefix="device_client_"))
    arrays_path = work / "global.npz"
    model = build_model(info, config.head_depth, config.seed, model=config.model)
    save_arrays(arrays_path, model.group_state(BASE, HEAD_G))
    node = {"partition-id": args.partition, "num-partitions": args.clients,
            "state-dir": str(work / "state")}  # fmt: skip
    extra = ["--arrays", str(arrays_path), "--node-config", json.dumps(node),
             "--run-config", json.dumps(config.to_run_config())]  # fmt: skip
    rounds = []
    for server_round in range(1, args.rounds + 1):
        rounds.append({phase: spawn(args, phase, server_round, extra)
                       for phase in ("train", "evaluate")})  # fmt: skip
        print(f"round {server_round}: " + " | ".join(
            f"{phase} {f['process_s']:.1f}s (handler {f['handler_s']:.1f}s, "
            f"peak {f['peak_rss_mib']:.0f} MiB)" for phase, f in rounds[-1].items()
        ), flush=True)  # fmt: skip
    later = rounds[1:] or rounds
    summary = {
        "setting": {
            **run_config,
            "clients": args.clients,
            "partition": args.partition,
            "threads": 1,
            "pinned": bool(shutil.which("taskset")),
        },  # fmt: skip
        "first_round_s": sum(f["process_s"] for f in rounds[0].values()),
        "seconds_per_round": statistics.median(
            sum(f["process_s"] for f in r.values()) for r in later
        ),
        "handler_seconds_per_round": statistics.median(
            sum(f["handler_s"] for f in r.values()) for r in later
        ),
        "peak_rss_mib": max(f["peak_rss_mib"] for r in rounds for f in r.values()),
        "rounds": rounds,
    }
    print(
        f"{args.algo} / {args.model}, partition {args.partition} of {args.clients}, one core: "
        f"{summary['seconds_per_round']:.1f} s per round (train + evaluate processes; "
        f"{summary['handler_seconds_per_round']:.1f} s in the handlers), first round "
        f"{summary['first_round_s']:.1f} s (decodes and caches), peak "
        f"{summary['peak_rss_mib']:.0f} MiB per client process"
    )
    print("rerun: python benchmarks/device_client.py --dataset-path PATH "
          f"--algo {args.algo} --model {args.model} --head-depth {config.head_depth}")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    print(
        f"device_client: algo={args.algo} model={args.model} head_depth={config.head_depth} "
        f"s_per_round={summary['seconds_per_round']:.2f} "
        f"handler_s_per_round={summary['handler_seconds_per_round']:.2f} "
        f"first_round_s={summary['first_round_s']:.2f} peak_rss_mib={summary['peak_rss_mib']:.0f}"
    )


if __name__ == "__main__":
    main()
