"""Whether ``cuda-graphs = true`` trains as the eager loop does, and how much faster.

A full-scale round waits for its largest client (Table 2 FMNIST, balanced partition:
6,545 samples, 4,908 to train on, about 1,200 steps at batch 20 over 5 epochs), whose
steps run one after the other. This trains that much data on a FedReG-shaped ConvNet
(base, global and private head; momentum SGD with buffers kept from an earlier call, as
a client's persistent optimizer) through ``train_epochs`` twice: eagerly, then with
``cuda_graphs=True`` (each step captured once and replayed), from the same weights and
the same shuffles, and compares the weights bit for bit. Then it times both, interleaved
(eager, graphed, eager, graphed, ...), and reports the ratio::

    python benchmarks/cuda_graphs.py                     # on the GPU (default cuda)
    python benchmarks/cuda_graphs.py --device cpu --samples 400 --epochs 1   # a dry run

On the CPU both calls run the eager loop (the key applies only on CUDA): identical, and a
ratio of about 1. Ends with ``cuda_graphs: device=... identical=... max_abs_diff=...
eager_steps_per_s=... graphed_steps_per_s=... speedup=...``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.nn import functional as F  # noqa: N812

from fedreg_app.core.data import DatasetInfo, TensorData
from fedreg_app.core.models import build_model
from fedreg_app.core.training import MomentumSGD, train_epochs, use_deterministic_cuda


def train_once(
    data: TensorData, epochs: int, batch: int, device: torch.device, graphs: bool
) -> tuple[dict[str, torch.Tensor], float, int]:
    """Weights after ``epochs`` of FedReG's step 1 shape (base + private head trained,
    through the frozen global head), the seconds it took, and the steps taken."""
    model = build_model(DatasetInfo(10, 1, 28, 28), 2, seed=0, private_head=True).to(device)
    moving = [p for n, p in model.named_parameters() if not n.startswith("head_g")]
    buffers = [torch.full_like(p, 1e-3) for p in moving]
    optimizer = MomentumSGD(moving, lr=0.01, momentum=0.9, buffers=buffers)

    def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        features = model.base(x)
        return F.cross_entropy(model.head_g(features) + model.head_p(features), y)

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    processed = train_epochs(
        model, moving, loss_fn, data, epochs=epochs, batch_size=batch, lr=0.01,
        momentum=0.9, generator=torch.Generator().manual_seed(7), device=device,
        optimizer=optimizer, drop_last=True, cuda_graphs=graphs,
    )  # fmt: skip
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - began
    weights = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return weights, seconds, processed // batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--samples", type=int, default=4908)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3, help="timed pairs, interleaved")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        use_deterministic_cuda()
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (args.samples, 1, 28, 28), dtype=torch.uint8,
                           generator=generator)  # fmt: skip
    data = TensorData(images, torch.randint(0, 10, (args.samples,), generator=generator))
    run = (data, args.epochs, args.batch, device)
    eager, _, steps = train_once(*run, graphs=False)
    graphed, _, graphed_steps = train_once(*run, graphs=True)
    assert steps == graphed_steps, (steps, graphed_steps)
    identical = all(torch.equal(eager[k], graphed[k]) for k in eager)
    max_diff = max(float((eager[k].float() - graphed[k].float()).abs().max()) for k in eager)
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for graphs in (False, True):
            times[graphs].append(train_once(*run, graphs=graphs)[1])
    eager_rate = steps / statistics.median(times[False])
    graphed_rate = steps / statistics.median(times[True])
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{steps} steps at batch {args.batch} ({args.samples} samples, {args.epochs} "
          f"epochs); seconds eager {times[False]}, graphed {times[True]}")  # fmt: skip
    print(
        f"cuda_graphs: device={name!r} identical={str(identical).lower()} "
        f"max_abs_diff={max_diff:.3g} eager_steps_per_s={eager_rate:.0f} "
        f"graphed_steps_per_s={graphed_rate:.0f} speedup={graphed_rate / eager_rate:.2f}"
    )


if __name__ == "__main__":
    main()
