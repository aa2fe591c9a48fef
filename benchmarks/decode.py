"""Decoding a dataset's partitions into tensors, the row-by-row way (*before*) and
``_to_tensors``'s (*now*), in one invocation, interleaved (before, now, before, now, ...)
so that a drifting machine shows.

*Before*: the image column fetched lazily and iterated row by row, and every image
converted to the wanted mode, even one already in it; the labels read through numpy
from the lazy column, row by row. *Now*: ``fedreg_app.core.data``'s ``_to_tensors`` (each
column read in one slice, the labels too, no conversion where the mode is already
right). Both decode every partition's train split of one partitioning; the
pixels and labels must be identical. Every client decodes its partition this way once,
and the ServerApp (and ``fedreg-experiment``, before it resumes a run) decodes them all
for their content digests.

    python benchmarks/decode.py --dataset-path ../shared/data/fashion_mnist --clients 50
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

import numpy as np
import torch
from PIL import Image

from fedreg_app.core.data import PartitionKey, TensorData, _to_tensors, client_splits, load_info
from fedreg_app.registry import load_config


def decode_before(ds, channels: int) -> TensorData:
    """The decoding as it was: lazy columns iterated, every image converted."""
    from datasets import Image as ImageFeature

    raw = ds.cast_column("image", ImageFeature(decode=False))["image"]
    images = [Image.open(io.BytesIO(item["bytes"])) for item in raw]
    mode = "L" if channels == 1 else "RGB"
    pixels = np.stack([np.asarray(img.convert(mode), dtype=np.uint8) for img in images])
    pixels = pixels[:, None, :, :] if pixels.ndim == 3 else pixels.transpose(0, 3, 1, 2)
    labels = torch.as_tensor(np.asarray(ds["label"], dtype=np.int64))
    return TensorData(x=torch.from_numpy(np.ascontiguousarray(pixels)), y=labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset-path", required=True)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    config = load_config({"dataset-path": args.dataset_path, "alpha": args.alpha})
    key = PartitionKey.from_config(config, args.clients)
    channels = load_info(key).channels
    splits = [client_splits(key, p)["train"] for p in range(args.clients)]
    images = sum(len(s) for s in splits)
    times: dict[str, list[float]] = {"before": [], "now": []}
    decoded: dict[str, list[TensorData]] = {}
    for _ in range(args.repeats):
        for name, decode in (("before", decode_before), ("now", _to_tensors)):
            started = time.perf_counter()
            decoded[name] = [decode(split, channels) for split in splits]
            times[name].append(time.perf_counter() - started)
    identical = all(
        torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
        for a, b in zip(*decoded.values(), strict=True)
    )
    before, now = (statistics.median(times[k]) for k in ("before", "now"))
    for name, values in times.items():
        print(f"{name}: " + " ".join(f"{v:.2f}s" for v in values))
    same = str(identical).lower()
    print(f"decode: images={images} clients={args.clients} before_s={before:.2f} "
          f"now_s={now:.2f} speedup={before / now:.2f} identical={same}")  # fmt: skip


if __name__ == "__main__":
    main()
