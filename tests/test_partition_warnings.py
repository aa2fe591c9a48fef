"""Building a partition prints nothing of its own: flwr-datasets' Dirichlet partitioner
warns at every redraw (every process that partitions would print it into the run's log),
and ``datasets`` draws progress bars. The partition itself is flwr-datasets', draw for
draw; a partitioning that cannot be made is still named by our ``ConfigError``."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from datasets import Dataset
from flwr_datasets.partitioner import DirichletPartitioner

from fedreg_app.core.config import ConfigError
from fedreg_app.core.data import PartitionKey, client_splits, federated_dataset, split_sizes
from fedreg_app.core.partitioners import RedrawingDirichletPartitioner
from fedreg_app.registry import load_config

#: On the test images (360 of 400 kept), 10 clients of Dirichlet(0.1) with at least 10
#: samples each: seed 0's first draws leave a client short, so the partitioner redraws.
REDRAWN = {"alpha": 0.1, "seed": 0, "min-partition-size": 10, "data-fraction": 0.9}


def key_of(dataset: Path, **values: object) -> PartitionKey:
    config = load_config({"dataset-path": str(dataset), **REDRAWN, **values})
    return PartitionKey.from_config(config, 10)


def test_a_partition_build_warns_nothing_and_draws_as_flwr_datasets(
    grey_dataset: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    key = key_of(grey_dataset)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sizes = split_sizes(key)
    assert [str(w.message) for w in caught] == []
    assert "Flattening the indices" not in capfd.readouterr().err  # data-fraction < 1
    ours = federated_dataset(key).partitioners["train"]
    assert isinstance(ours, RedrawingDirichletPartitioner) and ours.redraws > 0
    theirs = DirichletPartitioner(
        num_partitions=10, partition_by="label", alpha=0.1, min_partition_size=10,
        self_balancing=key.balance, seed=0,
    )  # fmt: skip
    theirs.dataset = ours.dataset
    with pytest.warns(UserWarning, match="min_partition_size"):  # what ours keeps quiet
        theirs.load_partition(0)
    assert theirs._partition_id_to_indices == ours._partition_id_to_indices
    assert sum(train + test for train, test in sizes.values()) == 360


def test_a_partition_that_cannot_be_drawn_is_named_without_warnings(
    grey_dataset: Path,
) -> None:
    key = key_of(grey_dataset, **{"min-partition-size": 35})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ConfigError, match=r"alpha=0\.1, min-partition-size=35: .* 11 draws"):
            client_splits(key, 0)
    assert [str(w.message) for w in caught] == []


def test_other_warnings_of_the_partitioner_still_reach_the_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    determine = DirichletPartitioner._determine_partition_id_to_indices_if_needed

    def noisy(self: DirichletPartitioner) -> None:
        warnings.warn("something else", UserWarning, stacklevel=1)
        determine(self)

    monkeypatch.setattr(DirichletPartitioner, "_determine_partition_id_to_indices_if_needed", noisy)
    partitioner = RedrawingDirichletPartitioner(2, "label", 1.0, min_partition_size=1, seed=0)
    partitioner.dataset = Dataset.from_dict({"label": [0, 1, 0, 1, 0, 1]})
    with pytest.warns(UserWarning, match="something else"):
        partitioner.load_partition(0)
    assert partitioner.redraws == 0
