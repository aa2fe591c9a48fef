"""FedReG's rebalanced dataset (paper Section 3.4, thesis Section 3.3.1).

Per client, from its train split: every class present is brought to ``t`` samples —
classes with ``n_c >= t`` keep ``t`` originals drawn without replacement, classes with
``n_c < t`` keep all originals plus ``t - n_c`` augmented copies of their own samples.
Absent classes stay absent. The effective sample count ``sum_c min(n_c, t)`` weights the
global head in aggregation, with the same ``t``. Built once per client, seeded, and cached
per process.

The threshold ``t`` (``threshold``), one of two readings:

* per client (``mean``, ``median``, ``max``, ``secmin``; ``mean`` is the default): the
  statistic of the client's own non-zero class counts — the thesis (§3.3.1: "t is set as
  the mean value of the number of samples of all non-zero classes"; §5.4 takes the four
  statistics "of the class sample sizes that are not zero").
* global (``global-mean``, ``global-median``, ``global-max``, ``global-secmin``): the
  paper's §3.4, "This threshold could be the mean, median, or any other statistical
  measure derived from the size of all clients' original datasets. Once fixed, each
  client calculates the number of data samples needed per class Q based on the number
  of classes they have, given by Q = D / C (7)": D is the statistic of the train-split
  sizes |D_k| of all clients of the partitioning (its §4.3 also speaks of "the average
  number of client samples"), C the client's number of classes present, t = Q. The
  per-client ``mean`` is the same formula with the client's own size |D_k| for D (the
  mean of the non-zero counts is |D_k| / C). Note that the paper's Table 1 is the
  thesis's Table 5.1 cell for cell, whose thresholds are per client (thesis §5.4): the
  global reading is the paper's prose, not how its numbers were made. A client computes
  every partition's size itself, from the seeded partitioning it partitions its own data
  with (:func:`partition_train_sizes`): no message carries them.

* ``auto`` (our variant, for the paper's §6: "a more rational threshold that reduces
  local training overhead while maintaining algorithm accuracy"): the largest ``t`` up to
  the client's ``mean`` at which originals are at least half of the rebalanced set,
  ``sum_c min(n_c, t) >= C t / 2`` (:func:`auto_threshold`). A client with balanced classes
  gets the mean; one with a dominant class a smaller ``t``, so fewer samples to train and
  fewer augmented copies of its rare classes. Step (2) trains ``C t`` samples a round.

``t`` is rounded half up and at least 1; an explicit integer is also accepted.

Augmentation ``simple`` (thesis Table 5.1's best): random horizontal flip, random crop with
2-pixel padding, rotation up to 10 degrees, colour jitter of 0.2 (brightness, contrast,
saturation; skipped for single-channel images) and a random affine shift of up to 5% with
scale 0.95-1.05. Mild on purpose: the thesis (Fig. 5.5/5.6) found strong augmentation
hurts the small ConvNet. ``auto``: torchvision's AutoAugment with its CIFAR-10 policy.
Text (character indices) has no label-preserving augmentation of this kind: an under-full
class is topped up with exact copies of its own samples (oversampling).
"""

from __future__ import annotations

import functools
import hashlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedreg_app.core.config import AUTO_THRESHOLD, threshold_statistic_or_count
from fedreg_app.core.data import PartitionKey, TensorData, split_sizes, tensors_digest
from fedreg_app.core.persist import (
    load_checked_arrays,
    load_json,
    read_cache,
    save_arrays,
    save_json,
)

if TYPE_CHECKING:
    from torchvision.transforms import v2


@dataclass(frozen=True)
class RebalancedData:
    """The rebalanced set; ``augmented[i]`` is True for generated samples."""

    data: TensorData
    augmented: torch.Tensor
    threshold: int
    effective_samples: int


#: Prefix of the thresholds read globally (paper §3.4): ``global-mean`` etc.
GLOBAL = "global-"


def is_global_threshold(threshold: str | int) -> bool:
    """Whether ``threshold`` needs the sizes of all clients (paper §3.4's reading)."""
    spec = threshold_statistic_or_count(str(threshold))
    return isinstance(spec, str) and spec.startswith(GLOBAL)


def _statistic(name: str, values: np.ndarray) -> float:
    """``mean``, ``median``, ``max`` or ``secmin`` (second smallest; the only value if
    there is one) of a non-empty array."""
    ordered = np.sort(values.astype(float))
    return {
        "mean": lambda: ordered.mean(),
        "median": lambda: np.median(ordered),
        "max": lambda: ordered.max(),
        "secmin": lambda: ordered[1] if ordered.size > 1 else ordered[0],
    }[name]()


def class_threshold(
    counts: torch.Tensor, threshold: str | int, client_sizes: Sequence[int] | None = None
) -> int:
    """``t`` from the client's non-zero class counts: a statistic of them, a given
    integer, or (``global-*``) Q = D / C with D the statistic of ``client_sizes`` (the
    train sizes of all clients) and C the client's number of classes present."""
    spec = threshold_statistic_or_count(str(threshold))
    if isinstance(spec, int):
        return spec
    present = counts[counts > 0].numpy()
    if present.size == 0:
        raise ValueError("a client with no training samples has no rebalanced dataset")
    if spec == AUTO_THRESHOLD:
        return auto_threshold(present)
    if spec.startswith(GLOBAL):
        if not client_sizes:
            raise ValueError(
                f"threshold={spec!r} needs the train sizes of all clients (paper §3.4: D is "
                "a statistic of every client's dataset size); none were given"
            )
        value = _statistic(spec.removeprefix(GLOBAL), np.asarray(client_sizes)) / present.size
    else:
        value = _statistic(spec, present)
    return max(1, int(np.floor(value + 0.5)))  # round half up, at least one sample


#: ``auto``: the least share of originals in the rebalanced set.
AUTO_ORIGINAL_SHARE = 0.5


def auto_threshold(present: np.ndarray) -> int:
    """The largest t <= the rounded mean of the non-zero class counts with
    sum_c min(n_c, t) >= AUTO_ORIGINAL_SHARE * C * t. The share of originals falls as t
    grows (it is 1 at t = 1), so the first t that fails ends the search."""
    counts = present.astype(np.int64)
    mean = max(1, int(np.floor(counts.mean() + 0.5)))
    candidates = np.arange(1, mean + 1)
    originals = np.minimum(counts[None, :], candidates[:, None]).sum(axis=1)
    enough = originals >= AUTO_ORIGINAL_SHARE * counts.size * candidates
    return int(candidates[enough].max())


def effective_samples(counts: torch.Tensor, threshold: int) -> int:
    """Samples of the rebalanced set that are originals: sum_c min(n_c, t)."""
    return int(torch.clamp(counts, max=threshold).sum())


def augmentation(kind: str, channels: int, height: int, width: int) -> v2.Transform:
    """The per-sample transform that generates new samples of an under-full class.
    (torchvision is imported here: a client whose rebalanced set is cached never needs it.)"""
    from torchvision.transforms import v2

    if kind == "auto":
        return v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10)
    steps: list[v2.Transform] = [
        v2.RandomHorizontalFlip(p=0.5),
        v2.RandomCrop((height, width), padding=2),
        v2.RandomRotation(degrees=10),
    ]
    if channels == 3:
        steps.append(v2.ColorJitter(brightness=0.2, contrast=0.2, saturation=0.2))
    steps.append(v2.RandomAffine(degrees=0, translate=(0.05, 0.05), scale=(0.95, 1.05)))
    return v2.Compose(steps)


def _augment_one(transform: v2.Transform, image: torch.Tensor) -> torch.Tensor:
    """AutoAugment's colour operations need three channels; grey images go through RGB."""
    from torchvision.transforms import v2

    if image.shape[0] == 1 and isinstance(transform, v2.AutoAugment):
        return transform(image.expand(3, -1, -1))[:1].contiguous()
    return transform(image)


def build_rebalanced(
    train: TensorData,
    num_classes: int,
    threshold: str | int,
    augment: str,
    seed: int,
    client_sizes: Sequence[int] | None = None,
) -> RebalancedData:
    """Build the rebalanced set; all randomness comes from ``seed``. ``client_sizes``:
    every client's train size, for a ``global-*`` threshold."""
    counts = train.class_counts(num_classes)
    t = class_threshold(counts, threshold, client_sizes)
    rng = np.random.default_rng(seed)
    transform = augmentation(augment, *train.x.shape[1:]) if train.x.dtype == torch.uint8 else None
    xs, ys, flags = [], [], []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(rng.integers(2**31)))  # torchvision draws from torch's RNG
        for c in torch.nonzero(counts).flatten().tolist():
            members = torch.nonzero(train.y == c).flatten().numpy()
            n_c = members.size
            if n_c >= t:
                chosen = rng.choice(members, size=t, replace=False)
                xs.append(train.x[torch.as_tensor(chosen)])
                flags.append(torch.zeros(t, dtype=torch.bool))
            else:
                sources = rng.choice(members, size=t - n_c, replace=True)
                generated = (
                    torch.stack([_augment_one(transform, train.x[i]) for i in sources])
                    if transform is not None
                    else train.x[torch.as_tensor(sources)]  # text: copies
                )
                xs.extend([train.x[torch.as_tensor(members)], generated])
                flags.extend(
                    [torch.zeros(n_c, dtype=torch.bool), torch.ones(t - n_c, dtype=torch.bool)]
                )
            ys.append(torch.full((t,), c, dtype=torch.int64))
    return RebalancedData(
        data=TensorData(x=torch.cat(xs), y=torch.cat(ys)),
        augmented=torch.cat(flags),
        threshold=t,
        effective_samples=effective_samples(counts, t),
    )


#: How :func:`build_rebalanced` builds a set: a stored set of another scheme is built
#: again (bump it when what it builds for the same inputs changes).
BUILD_SCHEME = 1


def cache_identity(train: TensorData, key: tuple) -> str:
    """What a stored set was built from: the train split's samples (their content digest),
    the build's parameters and the scheme; a file on disk is used only if it says the same
    (a set another partition's client built, or one of other parameters, is not)."""
    text = f"{BUILD_SCHEME}|{tensors_digest(train)}|{key!r}"
    return hashlib.sha256(text.encode()).hexdigest()


# Keyed by the train split object itself (identity, held weakly): a client's decoded split
# is cached per process, so its rebalanced set is built once and can never be served for
# other data.
_CACHE: weakref.WeakKeyDictionary[TensorData, dict[tuple, RebalancedData]] = (
    weakref.WeakKeyDictionary()
)


def cached_rebalanced(
    train: TensorData,
    num_classes: int,
    threshold: str,
    augment: str,
    seed: int,
    disk: Path | None = None,
    client_sizes: Sequence[int] | None = None,
) -> RebalancedData:
    """Per-process cache: a client's rebalanced set is built once, not every round. With
    ``disk`` (a file under the node's ``state-dir``) it is also kept across processes, so
    a deployed client, which gets a fresh process per message, augments only once. A
    damaged file on disk is moved aside and the set built again (it is derived data).
    ``client_sizes`` as for :func:`build_rebalanced` (they are fixed by the partitioning,
    as is ``train``, whose cache folder ``disk`` lies in). A file on disk is used only
    if it was built from this ``train`` with these parameters (:func:`cache_identity`):
    one copied or swapped from another partition, or left by an earlier version, is
    moved aside and built again."""
    built = _CACHE.setdefault(train, {})
    sizes = None if client_sizes is None else tuple(int(n) for n in client_sizes)
    key = (num_classes, threshold, augment, seed, sizes)
    if key not in built:
        identity = None if disk is None else cache_identity(train, key)
        read = functools.partial(_read_rebalanced, identity=identity)
        stored = None if disk is None else read_cache(disk, read)
        if stored is None:
            stored = build_rebalanced(train, num_classes, threshold, augment, seed, sizes)
            if disk is not None:
                save_arrays(disk, {**_to_arrays(stored), "identity": np.asarray(identity)})
        built[key] = stored
    return built[key]


def _read_rebalanced(path: Path, identity: str | None = None) -> RebalancedData:
    """The stored set, checked for consistency as well as for damage, and (``identity``)
    for being built from the data and parameters asked for."""
    arrays = load_checked_arrays(path)
    if identity is not None:
        stored = arrays.get("identity")
        if stored is None or stored.shape != () or str(stored) != identity:
            raise ValueError("built from other data or parameters (another partition's, or "
                             "an earlier version's)")  # fmt: skip
    data = _from_arrays(arrays)
    n = len(data.data)
    if data.data.x.shape[0] != n or data.augmented.shape != (n,) or data.threshold < 1:
        raise ValueError(f"inconsistent rebalanced set: {n} labels, {data.augmented.shape} flags")
    return data


def _to_arrays(data: RebalancedData) -> dict[str, np.ndarray]:
    return {
        "x": data.data.x.numpy(),
        "y": data.data.y.numpy(),
        "augmented": data.augmented.numpy(),
        "threshold": np.asarray(data.threshold),
        "effective_samples": np.asarray(data.effective_samples),
    }


def _from_arrays(arrays: dict[str, np.ndarray]) -> RebalancedData:
    return RebalancedData(
        data=TensorData(x=torch.from_numpy(arrays["x"]), y=torch.from_numpy(arrays["y"])),
        augmented=torch.from_numpy(arrays["augmented"]),
        threshold=int(arrays["threshold"]),
        effective_samples=int(arrays["effective_samples"]),
    )


# ----------------------------------------------------- every client's train size


@functools.cache
def _partition_train_sizes(key: PartitionKey) -> tuple[int, ...]:
    return tuple(train for train, _ in split_sizes(key).values())


def partition_train_sizes(key: PartitionKey, cache: Path | None = None) -> tuple[int, ...]:
    """The train-split size |D_k| of every partition of ``key``, in partition order, as
    every client's data is split (``fedreg_app.core.data.client_splits``: n - ceil(0.25 n) of
    its n samples). Computed from the seeded partitioning that every node repeats to find
    its own data, so a client knows them without asking anyone: partitioning labels
    only, no image is decoded (~0.6 s for 100 Fashion-MNIST clients once the dataset is
    loaded). Kept per process and, with ``cache`` (the partitioning's folder under a
    node's ``state-dir``), in ``train-sizes.json`` there: a deployed client, a fresh
    process per message, does not load the dataset for them again."""
    path = None if cache is None else cache / "train-sizes.json"
    if path is not None:
        stored = read_cache(path, lambda p: _read_sizes(p, key.num_partitions))
        if stored is not None:
            return stored
    sizes = _partition_train_sizes(key)
    if path is not None:
        save_json(path, list(sizes))
    return sizes


def _read_sizes(path: Path, num_partitions: int) -> tuple[int, ...]:
    sizes = load_json(path)
    if (not isinstance(sizes, list) or len(sizes) != num_partitions
            or not all(isinstance(n, int) and n >= 1 for n in sizes)):  # fmt: skip
        raise ValueError(f"not {num_partitions} partition sizes: {str(sizes)[:80]}")
    return tuple(sizes)
