"""Run-config keys given on a command line or in a config file, checked against the keys
the app declares in ``[tool.flwr.app.config]``.

Shared by ``fedreg-experiment`` and ``fedreg-report``; it sits below both (it imports only
:mod:`fedreg_app.core.config`) so that neither tool has to import the other for it. A key the
app does not declare is refused here, with the closest declared keys, because ``flwr run``
would refuse it later with a less helpful message.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedreg_app.core.config import ConfigError, unknown_key_message

#: The project folder (the one holding pyproject.toml), computed here rather than taken
#: from the launcher so that this module stays free of process-management imports.
PROJECT = Path(__file__).resolve().parents[1]


def declared_run_config(app: Path = PROJECT) -> dict[str, Any]:
    """The app's run-config keys and defaults, from its pyproject.toml."""
    pyproject = tomllib.loads((app / "pyproject.toml").read_text())
    return pyproject["tool"]["flwr"]["app"]["config"]


def check_declared(keys: Iterable[str], declared: dict[str, Any], where: str) -> None:
    """Raise :class:`ConfigError` naming every key the app does not declare, each with
    the closest declared keys (a typo should cost one reading, not a grid of runs)."""
    unknown = sorted(set(keys) - set(declared))
    if unknown:
        raise ConfigError("\n".join(unknown_key_message(k, declared, where) for k in unknown))


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs, values read as TOML (bare words as strings)."""
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {pair!r}: expected key=value")
        try:
            overrides[key.strip()] = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            overrides[key.strip()] = text
    return overrides


def declared_overrides(pairs: list[str], declared: dict[str, Any]) -> dict[str, Any]:
    """``--set`` pairs, each key one the app declares (flwr rejects any other)."""
    overrides = parse_overrides(pairs)
    check_declared(overrides, declared, "run config (given with --set)")
    return overrides
