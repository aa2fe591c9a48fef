"""FedReG's rebalanced dataset (paper Section 3.4)."""

from __future__ import annotations

import pytest
import torch

from clients.rebalance import build_rebalanced, class_threshold, effective_samples
from fedreg_app.core.data import TensorData

COUNTS = [30, 0, 5, 12, 0, 1, 0, 0, 0, 8]  # classes 1, 4, 6, 7, 8 absent


def skewed_data(counts: list[int], channels: int = 1, size: int = 28) -> TensorData:
    """Each sample's pixels encode (class, index) so originals can be recognised."""
    ys = torch.cat([torch.full((n,), c) for c, n in enumerate(counts)])
    x = torch.randint(0, 256, (len(ys), channels, size, size), dtype=torch.uint8)
    return TensorData(x=x, y=ys.long())


@pytest.mark.parametrize(
    ("threshold", "expected"),
    [("mean", 11), ("median", 8), ("max", 30), ("secmin", 5), ("7", 7)],
)
def test_threshold_statistics_over_present_classes(threshold: str, expected: int) -> None:
    # present counts 1, 5, 8, 12, 30: mean 11.2, median 8, max 30, second smallest 5
    assert class_threshold(torch.tensor(COUNTS), threshold) == expected


def test_threshold_is_at_least_one_and_single_class_secmin() -> None:
    assert class_threshold(torch.tensor([0, 1, 0]), "mean") == 1
    assert class_threshold(torch.tensor([0, 9, 0]), "secmin") == 9


@pytest.mark.parametrize("threshold", ["mean", "median", "max", "secmin", "20"])
@pytest.mark.parametrize("augment", ["simple", "auto"])
def test_every_present_class_has_t_samples_and_absent_stay_absent(
    threshold: str, augment: str
) -> None:
    data = skewed_data(COUNTS)
    rebalanced = build_rebalanced(data, 10, threshold, augment, seed=0)
    t = rebalanced.threshold
    counts = rebalanced.data.class_counts(10)
    for c, n in enumerate(COUNTS):
        assert counts[c] == (t if n > 0 else 0)
        generated = int(rebalanced.augmented[rebalanced.data.y == c].sum())
        assert generated == (max(0, t - n) if n > 0 else 0)
    assert rebalanced.effective_samples == sum(min(n, t) for n in COUNTS)
    assert rebalanced.effective_samples == int((~rebalanced.augmented).sum())


def test_originals_are_kept_and_majority_classes_subsampled() -> None:
    data = skewed_data(COUNTS)
    rebalanced = build_rebalanced(data, 10, "mean", "simple", seed=0)  # t = 11
    originals = {bytes(img.numpy()) for img in data.x}
    kept = [bytes(img.numpy()) for img in rebalanced.data.x[~rebalanced.augmented]]
    assert set(kept) <= originals and len(set(kept)) == len(kept)  # no repeats
    # class 2 (5 < t): all 5 originals kept; class 0 (30 >= t): 11 distinct originals
    for c in (2, 5, 9):
        class_images = {bytes(img.numpy()) for img in data.x[data.y == c]}
        mask = (rebalanced.data.y == c) & ~rebalanced.augmented
        assert {bytes(img.numpy()) for img in rebalanced.data.x[mask]} == class_images
    assert int(((rebalanced.data.y == 0) & ~rebalanced.augmented).sum()) == 11


def test_generated_samples_are_new_images() -> None:
    data = skewed_data(COUNTS, channels=3, size=32)
    rebalanced = build_rebalanced(data, 10, "max", "simple", seed=0)
    originals = {bytes(img.numpy()) for img in data.x}
    generated = rebalanced.data.x[rebalanced.augmented]
    fresh = sum(bytes(img.numpy()) not in originals for img in generated)
    assert fresh > 0.9 * len(generated)
    assert generated.dtype == torch.uint8 and generated.shape[1:] == (3, 32, 32)


def test_same_seed_same_rebalanced_set() -> None:
    data = skewed_data(COUNTS)
    a = build_rebalanced(data, 10, "mean", "simple", seed=3)
    b = build_rebalanced(data, 10, "mean", "simple", seed=3)
    c = build_rebalanced(data, 10, "mean", "simple", seed=4)
    assert torch.equal(a.data.x, b.data.x) and torch.equal(a.data.y, b.data.y)
    assert not torch.equal(a.data.x, c.data.x)


def test_effective_samples_formula() -> None:
    assert effective_samples(torch.tensor([30, 0, 5]), 10) == 15


def test_cache_builds_once_per_train_split() -> None:
    from clients.rebalance import cached_rebalanced

    data, other = skewed_data(COUNTS), skewed_data([3, 3, 0, 0, 0, 0, 0, 0, 0, 0])
    first = cached_rebalanced(data, 10, "mean", "simple", 0)
    assert cached_rebalanced(data, 10, "mean", "simple", 0) is first
    assert cached_rebalanced(data, 10, "max", "simple", 0) is not first
    assert len(cached_rebalanced(other, 10, "mean", "simple", 0).data) == 6


def test_text_classes_are_topped_up_with_copies_of_their_own_snippets() -> None:
    ys = torch.cat([torch.full((n,), c) for c, n in enumerate(COUNTS)]).long()
    x = torch.randint(0, 80, (len(ys), 80), dtype=torch.int16)
    rebalanced = build_rebalanced(TensorData(x=x, y=ys), 80, "max", "simple", seed=0)
    assert rebalanced.data.x.dtype == torch.int16
    for c in (2, 3, 5, 9):
        own = {bytes(row.numpy()) for row in x[ys == c]}
        mine = rebalanced.data.x[rebalanced.data.y == c]
        assert len(mine) == 30 and {bytes(row.numpy()) for row in mine} == own
