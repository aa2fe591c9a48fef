"""Shared fixtures: tiny generated datasets in hub layout, offline Hugging Face."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.fake_data import write_image_dataset, write_text_dataset  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `pytest -n 2` (README's test command, which CI runs): two workers on two cores. With
    # torch's default of one intra-op thread per core, each would run two threads on a
    # shared core and wait on the other's; one thread each keeps both cores busy.
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def grey_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 + 100 grey 28x28 images of 10 classes, columns ``image`` / ``label``."""
    return write_image_dataset(tmp_path_factory.mktemp("grey"))


@pytest.fixture(scope="session")
def cifar100_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """uoft-cs/cifar100's layout: ``img``, ``fine_label`` and ``coarse_label``."""
    return write_image_dataset(
        tmp_path_factory.mktemp("cifar100"), channels=3, size=32, image_column="img",
        label_column="fine_label", num_classes=20, coarse_classes=5,
    )  # fmt: skip


@pytest.fixture(scope="session")
def tiny_imagenet_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """zh-plus/tiny-imagenet's layout: 64x64 colour with a few grey images, splits
    ``train`` and ``valid``."""
    return write_image_dataset(
        tmp_path_factory.mktemp("tiny"), channels=3, size=64, num_classes=20,
        second_split="valid", grey_every=7,
    )  # fmt: skip


@pytest.fixture(scope="session")
def shakespeare_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """flwrlabs/shakespeare's layout: one ``train`` split, ``character_id``/``x``/``y``."""
    return write_text_dataset(tmp_path_factory.mktemp("shakespeare"))


@pytest.fixture(scope="session")
def emnist_letters_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tanganke/emnist_letters' layout: grey 28x28 ``image``, ``label`` of 26 letters."""
    return write_image_dataset(tmp_path_factory.mktemp("emnist"), num_classes=26)


@pytest.fixture(scope="session")
def colour_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CIFAR-like: RGB 32x32 with columns ``img`` / ``label``."""
    return write_image_dataset(
        tmp_path_factory.mktemp("colour"), channels=3, size=32, image_column="img"
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--deployment",
        action="store_true",
        help="also run the loopback deployment tests (SuperLink + SuperNodes; ~20 min)",
    )
    parser.addoption(
        "--ray-cluster",
        action="store_true",
        help="also run the two-node Ray cluster test (starts Ray nodes; ~1 min)",
    )
    parser.addoption(
        "--resume-matrix",
        action="store_true",
        help="also kill every algorithm at more moments, with and without DP (~10 min)",
    )
    parser.addoption(
        "--all-simulations",
        action="store_true",
        help="also run every algorithm's Ray simulation, not only those CI runs (14 runs)",
    )


#: Opt-in markers: (marker, option that enables it, why it is skipped otherwise).
OPT_IN = (
    ("deployment", "--deployment", "loopback deployment test: run with --deployment"),
    ("ray_cluster", "--ray-cluster", "starts a Ray cluster of its own: run with --ray-cluster"),
    ("resume_matrix", "--resume-matrix", "more kill moments, with DP: run with --resume-matrix"),
    (
        "simulation_all",
        "--all-simulations",
        "in process in CI (test_algorithm_runs.py, test_references.py): --all-simulations",
    ),
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Opt-in tests run only when asked for: they take longer than CI allows, or start
    machine-wide services."""
    for marker, option, reason in OPT_IN:
        if config.getoption(option):
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)
