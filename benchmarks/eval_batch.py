"""Forward-pass speed of evaluation at several batch sizes, for every model, on the CPU,
and how far the logits (and predictions) move from batch 512's. Why the CPU default is
128 samples per thread rather than 512 (``fedreg_app.training.eval_batch_size``).

The sizes are timed in turns (all sizes once, then again, ``--repeats`` times), so a
machine that drifts slows every size alike; the figure is each size's median time
against 512's.

    python benchmarks/eval_batch.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedreg_app.data import TEXT, DatasetInfo
from fedreg_app.models import build_model

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
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
