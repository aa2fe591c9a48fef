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

``--graphs`` replays each step as one captured CUDA graph (the batch copied into static
inputs; every batch is full with ``drop-last``), to see how much of a step is the launch
of its few dozen small kernels rather than their work.

Ends with ``gpu_processes: procs=... graphs=... steps_per_s=... per_process=...``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from collections.abc import Callable

import torch
from torch.nn import functional as F  # noqa: N812

from fedreg_app.core.data import DatasetInfo, normalise
from fedreg_app.core.models import build_model
from fedreg_app.core.training import MomentumSGD, use_deterministic_cuda


def eager_step(model: torch.nn.Module, optimizer: MomentumSGD) -> Callable:
    """The step as the project's training loop runs it."""

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(normalise(x)), y).backward()
        optimizer.step()

    return step


def graph_step(model: torch.nn.Module, optimizer: MomentumSGD, batch: int) -> Callable:
    """The same step captured once as a CUDA graph (after warm-up steps on a side stream,
    so that the momentum buffers exist), replayed on each batch copied into its inputs."""
    device = torch.device("cuda")
    static_x = torch.zeros(batch, 1, 28, 28, dtype=torch.uint8, device=device)
    static_y = torch.zeros(batch, dtype=torch.long, device=device)
    eager = eager_step(model, optimizer)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            eager(static_x, static_y)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad()  # the gradients are then the graph's own tensors
    with torch.cuda.graph(graph):
        F.cross_entropy(model(normalise(static_x)), static_y).backward()
        optimizer.step()

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        static_x.copy_(x, non_blocking=True)
        static_y.copy_(y, non_blocking=True)
        graph.replay()

    return step


def train(steps: int, batch: int, graphs: bool, start: mp.Barrier, seconds: mp.Queue) -> None:
    """One process: warm up, wait for the others, then time ``steps`` steps."""
    use_deterministic_cuda()
    device = torch.device("cuda")
    model = build_model(DatasetInfo(10, 1, 28, 28), 1, seed=0).to(device)
    optimizer = MomentumSGD(list(model.parameters()), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (batch * 50, 1, 28, 28), dtype=torch.uint8,
                           generator=generator)  # fmt: skip
    labels = torch.randint(0, 10, (batch * 50,), generator=generator)
    one_step = graph_step(model, optimizer, batch) if graphs else eager_step(model, optimizer)

    def step(index: int) -> None:
        at = (index % 50) * batch
        one_step(images[at : at + batch].to(device), labels[at : at + batch].to(device))

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
    parser.add_argument("--graphs", action="store_true", help="replay each step as a CUDA graph")
    args = parser.parse_args()
    context = mp.get_context("spawn")
    start, seconds = context.Barrier(args.procs), context.Queue()
    work = (args.steps, args.batch, args.graphs, start, seconds)
    workers = [context.Process(target=train, args=work) for _ in range(args.procs)]
    for worker in workers:
        worker.start()
    times = [seconds.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join()
    slowest = max(times)
    total_rate = args.procs * args.steps / slowest
    print(f"{args.procs} processes x {args.steps} steps at batch {args.batch}: "
          f"slowest {slowest:.2f} s, fastest {min(times):.2f} s")  # fmt: skip
    print(f"gpu_processes: procs={args.procs} graphs={int(args.graphs)} steps={args.steps} "
          f"batch={args.batch} "
          f"steps_per_s={total_rate:.0f} per_process={total_rate / args.procs:.0f} "
          f"device={torch.cuda.get_device_name()!r}")  # fmt: skip


if __name__ == "__main__":
    main()
