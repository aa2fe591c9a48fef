"""Local training's server (``algo = "local"``): it samples clients and asks them to
train, receives no parameters, aggregates nothing and has no global model; evaluation
collects every client's personal accuracy."""

from __future__ import annotations

from collections.abc import Mapping

from strategies.base import PersonalizedStrategy


class LocalStrategy(PersonalizedStrategy):
    group_weights: Mapping[str, str] = {}
    sent_groups = ()
    has_global_model = False
