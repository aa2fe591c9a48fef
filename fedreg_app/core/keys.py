"""How a run-config key is declared and refused: the pieces every module that declares
keys shares (:mod:`fedreg_app.core.config`, :mod:`fedreg_app.core.robustness`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any


class ConfigError(ValueError):
    """A run-config value is missing or not allowed; the message names the key."""


def core_key(default: Any, allowed: str, *, doc: str, source: str) -> Any:
    """Declare one key every algorithm shares (a :class:`RunConfig` field, named as the
    key with ``_`` for ``-``): its default, what is allowed, what it does and where its
    default comes from, as :func:`option` does for an algorithm's keys. The checks are in
    :meth:`RunConfig.validate`."""
    return dataclasses.field(
        default=default, metadata={"allowed": allowed, "doc": doc, "source": source}
    )


def one_of(values: Iterable[Any]) -> str:
    return f"one of {', '.join(str(value) for value in values)}"


def fail(key: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"{key}={value!r} is not allowed: expected {allowed}")
