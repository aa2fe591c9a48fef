"""Turn NIST's EMNIST release (IDX files) into the hub layout the app reads.

The Hub has EMNIST Letters as parquet (``tanganke/emnist_letters``), but not every split:
Balanced (47 classes), ByClass, ByMerge and Digits come as NIST's gzip IDX files
(``emnist-<split>-train-images-idx3-ubyte.gz`` and so on, with
``emnist-<split>-mapping.txt``). This writes ``train.parquet`` and ``test.parquet`` with
an ``image`` (PNG) and a ``label`` (``ClassLabel`` named by the mapping's characters)
column, for ``dataset-path``::

    fedreg-data emnist /path/to/gzip emnist_balanced --split balanced

NIST stores each image transposed; they are written upright.
"""

from __future__ import annotations

import argparse
import gzip
import io
from pathlib import Path

import numpy as np

EMNIST_SPLITS = ("balanced", "byclass", "bymerge", "digits", "letters", "mnist")
IDX_MAGIC = {1: 0x00000801, 3: 0x00000803}  # labels (1-D), images (3-D), unsigned bytes


def read_idx(path: Path, dims: int) -> np.ndarray:
    """An IDX file (gzip or plain) of unsigned bytes with ``dims`` dimensions."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        raw = handle.read()
    magic = int.from_bytes(raw[:4], "big")
    if magic != IDX_MAGIC[dims]:
        raise ValueError(f"{path}: not an IDX file of {dims} dimensions (magic {magic:#x})")
    shape = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path}: {data.size} values for shape {shape}")
    return data.reshape(shape)


def find_file(folder: Path, name: str) -> Path:
    for candidate in (folder / f"{name}.gz", folder / name):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{name}(.gz) not found in {folder}")


def class_names(folder: Path, split: str, labels: np.ndarray) -> list[str]:
    """The mapping file's characters (``label ascii-code`` per line), else the numbers.
    Letters' labels start at 1; the names then start at index 0 for label 1."""
    mapping = folder / f"emnist-{split}-mapping.txt"
    if not mapping.is_file():
        return [str(c) for c in range(int(labels.max()) + 1)]
    pairs = [line.split() for line in mapping.read_text().splitlines() if line.strip()]
    return [chr(int(code)) for _, code in sorted(pairs, key=lambda p: int(p[0]))]


def convert_emnist(source: Path, target: Path, split: str) -> list[Path]:
    """Write ``target/train.parquet`` and ``target/test.parquet``; returns their paths."""
    from datasets import ClassLabel, Dataset, Features
    from datasets import Image as ImageFeature
    from PIL import Image

    if split not in EMNIST_SPLITS:
        raise ValueError(f"split={split!r} is not allowed: expected one of {EMNIST_SPLITS}")
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for part in ("train", "test"):
        images = read_idx(find_file(source, f"emnist-{split}-{part}-images-idx3-ubyte"), 3)
        labels = read_idx(find_file(source, f"emnist-{split}-{part}-labels-idx1-ubyte"), 1)
        labels = labels.astype(np.int64) - (1 if split == "letters" else 0)  # letters: 1..26
        names = class_names(source, split, labels)
        features = Features({"image": ImageFeature(), "label": ClassLabel(names=names)})
        encoded = []
        for pixels in images:
            buffer = io.BytesIO()
            Image.fromarray(np.ascontiguousarray(pixels.T), mode="L").save(buffer, "PNG")
            encoded.append({"bytes": buffer.getvalue(), "path": None})
        table = Dataset.from_dict({"image": encoded, "label": labels.tolist()}, features=features)
        path = target / f"{part}.parquet"
        table.to_parquet(str(path))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedreg-data", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    emnist = commands.add_parser("emnist", help="NIST EMNIST IDX files -> hub-layout parquet")
    emnist.add_argument("source", type=Path, help="folder with the emnist-<split>-* files")
    emnist.add_argument("target", type=Path, help="folder to write train/test.parquet to")
    emnist.add_argument("--split", default="balanced", choices=EMNIST_SPLITS)
    args = parser.parse_args(argv)
    for path in convert_emnist(args.source, args.target, args.split):
        print(f"wrote {path}")
    print(f"use it with: --run-config \"dataset-path='{args.target}'\"")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
