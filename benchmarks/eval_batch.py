"""Forward-pass speed of evaluation at several batch sizes, for every model, on the CPU,
and how far the logits (and predictions) move from batch 512's. Why the CPU default is
128 samples per thread rather than 512 (``fedreg_app.core.training.eval_batch_size``).

The sizes are timed in turns (all sizes once, then again, ``--repeats`` times), so a
machine that drifts slows every size alike; the figure is each size's median time
against 512's.

    python benchmarks/eval_batch.py --threads 1

``--pool``: the models with 2x2 max-pooling, evaluated with this project's pooling layer
(``MaxPool2x2``) and with ``torch.nn.MaxPool2d`` in its place, timed in turns at the CPU's
default batch; the logits must be bit-identical.

    python benchmarks/eval_batch.py --pool --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedreg_app.core.data import TEXT, DatasetInfo
from fedreg_app.core.models import build_model, with_torch_max_pool
from fedreg_app.core.training import CPU_EVAL_BATCH_PER_THREAD

CASES = [  # (model, input shape and classes, samples)
    ("cnn", DatasetInfo(10, 1, 28, 28), 2048),
    ("cnn", DatasetInfo(10, 3, 32, 32), 1024),
    ("fedavgcnn", DatasetInfo(10, 3, 32, 32), 2048),
    ("convnet", DatasetInfo(100, 3, 32, 32), 1024),
    ("mlp", DatasetInfo(10, 1, 28, 28), 4096),
    ("charlstm", DatasetInfo(80, 1, 1, 80, TEXT), 512),
]
SIZES = (64, 128, 256, 512)


def inputs(info: DatasetInfo, n: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    if info.modality == TEXT:
        return torch.randint(0, info.num_classes, (n, info.width), generator=generator)
    return torch.randn(n, info.channels, info.height, info.width, generator=generator)


def forward(model: torch.nn.Module, x: torch.Tensor, size: int) -> torch.Tensor:
    with torch.inference_mode():
        return torch.cat([model(x[i : i + size]) for i in range(0, len(x), size)])


def measure(name: str, info: DatasetInfo, n: int, repeats: int) -> tuple[dict, float, int]:
    """Each size's speed-up over 512, the largest logit difference from 512's at any size
    (0.0: bit-identical), and how many predicted classes differ from 512's."""
    model = build_model(info, 1, seed=0, model=name).eval()
    x = inputs(info, n)
    reference = forward(model, x, 512)
    outputs = [forward(model, x, size) for size in SIZES]
    max_diff = max((out - reference).abs().max().item() for out in outputs)
    flipped = sum(int((out.argmax(1) != reference.argmax(1)).sum()) for out in outputs)
    seconds: dict[int, list[float]] = {size: [] for size in SIZES}
    for _ in range(repeats):
        for size in SIZES:
            start = time.perf_counter()
            forward(model, x, size)
            seconds[size].append(time.perf_counter() - start)
    medians = {size: statistics.median(times) for size, times in seconds.items()}
    return {size: medians[512] / medians[size] for size in SIZES}, max_diff, flipped


def measure_pool(name: str, info: DatasetInfo, n: int, repeats: int, size: int) -> tuple:
    """Our pooling's speed-up over torch's (median of the turns), and whether the logits
    are bit-identical."""
    ours = build_model(info, 1, seed=0, model=name).eval()
    reference = with_torch_max_pool(build_model(info, 1, seed=0, model=name).eval())
    x = inputs(info, n)
    identical = torch.equal(forward(ours, x, size), forward(reference, x, size))
    seconds: dict[str, list[float]] = {"torch": [], "ours": []}
    for _ in range(repeats):
        for label, model in (("torch", reference), ("ours", ours)):
            start = time.perf_counter()
            forward(model, x, size)
            seconds[label].append(time.perf_counter() - start)
    medians = {label: statistics.median(times) for label, times in seconds.items()}
    return medians["torch"] / medians["ours"], medians, identical


def pool_main(args: argparse.Namespace) -> None:
    size = CPU_EVAL_BATCH_PER_THREAD * args.threads
    summary, all_identical = [], True
    for name, info, n in CASES:
        if name not in POOLED:
            continue
        speedup, medians, identical = measure_pool(name, info, n, args.repeats, size)
        shape = f"{info.channels}x{info.height}x{info.width}"
        print(
            f"{name:9s} {shape:8s} b{size}: torch's MaxPool2d {medians['torch'] * 1e3:.0f} ms, "
            f"MaxPool2x2 {medians['ours'] * 1e3:.0f} ms, {speedup:.2f}x, "
            f"logits bit-identical: {identical}",
            flush=True,
        )
        summary.append(f"{name}_{shape}={speedup:.2f}x")
        all_identical &= identical
    print(
        f"eval_batch: pool threads={args.threads} repeats={args.repeats} batch={size} "
        + " ".join(summary)
        + f" identical={all_identical}"
    )


POOLED = ("cnn", "fedavgcnn", "convnet")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pool", action="store_true",
                        help="our pooling layer against torch's, in turns")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.pool:
        pool_main(args)
        return
    summary = []
    worst = 0.0
    for name, info, n in CASES:
        speedups, max_diff, flipped = measure(name, info, n, args.repeats)
        shape = f"{info.channels}x{info.height}x{info.width}"
        figures = " ".join(f"b{size}={speedups[size]:.2f}x" for size in SIZES)
        print(
            f"{name:9s} {shape:8s} {figures} max logit diff vs b512: {max_diff:.1e}, "
            f"predictions changed: {flipped}",
            flush=True,
        )
        summary.append(f"{name}_{shape}_b128={speedups[128]:.2f}x")
        worst = max(worst, max_diff)
    print(
        f"eval_batch: threads={args.threads} repeats={args.repeats} "
        + " ".join(summary)
        + f" max_logit_diff={worst:.1e}"
    )


if __name__ == "__main__":
    main()
