"""Conversions between numpy parameter dicts and Flower records."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord


def to_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    """Numpy arrays keyed by state-dict name into an ArrayRecord (order kept)."""
    return ArrayRecord({key: Array(np.ascontiguousarray(value)) for key, value in arrays.items()})


def from_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    """An ArrayRecord back into numpy arrays keyed by state-dict name."""
    return {key: array.numpy() for key, array in record.items()}
