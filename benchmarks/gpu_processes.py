"""How fast a GPU trains when several client processes share it, as Ray's client actors do.

A Table 2 round on one GPU trains ten clients at once, each in its own process, each
step a handful of small kernels (the ConvNet at batch 10). Without NVIDIA's Multi-Process
Service (MPS) the GPU switches between the processes' contexts instead of running their
kernels side by side. This script times the same training steps in ``--procs`` processes
at once (FedAvg's step: the whole model, momentum SGD, cross entropy on random uint8
images normalised per batch, the project's own model and optimizer), so that the rate
with and without MPS (``nvidia-cuda-mps-control -d`` started before it) can be compared
on one machine, one after the other::

    python benchmarks/gpu_processes.py --procs 1 --steps 600
    python benchmarks/gpu_processes.py --procs 10 --steps 600

Ends with ``gpu_processes: procs=... steps_per_s=... per_process=...``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import torch
from torch.nn import functional as F  # noqa: N812

from fedreg_app.data import DatasetInfo, normalise
from fedreg_app.models import build_model
from fedreg_app.training import MomentumSGD, use_deterministic_cuda


def train(steps: int, batch: int, start: mp.Barrier, seconds: mp.Queue) -> None:
    """One process: warm up, wait for the others, then time ``steps`` steps."""
    use_deterministic_cuda()
    device = torch.device("cuda")
    model = build_model(DatasetInfo(10, 1, 28, 28), 1, seed=0).to(device)
    optimizer = MomentumSGD(list(model.parameters()), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (batch * 50, 1, 28, 28), dtype=torch.uint8,
                           generator=generator)  # fmt: skip
    labels = torch.randint(0, 10, (batch * 50,), generator=generator)

    def step(index: int) -> None:
        at = (index % 50) * batch
        x = normalise(images[at : at + batch].to(device))
        y = labels[at : at + batch].to(device)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    for index in range(20):
        step(index)
    torch.cuda.synchronize()
    start.wait()
    began = time.perf_counter()
    for index in range(steps):
        step(index)
    torch.cuda.synchronize()
    seconds.put(time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--procs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=10)
    args = parser.parse_args()
    context = mp.get_context("spawn")
    start, seconds = context.Barrier(args.procs), context.Queue()
    workers = [context.Process(target=train, args=(args.steps, args.batch, start, seconds))
               for _ in range(args.procs)]  # fmt: skip
    for worker in workers:
        worker.start()
    times = [seconds.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join()
    slowest = max(times)
    total_rate = args.procs * args.steps / slowest
    print(f"{args.procs} processes x {args.steps} steps at batch {args.batch}: "
          f"slowest {slowest:.2f} s, fastest {min(times):.2f} s")  # fmt: skip
    print(f"gpu_processes: procs={args.procs} steps={args.steps} batch={args.batch} "
          f"steps_per_s={total_rate:.0f} per_process={total_rate / args.procs:.0f} "
          f"device={torch.cuda.get_device_name()!r}")  # fmt: skip


if __name__ == "__main__":
    main()
