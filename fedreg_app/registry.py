"""Algorithm registry: ``algo`` name -> (server strategy, client procedure).

Adding an algorithm means adding its two modules and one line here (and declaring any
run-config keys of its own in pyproject.toml, where flwr looks up what it accepts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clients.base import ClientProcedure
from clients.ditto import DittoClient
from clients.fedavg import FedAvgClient
from clients.fedavg2rep import FedAvg2RepClient
from clients.fedbabu import FedBABUClient
from clients.fedbabu_deviation import FedBABUDeviationClient
from clients.feddyn import FedDynClient
from clients.fedper import FedPerClient
from clients.fedprox import FedProxClient
from clients.fedreg import FedReGClient
from clients.fedrep import FedRepClient
from clients.fedrod import FedRoDClient
from clients.fedseq import FedSeqAntiClient, FedSeqClient
from clients.gpfl import GPFLClient
from clients.lg_fedavg import LGFedAvgClient
from fedreg_app.config import RunConfig
from strategies.base import PersonalizedStrategy
from strategies.ditto import DittoStrategy
from strategies.fedavg import FedAvgStrategy
from strategies.fedavg2rep import FedAvg2RepStrategy
from strategies.fedbabu import FedBABUStrategy
from strategies.fedbabu_deviation import FedBABUDeviationStrategy
from strategies.feddyn import FedDynStrategy
from strategies.fedper import FedPerStrategy
from strategies.fedprox import FedProxStrategy
from strategies.fedreg import FedReGStrategy
from strategies.fedrep import FedRepStrategy
from strategies.fedrod import FedRoDStrategy
from strategies.fedseq import FedSeqAntiStrategy, FedSeqStrategy
from strategies.gpfl import GPFLStrategy
from strategies.lg_fedavg import LGFedAvgStrategy


@dataclass(frozen=True)
class Algorithm:
    name: str
    strategy: type[PersonalizedStrategy]
    client: type[ClientProcedure]
    summary: str


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("fedreg", FedReGStrategy, FedReGClient,
                  "shared base, global head on rebalanced data, private head"),
        Algorithm("fedavg", FedAvgStrategy, FedAvgClient, "whole model averaged by |D_k|"),
        Algorithm("fedprox", FedProxStrategy, FedProxClient, "FedAvg + proximal term (prox-mu)"),
        Algorithm("feddyn", FedDynStrategy, FedDynClient, "dynamic regulariser (dyn-alpha)"),
        Algorithm("ditto", DittoStrategy, DittoClient,
                  "FedAvg + personal model pulled to the global one (ditto-lambda)"),
        Algorithm("fedper", FedPerStrategy, FedPerClient, "shared base, private head"),
        Algorithm("fedrep", FedRepStrategy, FedRepClient,
                  "private head trained first (personal-epochs), then the base"),
        Algorithm("fedbabu", FedBABUStrategy, FedBABUClient,
                  "base only, head fixed; head fine-tuned before evaluation (finetune-epochs)"),
        Algorithm("fedrod", FedRoDStrategy, FedRoDClient,
                  "balanced-softmax generic head + personal head"),
        Algorithm("gpfl", GPFLStrategy, GPFLClient,
                  "class embeddings + conditional valve shared, head private"),
        Algorithm("lg-fedavg", LGFedAvgStrategy, LGFedAvgClient,
                  "head shared and averaged, base (representation) private"),
        Algorithm("fedavg2rep", FedAvg2RepStrategy, FedAvg2RepClient,
                  "FedAvg for fedavg2rep-warmup-rounds, then FedRep"),
        Algorithm("fedbabu-deviation", FedBABUDeviationStrategy, FedBABUDeviationClient,
                  "FedBABU until the client-accuracy spread settles, then fine-tune rounds"),
        Algorithm("fedseq-vanilla", FedSeqStrategy, FedSeqClient,
                  "base layers unfrozen input side first; head frozen; fine-tune at the end"),
        Algorithm("fedseq-anti", FedSeqAntiStrategy, FedSeqAntiClient,
                  "base layers unfrozen output side first; head frozen; fine-tune at the end"),
    )
}  # fmt: skip


def algorithm_names() -> list[str]:
    return sorted(ALGORITHMS)


def get_algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        from fedreg_app.config import ConfigError

        raise ConfigError(
            f"algo={name!r} is not allowed: expected one of {', '.join(algorithm_names())}"
        )
    return ALGORITHMS[name]


def load_config(run_config: Mapping[str, Any]) -> RunConfig:
    """The validated run config, the algorithm's own keys included: the one entry point
    for the ServerApp, the ClientApp and the tools."""
    return RunConfig.from_run_config(run_config)
