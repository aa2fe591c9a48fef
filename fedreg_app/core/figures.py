"""The figures of a run beyond its best: per-client spread and final / last-rounds means.

A best alone may be one lucky round, and a mean over the clients' test samples alone may
hide the clients at the bottom; pFL-Bench (Chen et al., NeurIPS 2022) reports the spread
beside the mean, as these do. Shared by the ServerApp's round records, ``results.json``'s
run-level figures and ``fedreg-report``'s tables.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

#: Per-client figures of a round, each an all-client figure (see ``RoundRecord``).
CLIENT_FIGURES = (
    "personal_accuracy_client_mean",
    "personal_accuracy_worst",
    "personal_accuracy_bottom_decile",
)
#: The held-out new clients' figures of a round (see ``RoundRecord``).
NEW_CLIENT_FIGURES = ("new_client_personal_accuracy", "new_client_global_accuracy")
#: The share of the clients whose mean is the bottom-decile figure (at least one client).
DECILE = 0.1
#: How many of the last evaluated rounds the run-level "last" figures average.
LAST_ROUNDS = 10


def client_figures(accuracies: Collection[float]) -> dict[str, float | None]:
    """The per-client figures of one round's client accuracies: their unweighted mean,
    the lowest, and the mean of the lowest tenth (pFL-Bench's fairness figures beside
    the mean; all None for no clients)."""
    ranked = sorted(float(a) for a in accuracies)
    if not ranked:
        return dict.fromkeys(CLIENT_FIGURES)
    tenth = max(1, round(DECILE * len(ranked)))
    return {
        "personal_accuracy_client_mean": sum(ranked) / len(ranked),
        "personal_accuracy_worst": ranked[0],
        "personal_accuracy_bottom_decile": sum(ranked[:tenth]) / tenth,
    }


#: Per-round fields whose final and last-rounds figures a results file states beside the
#: best: the last evaluated round's value (``final_<field>``) and the mean over the last
#: :data:`LAST_ROUNDS` evaluated rounds (``last10_mean_<field>``). A best alone may be one
#: lucky round, and a mean alone may hide the clients at the bottom.
SUMMARISED = (
    "global_accuracy",
    "personal_accuracy",
    *CLIENT_FIGURES,
    *NEW_CLIENT_FIGURES,
    "personal_accuracy_honest",
)


def final_and_last(values: list[float | None]) -> tuple[float | None, float | None]:
    """The last non-null value and the mean of the last :data:`LAST_ROUNDS` of them."""
    present = [v for v in values if v is not None]
    if not present:
        return None, None
    last = present[-LAST_ROUNDS:]
    return present[-1], sum(last) / len(last)


def summarised_figures(rounds: list[dict[str, Any]]) -> dict[str, float | None]:
    """``final_<field>`` and ``last10_mean_<field>`` of each of :data:`SUMMARISED`."""
    figures: dict[str, float | None] = {}
    for name in SUMMARISED:
        final, last = final_and_last([r.get(name) for r in rounds])
        figures[f"final_{name}"] = final
        figures[f"last{LAST_ROUNDS}_mean_{name}"] = last
    return figures
