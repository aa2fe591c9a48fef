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
    if len(raw) < 4 + 4 * dims:
        raise ValueError(f"{path}: {len(raw)} bytes, shorter than an IDX header (truncated?)")
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
    """Write ``target/train.parquet`` and ``target/test.parquet``; returns their paths.
    Both parts are read and checked before either file is written, and each is written
    under a temporary name and renamed: a failure leaves the target as it was, never a
    new ``train.parquet`` beside an old ``test.parquet``."""
    if split not in EMNIST_SPLITS:
        raise ValueError(f"split={split!r} is not allowed: expected one of {EMNIST_SPLITS}")
    parts = {part: read_part(source, split, part) for part in ("train", "test")}
    target.mkdir(parents=True, exist_ok=True)
    staged: dict[str, Path] = {}
    try:
        for part, (images, labels) in parts.items():
            names = class_names(source, split, labels)
            staged[part] = write_part(images, labels, names, target, part)
    except BaseException:
        for partial in [*staged.values(), *(target / f".{p}.parquet.partial" for p in parts)]:
            partial.unlink(missing_ok=True)
        raise
    written = []
    for part, temporary in staged.items():
        path = target / f"{part}.parquet"
        temporary.replace(path)
        written.append(path)
    return written


def read_part(source: Path, split: str, part: str) -> tuple[np.ndarray, np.ndarray]:
    """One part's images and labels (0-based), checked to match each other and the
    mapping file's classes."""
    images_path = find_file(source, f"emnist-{split}-{part}-images-idx3-ubyte")
    labels_path = find_file(source, f"emnist-{split}-{part}-labels-idx1-ubyte")
    images, labels = read_idx(images_path, 3), read_idx(labels_path, 1)
    if len(images) != len(labels):
        raise ValueError(f"{images_path} holds {len(images)} images but {labels_path} "
                         f"{len(labels)} labels")  # fmt: skip
    labels = labels.astype(np.int64) - (1 if split == "letters" else 0)  # letters: 1..26
    names = class_names(source, split, labels)
    if labels.size and not 0 <= labels.min() <= labels.max() < len(names):
        raise ValueError(f"{labels_path}: labels {labels.min()}..{labels.max()} but the "
                         f"mapping names {len(names)} classes")  # fmt: skip
    return images, labels


def write_part(
    images: np.ndarray, labels: np.ndarray, names: list[str], target: Path, part: str
) -> Path:
    """The part as parquet under a temporary name in ``target`` (renamed by the caller)."""
    from datasets import ClassLabel, Dataset, Features
    from datasets import Image as ImageFeature
    from PIL import Image

    features = Features({"image": ImageFeature(), "label": ClassLabel(names=names)})
    encoded = []
    for pixels in images:
        buffer = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(pixels.T), mode="L").save(buffer, "PNG")
        encoded.append({"bytes": buffer.getvalue(), "path": None})
    table = Dataset.from_dict({"image": encoded, "label": labels.tolist()}, features=features)
    temporary = target / f".{part}.parquet.partial"
    table.to_parquet(str(temporary))
    return temporary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedreg-data", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    emnist = commands.add_parser("emnist", help="NIST EMNIST IDX files -> hub-layout parquet")
    emnist.add_argument("source", type=Path, help="folder with the emnist-<split>-* files")
    emnist.add_argument("target", type=Path, help="folder to write train/test.parquet to")
    emnist.add_argument("--split", default="balanced", choices=EMNIST_SPLITS)
    args = parser.parse_args(argv)
    try:
        written = convert_emnist(args.source, args.target, args.split)
    except (ValueError, OSError) as err:  # a damaged or missing file: named, nothing written
        parser.error(str(err))
    for path in written:
        print(f"wrote {path}")
    print(f"use it with: --run-config \"dataset-path='{args.target}'\"")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
