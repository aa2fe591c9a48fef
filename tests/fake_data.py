"""Tiny generated datasets in Hugging Face hub layout, so tests never need a download or
``../shared``: images (train/test parquet files with ``Image`` and ``ClassLabel``
features) and next-character text (LEAF Shakespeare's ``character_id``, ``x``, ``y``).

Each image class draws a bright square at its own position on a noisy background:
learnable in a few steps, so end-to-end tests can check that accuracy rises above chance.
Each speaker of the text data repeats its own line, so the next character is predictable.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from datasets import ClassLabel, Dataset, Features, Value
from datasets import Image as ImageFeature
from PIL import Image


def class_image(label: int, rng: np.random.Generator, channels: int, size: int) -> Image.Image:
    pixels = rng.integers(0, 60, size=(size, size, channels), dtype=np.uint8)
    row, col = divmod(label, 4)
    top, left = 2 + row * (size // 5), 2 + col * (size // 5)
    pixels[top : top + size // 6, left : left + size // 6, :] = 230
    if channels == 1:
        return Image.fromarray(pixels[:, :, 0], mode="L")
    return Image.fromarray(pixels, mode="RGB")


def write_image_dataset(
    folder: Path,
    *,
    n_train: int = 300,
    n_test: int = 100,
    num_classes: int = 10,
    channels: int = 1,
    size: int = 28,
    image_column: str = "image",
    label_column: str = "label",
    seed: int = 0,
    second_split: str = "test",
    grey_every: int = 0,
    coarse_classes: int = 0,
) -> Path:
    """Write ``train.parquet`` and ``<second_split>.parquet`` into ``folder``; returns the
    folder. ``grey_every`` > 0 stores every n-th image in grey (Tiny-ImageNet mixes a few
    into its colour images); ``coarse_classes`` adds a ``coarse_label`` column (CIFAR-100)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    columns = {
        image_column: ImageFeature(),
        label_column: ClassLabel(names=[f"class{c}" for c in range(num_classes)]),
    }
    if coarse_classes:
        columns["coarse_label"] = ClassLabel(names=[f"super{c}" for c in range(coarse_classes)])
    features = Features(columns)
    for split, count in (("train", n_train), (second_split, n_test)):
        labels = rng.integers(0, num_classes, size=count)
        images = [class_image(int(c), rng, channels, size) for c in labels]
        if grey_every:
            images = [im.convert("L") if i % grey_every == 0 else im for i, im in enumerate(images)]
        data = {image_column: images, label_column: labels.tolist()}
        if coarse_classes:
            data["coarse_label"] = (labels % coarse_classes).tolist()
        Dataset.from_dict(data, features=features).to_parquet(str(folder / f"{split}.parquet"))
    return folder


SPEAKER_LINES = (
    "Now is the winter of our discontent made glorious summer by this sun of York; ",
    "To be, or not to be, that is the question: whether 'tis nobler in the mind. ",
    "All the world's a stage, and all the men and women merely players; exeunt. ",
    "If music be the food of love, play on; give me excess of it, that surfeiting ",
    "O Romeo, Romeo! wherefore art thou Romeo? Deny thy father and refuse thy name; ",
    "Friends, Romans, countrymen, lend me your ears; I come to bury Caesar, not... ",
)


def write_text_dataset(
    folder: Path, *, speakers: int = 6, samples: int = 40, length: int = 80, seed: int = 0
) -> Path:
    """``train.parquet`` only, as ``flwrlabs/shakespeare``: ``character_id`` (one per
    speaker, ``PLAY_ROLE``), ``x`` (``length`` characters) and ``y`` (the next one).
    Speaker ``k`` has ``samples + 5 k`` snippets of its own repeated line, plus a character
    outside LEAF's vocabulary now and then (read as a space)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows: dict[str, list[str]] = {"character_id": [], "x": [], "y": []}
    for k in range(speakers):
        text = SPEAKER_LINES[k % len(SPEAKER_LINES)] * 8
        text = text.replace("q", "\u00e6") if k == 1 else text
        for _ in range(samples + 5 * k):
            start = int(rng.integers(0, len(text) - length - 1))
            rows["character_id"].append(f"PLAY{k % 2}_ROLE{k}")
            rows["x"].append(text[start : start + length])
            rows["y"].append(text[start + length])
    order = rng.permutation(len(rows["x"]))  # speakers interleaved, as in the real file
    data = {name: [values[i] for i in order] for name, values in rows.items()}
    features = Features({name: Value("string") for name in rows})
    Dataset.from_dict(data, features=features).to_parquet(str(folder / "train.parquet"))
    return folder


def copy_dataset(
    source: Path,
    folder: Path,
    *,
    repaint: int | None = None,
    recompress: bool = False,
    row_group_size: int | None = None,
) -> Path:
    """A copy of a parquet dataset folder, rewritten by pyarrow: the same samples in
    ``row_group_size`` rows per group (another layout of the same data); with
    ``recompress``, every train image saved again as an uncompressed PNG (other bytes,
    the same pixels); with ``repaint``, the train image of that index with one pixel
    changed (the same sizes and labels, other content: a lossy or corrected copy)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    def encoded(image: Image.Image) -> bytes:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", compress_level=0 if recompress else 6)
        return buffer.getvalue()

    folder.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.glob("*.parquet")):
        table = pq.read_table(path)
        if path.stem == "train" and (repaint is not None or recompress):
            images = table.column("image").to_pylist()
            for index, item in enumerate(images):
                if recompress or index == repaint:
                    image = Image.open(io.BytesIO(item["bytes"]))
                    if index == repaint:
                        image.putpixel((0, 0), 255 - image.getpixel((0, 0)))
                    images[index] = {"bytes": encoded(image), "path": item["path"]}
            column = pa.array(images, type=table.schema.field("image").type)
            table = table.set_column(table.schema.get_field_index("image"), "image", column)
        pq.write_table(table, folder / path.name, row_group_size=row_group_size)
    return folder
