"""flwr-datasets partitioners the library does not have.

``NaturalIdSubsetPartitioner``: the dataset's own clients (LEAF Shakespeare's speaking
roles), any number of them: flwr-datasets' ``NaturalIdPartitioner`` always makes one
partition per id (1,129 roles for Shakespeare), which a laptop cannot simulate. Here
``num_partitions`` roles are drawn with the seed from those with at least
``min_partition_size`` samples (LEAF's own ``--sf`` user sampling does the same), and
partition ``i`` is all samples of the ``i``-th drawn role.

``TopUpDirichletPartitioner``: many clients under strong label skew.

flwr-datasets' ``DirichletPartitioner`` redraws the whole Dirichlet assignment until every
client has ``min_partition_size`` samples, at most 10 times. With 500 clients and alpha 0.1
on CIFAR-10 (60,000 images, about 120 per client) that never succeeds (0 of 10 seeds
here, with or without its self-balancing), so the FedReG paper's Table 3 (200 and 500
clients) cannot be partitioned that way. ``partition = "dirichlet-topup"`` draws the same
Dirichlet(alpha) label split once and then tops up every client below the minimum with
samples taken at random from the largest clients' shares: the skew is kept, the few
starved clients get a handful of samples. Everything is drawn from the seed.

``RedrawingDirichletPartitioner``: flwr-datasets' ``DirichletPartitioner``, the same
draws, without its warning for every redraw.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from logging import DEBUG

import numpy as np
from datasets import Dataset
from flwr.common import log
from flwr_datasets.partitioner import DirichletPartitioner, Partitioner

from fedreg_app.core import seeds

#: How flwr-datasets' ``DirichletPartitioner`` begins the warning it gives for every draw
#: that leaves a client below ``min_partition_size`` (before it draws again).
REDRAW_WARNING = "The specified min_partition_size"
#: The draws ``DirichletPartitioner`` makes at most: the first and 10 redraws.
MAX_DIRICHLET_DRAWS = 11


class RedrawingDirichletPartitioner(DirichletPartitioner):
    """flwr-datasets' ``DirichletPartitioner`` unchanged (the same arguments, the same
    random draws, the same partitions), less its warning for each redraw.

    Redrawing until every client holds ``min_partition_size`` samples is how that
    partitioner works: a redraw is no fault, and its warning, printed by every process
    that partitions (the ServerApp and each ClientApp process), says nothing the user can
    act on. The number of redraws is kept in :attr:`redraws` and logged at DEBUG level.
    When all 11 draws fail, the partitioner's ``ValueError`` is raised as before, and
    :func:`fedreg_app.core.data.client_splits` turns it into a ``ConfigError`` naming ``alpha``
    and ``min-partition-size``. Other warnings pass through."""

    redraws = 0

    def load_partition(self, partition_id: int) -> Dataset:
        caught: list[warnings.WarningMessage] = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                return super().load_partition(partition_id)
        finally:  # outside the block: what it gives back is not caught again
            self._sort_warnings(caught)

    def _sort_warnings(self, caught: list[warnings.WarningMessage]) -> None:
        """Count the redraw warnings; give every other warning back to Python."""
        others = [w for w in caught if not str(w.message).startswith(REDRAW_WARNING)]
        found = len(caught) - len(others)
        if found:
            self.redraws += found
            log(DEBUG, "Dirichlet partition: %d of at most %d draws left a client below "
                "min-partition-size=%d; drawn again", found, MAX_DIRICHLET_DRAWS,
                self._min_partition_size)  # fmt: skip
        for w in others:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


class AssignedPartitioner(Partitioner):
    """Partitions from one seeded assignment of the ``partition_by`` column's values to
    clients (``assign``: values -> sorted row indices per client), computed on first use."""

    def __init__(
        self,
        num_partitions: int,
        partition_by: str,
        assign: Callable[[np.ndarray], list[np.ndarray]],
        missing_column: str = "",
    ) -> None:
        super().__init__()
        self._num_partitions = num_partitions
        self._partition_by = partition_by
        self._assign = assign
        self._missing_column = missing_column or f"needs a {partition_by!r} column"
        self._indices: list[np.ndarray] | None = None

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    def load_partition(self, partition_id: int) -> Dataset:
        if self._indices is None:
            if self._partition_by not in self.dataset.column_names:
                raise ValueError(f"{self._missing_column}; the dataset has "
                                 f"{self.dataset.column_names}")  # fmt: skip
            self._indices = self._assign(np.asarray(self.dataset[self._partition_by]))
        return self.dataset.select(self._indices[partition_id].tolist())


class TopUpDirichletPartitioner(AssignedPartitioner):
    def __init__(
        self, num_partitions: int, partition_by: str, alpha: float, min_partition_size: int,
        seed: int, balance: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(
            num_partitions,
            partition_by,
            lambda labels: dirichlet_topup(
                labels, num_partitions, alpha, min_partition_size, seed, balance
            ),
        )


class NaturalIdSubsetPartitioner(AssignedPartitioner):
    def __init__(
        self, num_partitions: int, partition_by: str, min_partition_size: int, seed: int
    ) -> None:
        super().__init__(
            num_partitions,
            partition_by,
            lambda ids: natural_id_subset(ids, num_partitions, min_partition_size, seed),
            missing_column="partition='natural' needs a natural client id column "
            "(character_id, writer_id, user_id or client_id)",
        )


def natural_id_subset(
    ids: np.ndarray, num_partitions: int, min_size: int, seed: int
) -> list[np.ndarray]:
    """Per partition, the sorted sample indices of one natural id, ``num_partitions`` ids
    drawn with the seed (in sorted-id order, so the draw does not depend on row order)
    among those with at least ``min_size`` samples."""
    names, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
    eligible = np.flatnonzero(counts >= min_size)
    if num_partitions > eligible.size:
        raise ValueError(
            f"{num_partitions} clients asked for, but only {eligible.size} of the {names.size} "
            f"natural clients have at least min-partition-size={min_size} samples"
        )
    rng = seeds.rng(seed, "natural-ids")
    chosen = np.sort(rng.choice(eligible, size=num_partitions, replace=False))
    order = np.argsort(inverse, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)])
    return [order[starts[c] : starts[c + 1]] for c in chosen]


def dirichlet_topup(
    labels: np.ndarray, num_partitions: int, alpha: float, min_size: int, seed: int,
    balance: bool = False,
) -> list[np.ndarray]:  # fmt: skip
    """Per client, sorted sample indices: each class split over the clients with
    proportions ~ Dirichlet(alpha), then clients below ``min_size`` filled up from the
    currently largest clients. ``balance``: a client already above the mean size gets
    no share of the classes still to split (the PFNM rule, as flwr-datasets'
    ``self_balancing``)."""
    if min_size * num_partitions > len(labels):
        raise ValueError(
            f"{num_partitions} clients x {min_size} samples exceeds the {len(labels)} samples"
        )
    rng = seeds.rng(seed, "topup")
    mean_size = len(labels) / num_partitions
    shares: list[list[int]] = [[] for _ in range(num_partitions)]
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        proportions = rng.dirichlet(np.full(num_partitions, alpha))
        if balance:
            below = np.array([len(share) <= mean_size for share in shares])
            proportions = proportions * below / (proportions * below).sum()
        cuts = (np.cumsum(proportions)[:-1] * len(members)).astype(int)
        for client, part in enumerate(np.split(members, cuts)):
            shares[client].extend(part.tolist())
    for client in range(num_partitions):
        while len(shares[client]) < min_size:
            donor = max(range(num_partitions), key=lambda c: len(shares[c]))
            taken = shares[donor].pop(int(rng.integers(len(shares[donor]))))
            shares[client].append(taken)
    return [np.sort(np.asarray(share, dtype=np.int64)) for share in shares]
