"""Federated data: flwr-datasets partitioning, decoded once into tensors.

Pipeline (FedReG paper, Section 4.1): merge the dataset's train and test splits, partition
the pool over the clients by label with Dirichlet(alpha), then split each client's data
75% train / 25% test with a seeded split. The global test set is the union of all client
test splits. Images are decoded into ``uint8`` tensors ``(N, C, H, W)``, kept on a
node's disk (``state-dir``) or in a bounded per-process cache; they are normalised per
batch by :func:`normalise`.

Text (LEAF Shakespeare, ``flwrlabs/shakespeare``: 80-character snippets ``x`` and the next
character ``y``, one client per speaking role) is encoded once into ``int16`` character
indices ``(N, 80)`` over LEAF's 80-character vocabulary, and partitioned by its natural
client id (``partition = "natural"``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import shutil
from collections import OrderedDict
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, lru_cache
from logging import INFO
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from flwr.common import log
from PIL import Image

from fedreg_app.core.config import SECOND_SPLITS, ConfigError, RunConfig, check_dataset_path
from fedreg_app.core.persist import (
    digest,
    load_checked_arrays,
    load_json,
    read_cache,
    save_arrays,
    save_json,
)

if TYPE_CHECKING:  # imported where used: a deployed client whose partition is already on
    # disk never loads them (about 4 s and 300 MB per message on a one-core device)
    from datasets import Dataset, DatasetDict
    from flwr_datasets import FederatedDataset

IMAGE_COLUMNS = ("image", "img")
LABEL_COLUMNS = ("label", "fine_label")
#: Next-character prediction: the input snippet and the character that follows it.
TEXT_COLUMNS = ("x", "y")
#: Columns naming a sample's natural client (LEAF: Shakespeare's role, FEMNIST's writer).
NATURAL_ID_COLUMNS = ("character_id", "writer_id", "user_id", "client_id")
NATURAL_ID = "natural_id"
TEST_FRACTION = 0.25
IMAGE, TEXT = "image", "text"
#: What to do about a dataset file that cannot be read.
DATA_REMEDY = "re-download or re-convert it (see README, 'Datasets and models')"

#: LEAF Shakespeare's vocabulary: newline, space, 14 punctuation marks, digits, letters.
VOCABULARY = (
    "\n !\"&'(),-.0123456789:;>?"
    + "".join(map(chr, range(ord("A"), ord("Z") + 1)))
    + "[]"
    + "".join(map(chr, range(ord("a"), ord("z") + 1)))
    + "}"
)
#: Characters outside the vocabulary are read as a space.
_CHAR_INDEX = np.full(256, VOCABULARY.index(" "), dtype=np.int16)
_CHAR_INDEX[[ord(c) for c in VOCABULARY]] = np.arange(len(VOCABULARY), dtype=np.int16)


class DataError(ConfigError):
    """A dataset file cannot be read (truncated, damaged, not parquet): the message names
    the file and what to do, instead of a pyarrow or datasets traceback."""


@dataclass(frozen=True)
class DatasetInfo:
    """What a model needs to know about the data: shape and number of classes. For text,
    ``width`` is the sequence length (``channels`` and ``height`` are 1) and the classes
    are the vocabulary."""

    num_classes: int
    channels: int
    height: int
    width: int
    modality: str = IMAGE


@dataclass(frozen=True, eq=False)
class TensorData:
    """Decoded samples: ``x`` uint8 images ``(N, C, H, W)`` or int16 character indices
    ``(N, L)``, ``y`` int64 ``(N,)``.

    Compared and hashed by identity, so per-process caches can key on the object."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def class_counts(self, num_classes: int) -> torch.Tensor:
        return torch.bincount(self.y, minlength=num_classes)


@dataclass(frozen=True)
class ClientData:
    """One client's partition after the 75/25 split."""

    partition_id: int
    train: TensorData
    test: TensorData


def dataset_files(folder: Path) -> list[Path]:
    """A local dataset's parquet files: ``train`` and whichever second split it has."""
    candidates = (folder / f"{split}.parquet" for split in ("train", *SECOND_SPLITS))
    return [path for path in candidates if path.is_file()]


def source_fingerprint(dataset_path: str) -> tuple[tuple[str, int, int], ...]:
    """(name, size, mtime_ns) of each file of a local dataset (none for a hub one): a
    cheap stand-in for their content, so that a dataset replaced at the same path (a
    re-download, a re-conversion) is decoded again instead of read from a cache."""
    found = []
    for path in dataset_files(Path(dataset_path)) if dataset_path else []:
        info = path.stat()
        found.append((path.name, info.st_size, info.st_mtime_ns))
    return tuple(found)


@dataclass(frozen=True)
class PartitionKey:
    """Everything that determines the partition; equal keys give identical data. With a
    local dataset that includes its files' sizes and times (``source``): every cache of
    decoded data, in a process or on a node's disk, is keyed on this."""

    dataset: str
    dataset_path: str
    num_partitions: int
    alpha: float
    seed: int
    min_partition_size: int
    data_fraction: float = 1.0
    partition: str = "dirichlet"
    shard_classes: int = 2
    balance: bool = True  # the Dirichlet partitions' self-balancing (dirichlet-balance)
    source: tuple[tuple[str, int, int], ...] = ()

    @classmethod
    def from_config(cls, config: RunConfig, num_partitions: int) -> PartitionKey:
        path = str(check_dataset_path(config.dataset_path)) if config.dataset_path else ""
        return cls(
            dataset=config.dataset,
            dataset_path=path,
            num_partitions=num_partitions,
            alpha=config.alpha,
            seed=config.seed,
            min_partition_size=config.min_partition_size,
            data_fraction=config.data_fraction,
            partition=config.partition,
            shard_classes=config.shard_classes,
            balance=config.dirichlet_balance,
            source=source_fingerprint(path),
        )


@contextmanager
def no_progress_bars() -> Iterator[None]:
    """``datasets``' progress bars off while our code calls it ("Generating train split",
    "Flattening the indices"): in a Flower run every process that loads the data would
    print them into the run's log, as lines of carriage returns. Setting
    ``HF_DATASETS_DISABLE_PROGRESS_BARS`` (0 or 1) decides instead. Also a decorator."""
    from datasets import config as datasets_config
    from datasets.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    if datasets_config.HF_DATASETS_DISABLE_PROGRESS_BARS is not None or (
        are_progress_bars_disabled()
    ):
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()


def normalise(x: torch.Tensor) -> torch.Tensor:
    """uint8 pixels to floats in [-1, 1], done per batch so data stays compact."""
    return x.float().div_(127.5).sub_(1.0)


class CanonicalPool:
    """flwr-datasets preprocessor: merge train+test into one pool named ``train`` and
    rename the input and label columns to ``image`` (or ``text``) / ``label``, and a
    natural client id, if the dataset has one, to ``natural_id``: everything downstream
    (the partitioner included) sees one schema whatever the dataset.

    ``fraction`` < 1 keeps a seeded random subset of the pool (quick checks on a laptop);
    the partition is then drawn from that subset as usual."""

    def __init__(self, fraction: float = 1.0, seed: int = 0) -> None:
        self.fraction, self.seed = fraction, seed

    def __call__(self, dataset: DatasetDict) -> DatasetDict:
        from datasets import ClassLabel, DatasetDict
        from datasets import Image as ImageFeature
        from flwr_datasets.preprocessor import Merger

        splits = tuple(dataset)  # train + test, or train + valid (Tiny-ImageNet), ...
        pool = Merger({"train": splits})(dataset)["train"]
        if _is_text(pool):
            renames = {TEXT_COLUMNS[0]: TEXT, TEXT_COLUMNS[1]: "label"}
        else:
            image_column = _find_column(pool, IMAGE_COLUMNS, ImageFeature, "image")
            label_column = _find_column(pool, LABEL_COLUMNS, ClassLabel, "label")
            renames = {image_column: IMAGE, label_column: "label"}
        natural = [name for name in NATURAL_ID_COLUMNS if name in pool.features][:1]
        renames |= {name: NATURAL_ID for name in natural}
        pool = pool.select_columns(list(renames)).rename_columns(
            {old: new for old, new in renames.items() if old != new}
        )
        if self.fraction < 1:
            keep = max(1, round(len(pool) * self.fraction))
            pool = pool.shuffle(seed=self.seed).select(range(keep)).flatten_indices()
        return DatasetDict({"train": pool})


@lru_cache(maxsize=4)
@no_progress_bars()
def federated_dataset(key: PartitionKey) -> FederatedDataset:
    """The flwr-datasets object for a partition key; cached so the split is computed once."""
    from flwr_datasets import FederatedDataset

    partitioner = partitioner_for(key)
    load_kwargs = {}
    name = key.dataset
    if key.dataset_path:
        folder = Path(key.dataset_path)
        name = "parquet"
        load_kwargs["data_files"] = {path.stem: str(path) for path in dataset_files(folder)}
        for path in load_kwargs["data_files"].values():
            _check_parquet_footer(Path(path))
    fds = FederatedDataset(
        dataset=name,
        preprocessor=CanonicalPool(key.data_fraction, key.seed),
        partitioners={"train": partitioner},
        seed=key.seed,
        **load_kwargs,
    )
    if key.dataset_path:  # read the files now, where a damaged one can be named
        _load_local_pool(fds, [Path(p) for p in load_kwargs["data_files"].values()])
    return fds


def _parquet_error(path: Path, err: Exception) -> DataError:
    return DataError(
        f"dataset-path: {path} is not a readable parquet file ({type(err).__name__}: {err}); "
        f"it is truncated or damaged: {DATA_REMEDY}"
    )


def _check_parquet_footer(path: Path) -> None:
    """Garbage and truncated files fail here, cheaply: only the footer is read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pq.ParquetFile(path).close()
    except (pa.ArrowException, OSError, ValueError) as err:
        raise _parquet_error(path, err) from None


def _load_local_pool(fds: FederatedDataset, files: list[Path]) -> None:
    """Load a local dataset; a file damaged inside (its footer intact) is found by reading
    each file on its own. Errors that no file explains are raised as they are."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.exceptions import DatasetsError

    check_label_features(files)
    try:
        fds.load_split("train")
    except ConfigError:
        raise
    except (pa.ArrowException, DatasetsError, OSError, ValueError) as err:
        for path in files:
            try:
                pq.read_table(path)
            except (pa.ArrowException, OSError, ValueError) as damage:
                raise _parquet_error(path, damage) from None
        raise err


def label_classes(path: Path) -> tuple[str, tuple[str, ...] | None] | None:
    """A local file's label column and the class names its ClassLabel declares (None:
    a plain integer column), read from the Hugging Face metadata in its footer; None when
    the file declares no label column."""
    import json

    import pyarrow.parquet as pq

    metadata = pq.read_schema(path).metadata or {}
    try:
        features = json.loads(metadata.get(b"huggingface", b"{}"))["info"]["features"]
    except (KeyError, TypeError, ValueError):
        return None
    column = next((name for name in LABEL_COLUMNS if name in features), None)
    if column is None:
        return None
    names = features[column].get("names")
    return column, tuple(names) if names is not None else None


def check_label_features(files: list[Path]) -> None:
    """Every file of a local dataset must declare the same classes: a test split with
    more classes than the train split would be merged under the train split's count, its
    extra labels out of range (found only when training failed, naming no file)."""
    declared = {path: label_classes(path) for path in files}
    known = {path: value for path, value in declared.items() if value is not None}
    if len(set(known.values())) > 1:
        described = "; ".join(
            f"{path.name}: column {column!r}, "
            + (f"{len(names)} classes" if names is not None else "no class names")
            for path, (column, names) in known.items()
        )
        raise DataError(
            f"dataset-path: its files declare different label columns or classes ({described}); "
            f"expected one ClassLabel shared by every split: {DATA_REMEDY}"
        )


def check_label_range(labels: torch.Tensor, num_classes: int, column: str = "label") -> None:
    """Labels must be 0..num_classes-1: the dataset's ClassLabel says how many there are."""
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        bad = int(labels.max()) if int(labels.max()) >= num_classes else int(labels.min())
        raise DataError(
            f"label {bad} in the dataset's {column!r} column is outside the {num_classes} "
            f"classes its ClassLabel declares (0..{num_classes - 1}): {DATA_REMEDY}"
        )


def partitioner_for(key: PartitionKey):
    """The flwr-datasets partitioner of ``partition``: Dirichlet(alpha) label skew (the
    FedReG paper, optionally topped up), "hold c classes" shards (each client gets
    ``shard-classes`` classes, drawn with the seed, and an equal share of each; ``003``,
    Section 1.3; thesis Fig. 3.1), or the dataset's natural clients (Shakespeare's
    speaking roles). "dirichlet" is flwr-datasets' ``DirichletPartitioner`` with its
    arguments and draws, less its warning per redraw (``RedrawingDirichletPartitioner``)."""
    from flwr_datasets.partitioner import PathologicalPartitioner

    from fedreg_app.core.partitioners import RedrawingDirichletPartitioner

    if key.partition == "natural":
        from fedreg_app.core.partitioners import NaturalIdSubsetPartitioner

        return NaturalIdSubsetPartitioner(
            key.num_partitions, NATURAL_ID, key.min_partition_size, key.seed
        )
    if key.partition == "dirichlet-topup":
        from fedreg_app.core.partitioners import TopUpDirichletPartitioner

        return TopUpDirichletPartitioner(
            key.num_partitions, "label", key.alpha, key.min_partition_size, key.seed,
            key.balance,
        )  # fmt: skip
    if key.partition == "shard":
        return PathologicalPartitioner(
            num_partitions=key.num_partitions,
            partition_by="label",
            num_classes_per_partition=key.shard_classes,
            class_assignment_mode="random",
            seed=key.seed,
        )
    return RedrawingDirichletPartitioner(
        num_partitions=key.num_partitions,
        partition_by="label",
        alpha=key.alpha,
        min_partition_size=key.min_partition_size,
        self_balancing=key.balance,
        seed=key.seed,
    )


@no_progress_bars()
def dataset_info(fds: FederatedDataset) -> DatasetInfo:
    """Number of classes from the label feature, image shape from the first image (text:
    the vocabulary, and the first snippet's length)."""
    pool = fds.load_split("train")
    if TEXT in pool.features:
        length = len(pool[0][TEXT])
        return DatasetInfo(len(VOCABULARY), channels=1, height=1, width=length, modality=TEXT)
    channels = _pool_channels(pool)
    first = _decode_images(pool.select([0]), channels)
    return DatasetInfo(
        num_classes=pool.features["label"].num_classes,
        channels=channels,
        height=int(first.shape[2]),
        width=int(first.shape[3]),
    )


GREY_MODES = ("L", "1", "I", "I;16")


def _pool_channels(pool: Dataset, sample: int = 512) -> int:
    """3 if any of a seeded sample of images is in colour, else 1: some datasets
    (Tiny-ImageNet) mix grey images into a colour set, and every client must agree."""
    from datasets import Image as ImageFeature

    rng = np.random.default_rng(0)
    rows = sorted(rng.choice(len(pool), size=min(sample, len(pool)), replace=False).tolist())
    raw = pool.select(rows).cast_column("image", ImageFeature(decode=False))["image"]
    grey = all(Image.open(io.BytesIO(item["bytes"])).mode in GREY_MODES for item in raw)
    return 1 if grey else 3


def _is_text(pool: Dataset) -> bool:
    """Next-character data: string columns ``x`` (snippet) and ``y`` (next character)."""
    from datasets import Value

    features = pool.features
    return all(
        isinstance(features.get(name), Value) and features[name].dtype in ("string", "large_string")
        for name in TEXT_COLUMNS
    )


def encode_text(snippets: list[str]) -> torch.Tensor:
    """Snippets of equal length to ``int16`` vocabulary indices ``(N, L)``, vectorised:
    one byte per character (others read as a space), then a table lookup."""
    if not snippets:
        return torch.zeros((0, 0), dtype=torch.int16)
    length = len(snippets[0])
    if any(len(text) != length for text in snippets):
        raise ValueError(f"text snippets must all have {length} characters")
    raw = "".join(snippets).encode("latin-1", errors="replace")
    codes = _CHAR_INDEX[np.frombuffer(raw, dtype=np.uint8)].reshape(len(snippets), length)
    return torch.from_numpy(codes.copy())


def _find_column(pool: Dataset, preferred: tuple[str, ...], kind: type, role: str) -> str:
    """Prefer the conventional names, else the single column of the right feature type."""
    for name in preferred:
        if name in pool.features and isinstance(pool.features[name], kind):
            return name
    typed = [name for name, feature in pool.features.items() if isinstance(feature, kind)]
    if len(typed) == 1:
        return typed[0]
    raise ConfigError(
        f"dataset: no recognisable {role} column among {list(pool.features)}; expected one "
        f"of {', '.join(preferred)} (a {kind.__name__} feature)"
    )


def _decode_images(ds: Dataset, channels: int) -> torch.Tensor:
    """Decode image bytes with PIL directly (about 3x faster than HF's numpy format), to
    the dataset's number of channels. The column is read in one slice (iterating the
    lazy column fetched row by row: half the time), and an image already in the wanted
    mode is not converted (a copy): 2.5 s instead of 4.7 s for FMNIST's 52,481 training
    images of 50 partitions, the same pixels (``benchmarks/decode.py``)."""
    from datasets import Image as ImageFeature

    raw = ds.cast_column("image", ImageFeature(decode=False))[:]["image"]
    mode = "L" if channels == 1 else "RGB"
    pixels = np.stack([_pixels(Image.open(io.BytesIO(item["bytes"])), mode) for item in raw])
    pixels = pixels[:, None, :, :] if pixels.ndim == 3 else pixels.transpose(0, 3, 1, 2)
    return torch.from_numpy(np.ascontiguousarray(pixels))


def _pixels(image: Image.Image, mode: str) -> np.ndarray:
    return np.asarray(image if image.mode == mode else image.convert(mode), dtype=np.uint8)


@no_progress_bars()
def _to_tensors(ds: Dataset, channels: int) -> TensorData:
    """A split's samples as tensors. Columns are read in one slice each: ``datasets``
    4 gives a lazy column that numpy iterates row by row (1.7 s for Fashion-MNIST's
    70,000 labels, 0.2 s sliced)."""
    if TEXT in ds.features:
        labels = encode_text([c[:1] or " " for c in ds["label"][:]]).reshape(-1).long()
        return TensorData(x=encode_text(ds[TEXT][:]), y=labels)
    labels = torch.as_tensor(np.asarray(ds["label"][:], dtype=np.int64))  # one slice
    classes = getattr(ds.features["label"], "num_classes", None)
    if classes is not None:
        check_label_range(labels, classes)
    return TensorData(x=_decode_images(ds, channels), y=labels)


@cache
def load_info(key: PartitionKey) -> DatasetInfo:
    info = dataset_info(federated_dataset(key))
    if info.modality == TEXT and key.partition != "natural":
        raise ConfigError(
            f"partition={key.partition!r} is not allowed for a next-character dataset "
            f"({key.dataset_path or key.dataset}): expected 'natural' (one client per "
            "speaking role, as LEAF partitions Shakespeare)"
        )
    return info


def _every_split(key: PartitionKey) -> Iterator[DatasetDict]:
    """Each partition's train/test split in partition order, not decoded and not cached
    (the ServerApp keeps no split)."""
    return (client_splits.__wrapped__(key, pid) for pid in range(key.num_partitions))


def split_sizes(key: PartitionKey) -> dict[int, tuple[int, int]]:
    """Every partition's (train, test) split sizes, as :func:`client_splits` cuts them:
    from the seeded partitioning that every node repeats, no image decoded. The server
    checks replies with them."""
    return {pid: (len(s["train"]), len(s["test"])) for pid, s in enumerate(_every_split(key))}


def split_digests(key: PartitionKey) -> dict[int, str]:
    """Every partition's content digest (:func:`tensors_digest` of its decoded train then
    test split, one partition decoded at a time): what a checkpoint needs to tell that
    the data at ``dataset-path`` were replaced by others of the same sizes (a lossy copy,
    a corrected file), on which a resume would continue the run's model. About 6 s for
    Fashion-MNIST's 70,000 images on a 2-core CPU."""
    return digests_and_unions(key)[0]


def digests_and_unions(
    key: PartitionKey, keep: Collection[str] = ()
) -> tuple[dict[int, str], dict[str, TensorData]]:
    """:func:`split_digests`, and in the same pass the union of the splits named in
    ``keep`` ("train", "test"), as :func:`load_union_split` gives it: a ServerApp that
    trains (centralised) or evaluates on a union then decodes no image twice."""
    unknown = set(keep) - {"train", "test"}
    if unknown:
        raise ValueError(f"no such split to keep: {sorted(unknown)}; expected 'train', 'test'")
    channels = load_info(key).channels
    digests: dict[int, str] = {}
    kept: dict[str, list[TensorData]] = {part: [] for part in keep}
    for pid, split in enumerate(_every_split(key)):
        decoded = {part: _to_tensors(split[part], channels) for part in ("train", "test")}
        digests[pid] = tensors_digest(decoded["train"], decoded["test"])
        for part, parts in kept.items():
            parts.append(decoded[part])
    return digests, {part: _concatenated(parts) for part, parts in kept.items()}


def _concatenated(parts: Sequence[TensorData]) -> TensorData:
    return TensorData(x=torch.cat([p.x for p in parts]), y=torch.cat([p.y for p in parts]))


def data_digest(digests: dict[int, str]) -> str:
    """One digest of a whole partitioning (every partition's :func:`split_digests` entry,
    in partition order): ``results.json`` records it, so that two runs, or a run and its
    replay, can be told to have trained on the same samples, split the same way."""
    return hashlib.sha256("".join(digests[p] for p in sorted(digests)).encode()).hexdigest()


def tensors_digest(*parts: TensorData) -> str:
    """sha256 over decoded samples, as the clients train on them: inputs and labels with
    their shapes and types. A copy whose files differ but decode to the same pixels (other
    row groups, another PNG compression) keeps its digest; a lossy re-encoding does not."""
    sha = hashlib.sha256()
    for part in parts:
        for tensor in (part.x, part.y):
            array = np.ascontiguousarray(tensor.numpy())
            sha.update(f"{array.dtype.str}{array.shape}".encode())
            sha.update(array.data)
    return sha.hexdigest()


def check_pool_can_fill(key: PartitionKey, pool_size: int) -> None:
    """Every client needs ``min-partition-size`` samples: more clients than the pool can
    fill fail at once, not after every Dirichlet draw has been tried."""
    needed = key.num_partitions * key.min_partition_size
    if needed > pool_size:
        raise ConfigError(
            f"min-partition-size={key.min_partition_size} for each of {key.num_partitions} "
            f"clients needs {needed:,} samples, but the pool holds {pool_size:,} "
            f"(data-fraction={key.data_fraction:g}): use at most "
            f"{pool_size // key.min_partition_size:,} clients, or a min-partition-size of at "
            f"most {max(1, pool_size // key.num_partitions):,}"
        )


@cache
@no_progress_bars()
def client_splits(key: PartitionKey, partition_id: int) -> DatasetDict:
    """One client's seeded 75/25 train/test split, not yet decoded."""
    if not 0 <= partition_id < key.num_partitions:
        raise ConfigError(
            f"partition-id={partition_id} is not allowed: expected 0..{key.num_partitions - 1}"
        )
    from fedreg_app.core.partitioners import MAX_DIRICHLET_DRAWS

    fds = federated_dataset(key)
    if key.partition.startswith("dirichlet"):
        check_pool_can_fill(key, len(fds.load_split("train")))
    try:
        partition = fds.load_partition(partition_id, "train")
    except ValueError as err:
        if key.partition == "natural":
            raise ConfigError(f"partition='natural': {err}") from err
        if key.partition == "shard":
            raise ConfigError(
                f"partition='shard', shard-classes={key.shard_classes}: flwr-datasets could not "
                f"give {key.num_partitions} clients {key.shard_classes} classes each ({err})"
            ) from err
        raise ConfigError(
            f"alpha={key.alpha}, min-partition-size={key.min_partition_size}: the Dirichlet "
            f"partitioner could not give each of {key.num_partitions} clients at least "
            f"{key.min_partition_size} samples in {MAX_DIRICHLET_DRAWS} draws ({err}). Raise "
            "alpha, lower min-partition-size, use fewer clients, or "
            "partition='dirichlet-topup'."
        ) from err
    return partition.train_test_split(test_size=TEST_FRACTION, seed=key.seed)


def decode_client_data(key: PartitionKey, partition_id: int) -> ClientData:
    """One client's decoded train/test tensors, decoded now (nothing kept)."""
    split = client_splits(key, partition_id)
    return ClientData(
        partition_id=partition_id,
        train=_to_tensors(split["train"], load_info(key).channels),
        test=_to_tensors(split["test"], load_info(key).channels),
    )


def _nbytes(data: ClientData) -> int:
    return sum(t.x.nbytes + t.y.nbytes for t in (data.train, data.test))


#: Decoded partitions a process keeps (MiB of tensors) when its node has no state-dir.
DECODED_CACHE_MIB = "FEDREG_DECODED_CACHE_MIB"


class DecodedPartitions:
    """The process's decoded partitions, least recently used first out beyond a budget
    of bytes: a simulation's ClientApp process serves many nodes, and keeping every
    partition it ever decoded would grow to the whole dataset per process (and, through
    the caches keyed on a partition's tensors, FedReG's rebalanced sets with it). A
    partition decoded again is identical (decoding is deterministic), so the budget
    changes costs, never results. Callable like the ``functools.cache`` it replaces."""

    def __init__(self, budget_mib: float | None = None) -> None:
        self._budget = budget_mib
        self._entries: OrderedDict[tuple[PartitionKey, int], ClientData] = OrderedDict()
        self._bytes = 0

    @property
    def budget_bytes(self) -> int:
        mib = self._budget if self._budget is not None else float(
            os.environ.get(DECODED_CACHE_MIB, "128")
        )  # fmt: skip
        return int(mib * 2**20)

    def __call__(self, key: PartitionKey, partition_id: int) -> ClientData:
        entry = (key, partition_id)
        data = self._entries.get(entry)
        if data is not None:
            self._entries.move_to_end(entry)
            return data
        data = decode_client_data(key, partition_id)
        self._entries[entry] = data
        self._bytes += _nbytes(data)
        while self._bytes > self.budget_bytes and len(self._entries) > 1:  # keep the newest
            _, dropped = self._entries.popitem(last=False)
            self._bytes -= _nbytes(dropped)
        return data

    def cache_clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes


#: One client's decoded train/test tensors, decoded at most once per process while it
#: stays within the process's budget (``FEDREG_DECODED_CACHE_MIB``, default 128).
load_client_data = DecodedPartitions()


def load_union_split(key: PartitionKey, split: str) -> TensorData:
    """The union of every client's ``split`` ("train" or "test"), in partition order.
    Only that split is decoded: this is a ServerApp's own copy."""
    channels = load_info(key).channels
    return _concatenated([_to_tensors(client_splits(key, pid)[split], channels)
                          for pid in range(key.num_partitions)])  # fmt: skip


def load_union_test_set(key: PartitionKey) -> TensorData:
    """The global test set: the union of every client's test split (paper, Section 4.1)."""
    return load_union_split(key, "test")


def _read_info(path: Path) -> DatasetInfo:
    info = DatasetInfo(**load_json(path))
    sizes = (info.num_classes, info.channels, info.height, info.width)
    if not all(isinstance(v, int) and v > 0 for v in sizes) or info.modality not in (IMAGE, TEXT):
        raise ValueError(f"not a dataset description: {info}")
    return info


def _read_partition(path: Path, partition_id: int) -> ClientData:
    arrays = {k: torch.from_numpy(v) for k, v in load_checked_arrays(path).items()}
    train = TensorData(arrays["train_x"], arrays["train_y"])
    test = TensorData(arrays["test_x"], arrays["test_y"])
    for part in (train, test):
        if part.x.shape[:1] != part.y.shape or part.y.dtype != torch.int64:
            raise ValueError(f"inconsistent arrays: x {tuple(part.x.shape)}, y {part.y.dtype}")
    return ClientData(partition_id, train, test)


def data_cache_folder(state_dir: Path, key: PartitionKey) -> Path:
    """Where a node keeps the decoded data of one partitioning (any run may reuse it)."""
    return state_dir / "data" / digest(*dataclasses.astuple(key))


#: In each data-cache folder: the partitioning it holds, so that a later one can tell a
#: folder left behind by a replaced dataset.
KEY_FILE = "key.json"


def key_record(key: PartitionKey) -> dict:
    """The key as JSON gives it back (tuples as lists), for :data:`KEY_FILE`."""
    return {
        field.name: [list(entry) for entry in key.source] if field.name == "source"
        else getattr(key, field.name)
        for field in dataclasses.fields(key)
    }  # fmt: skip


def prune_replaced(cache: Path, key: PartitionKey) -> list[Path]:
    """Delete the sibling data-cache folders of the same partitioning of a dataset whose
    files have changed since (the same key but ``source``): nothing will read them again,
    and on a device each is a decoded copy of its share of the dataset. A folder of any
    other partitioning (another seed, alpha, client count, dataset), or without a key
    file (an older version's, or being written), is left alone. Returns those deleted."""
    record = key_record(key)
    source, ours = record.pop("source"), record
    removed = []
    for folder in cache.parent.iterdir() if cache.parent.is_dir() else ():
        if folder == cache or not folder.is_dir():
            continue
        try:
            theirs = load_json(folder / KEY_FILE)
        except (OSError, ValueError):
            continue
        if not isinstance(theirs, dict) or theirs.get("source") == source:
            continue
        if {k: v for k, v in theirs.items() if k != "source"} == ours:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def node_data(
    key: PartitionKey, partition_id: int, cache: Path | None
) -> tuple[DatasetInfo, ClientData]:
    """Dataset info and this node's decoded partition. With a ``cache`` folder (a node's
    ``state-dir``) both are read from disk after the first time: a fresh process per
    message (deployment) neither reloads the dataset nor decodes images again, and a
    simulation process serving many nodes holds a partition only while it handles that
    node's message (nothing is kept in the process). A damaged cache file is moved aside
    and rebuilt."""
    if cache is None:
        return load_info(key), load_client_data(key, partition_id)
    info_path, data_path = cache / "info.json", cache / f"partition-{partition_id}.npz"
    info = read_cache(info_path, _read_info)
    if info is None:
        info = load_info(key)
        save_json(info_path, dataclasses.asdict(info))
        save_json(cache / KEY_FILE, key_record(key))
        for folder in prune_replaced(cache, key):
            log(INFO, "removed %s: decoded from a dataset since replaced at %s",
                folder, key.dataset_path)  # fmt: skip
    data = read_cache(data_path, lambda path: _read_partition(path, partition_id))
    if data is None:
        data = decode_client_data(key, partition_id)
        save_arrays(
            data_path,
            {"train_x": data.train.x.numpy(), "train_y": data.train.y.numpy(),
             "test_x": data.test.x.numpy(), "test_y": data.test.y.numpy()},
        )  # fmt: skip
    return info, data
