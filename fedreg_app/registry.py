"""Algorithm registry: ``algo`` name -> (server strategy, client procedure).

Adding an algorithm means adding its two modules and one line here (and declaring any
run-config keys of its own in pyproject.toml, where flwr looks up what it accepts).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from clients.base import ClientProcedure
from clients.centralised import CentralisedClient
from clients.ditto import DittoClient, DittoOptions
from clients.fedala import FedALAClient, FedALAOptions
from clients.fedas import FedASClient, FedASOptions
from clients.fedavg import FedAvgClient
from clients.fedavg2rep import FedAvg2RepClient, FedAvg2RepOptions
from clients.fedavg_ft import FedAvgFTClient, FedAvgFTOptions
from clients.fedbabu import FedBABUClient, FedBABUOptions
from clients.fedbabu_deviation import DeviationOptions, FedBABUDeviationClient
from clients.fedcp import FedCPClient, FedCPOptions
from clients.feddbe import FedDBEClient, FedDBEOptions
from clients.feddyn import FedDynClient, FedDynOptions
from clients.fedper import FedPerClient
from clients.fedprox import FedProxClient, FedProxOptions
from clients.fedreg import FedReGClient, FedReGOptions
from clients.fedrep import FedRepClient, FedRepOptions
from clients.fedrod import FedRoDClient
from clients.fedseq import FedSeqAntiClient, FedSeqClient, FedSeqOptions
from clients.gpfl import GPFLClient, GPFLOptions
from clients.lg_fedavg import LGFedAvgClient
from clients.local import LocalClient
from fedreg_app.core.config import AlgorithmOptions, ConfigError, RunConfig
from strategies.base import PersonalizedStrategy
from strategies.centralised import CentralisedStrategy
from strategies.ditto import DittoStrategy
from strategies.fedala import FedALAStrategy
from strategies.fedas import FedASStrategy
from strategies.fedavg import FedAvgStrategy
from strategies.fedavg2rep import FedAvg2RepStrategy
from strategies.fedavg_ft import FedAvgFTStrategy
from strategies.fedbabu import FedBABUStrategy
from strategies.fedbabu_deviation import FedBABUDeviationStrategy, recorded_end
from strategies.fedcp import FedCPStrategy
from strategies.feddbe import FedDBEStrategy
from strategies.feddyn import FedDynStrategy
from strategies.fedper import FedPerStrategy
from strategies.fedprox import FedProxStrategy
from strategies.fedreg import FedReGStrategy
from strategies.fedrep import FedRepStrategy
from strategies.fedrod import FedRoDStrategy
from strategies.fedseq import FedSeqAntiStrategy, FedSeqStrategy
from strategies.gpfl import GPFLStrategy
from strategies.lg_fedavg import LGFedAvgStrategy
from strategies.local import LocalStrategy


@dataclass(frozen=True)
class Algorithm:
    name: str
    strategy: type[PersonalizedStrategy]
    client: type[ClientProcedure]
    summary: str
    #: The algorithm's own run-config keys, declared beside its code.
    options: type[AlgorithmOptions] = AlgorithmOptions
    #: A reference point, not a federated algorithm (local, centralised training).
    reference: bool = False
    #: For an algorithm that may end a run before num-server-rounds (its strategy
    #: overrides ``finished``): the round a record of it says the run ended after.
    recorded_end: Callable[[Mapping[str, Any]], int | None] | None = None

    @property
    def resume_fixed(self) -> tuple[str, ...]:
        """Run-config keys a resume of this algorithm must keep, though others may change
        them (see :data:`~fedreg_app.core.checkpoint.RESUMABLE_CHANGES`)."""
        return ("num-server-rounds",) if self.client.schedule_over_rounds else ()


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("fedreg", FedReGStrategy, FedReGClient,
                  "shared base, global head on rebalanced data, private head", FedReGOptions),
        Algorithm("fedavg", FedAvgStrategy, FedAvgClient, "whole model averaged by |D_k|"),
        Algorithm("fedprox", FedProxStrategy, FedProxClient, "FedAvg + proximal term (prox-mu)",
                  FedProxOptions),
        Algorithm("feddyn", FedDynStrategy, FedDynClient, "dynamic regulariser (dyn-alpha)",
                  FedDynOptions),
        Algorithm("ditto", DittoStrategy, DittoClient,
                  "FedAvg + personal model pulled to the global one (ditto-lambda)",
                  DittoOptions),
        Algorithm("fedper", FedPerStrategy, FedPerClient, "shared base, private head"),
        Algorithm("fedrep", FedRepStrategy, FedRepClient,
                  "private head trained first (personal-epochs), then the base", FedRepOptions),
        Algorithm("fedbabu", FedBABUStrategy, FedBABUClient,
                  "base only, head fixed; head fine-tuned before evaluation (finetune-epochs)",
                  FedBABUOptions),
        Algorithm("fedrod", FedRoDStrategy, FedRoDClient,
                  "balanced-softmax generic head + personal head"),
        Algorithm("gpfl", GPFLStrategy, GPFLClient,
                  "class embeddings + conditional valve shared, head private", GPFLOptions),
        Algorithm("lg-fedavg", LGFedAvgStrategy, LGFedAvgClient,
                  "head shared and averaged, base (representation) private"),
        Algorithm("fedavg2rep", FedAvg2RepStrategy, FedAvg2RepClient,
                  "FedAvg for fedavg2rep-warmup-rounds, then FedRep", FedAvg2RepOptions),
        Algorithm("fedbabu-deviation", FedBABUDeviationStrategy, FedBABUDeviationClient,
                  "FedBABU until the client-accuracy spread settles, then fine-tune rounds",
                  DeviationOptions, recorded_end=recorded_end),
        Algorithm("fedseq-vanilla", FedSeqStrategy, FedSeqClient,
                  "base layers unfrozen input side first; head frozen; fine-tune at the end",
                  FedSeqOptions),
        Algorithm("fedseq-anti", FedSeqAntiStrategy, FedSeqAntiClient,
                  "base layers unfrozen output side first; head frozen; fine-tune at the end",
                  FedSeqOptions),
        Algorithm("fedavg-ft", FedAvgFTStrategy, FedAvgFTClient,
                  "FedAvg; the global model fine-tuned on each client before its evaluation "
                  "(ft-epochs)", FedAvgFTOptions),
        Algorithm("fedala", FedALAStrategy, FedALAClient,
                  "FedAvg; each client merges the global model into its own with learned "
                  "element-wise weights on the top layers", FedALAOptions),
        Algorithm("fedas", FedASStrategy, FedASClient,
                  "global base aligned to the client's class prototypes; models averaged by "
                  "Fisher-information trace; head private", FedASOptions),
        Algorithm("feddbe", FedDBEStrategy, FedDBEClient,
                  "FedAvg + domain bias eliminator: private feature bias, features' running "
                  "mean pulled to a global mean fixed once (feddbe-kappa)", FedDBEOptions),
        Algorithm("fedcp", FedCPStrategy, FedCPClient,
                  "conditional policy splits each feature between a private and a frozen "
                  "global head; base, global head and policy network shared (fedcp-lambda)",
                  FedCPOptions),
        Algorithm("local", LocalStrategy, LocalClient,
                  "reference: each client trains only on its own data, no communication",
                  reference=True),
        Algorithm("centralised", CentralisedStrategy, CentralisedClient,
                  "reference: one model trained in the ServerApp on the union of the "
                  "clients' train splits", reference=True),
    )
}  # fmt: skip

#: ``algo`` -> options type: what :class:`RunConfig` checks every key against.
CATALOG = {name: algorithm.options for name, algorithm in ALGORITHMS.items()}


def algorithm_names() -> list[str]:
    return sorted(ALGORITHMS)


def federated_algorithm_names() -> list[str]:
    """The algorithms that train through clients and aggregate (all but the references)."""
    return sorted(name for name, algorithm in ALGORITHMS.items() if not algorithm.reference)


def algorithm_of(config: RunConfig) -> Algorithm:
    """The entry of a loaded config's algorithm: :func:`load_config` has checked the
    name, so it is looked up, not checked again."""
    return ALGORITHMS[config.algo]


def get_algorithm(name: str) -> Algorithm:
    """The entry of an algorithm named by hand (a command line, a test), checked."""
    if name not in ALGORITHMS:
        raise ConfigError(
            f"algo={name!r} is not allowed: expected one of {', '.join(algorithm_names())}"
        )
    return ALGORITHMS[name]


def ended_after(document: Mapping[str, Any]) -> int | None:
    """The round a results.json says its run ended after, where the run's algorithm may
    end early; None where it cannot (an edited file cannot shorten a run)."""
    algorithm = ALGORITHMS.get(document["config"].get("algo"))
    if algorithm is None or algorithm.recorded_end is None:
        return None
    return algorithm.recorded_end(document)


def load_config(run_config: Mapping[str, Any]) -> RunConfig:
    """The validated run config, the algorithm's own keys included: the one entry point
    for the ServerApp, the ClientApp and the tools."""
    return RunConfig.from_run_config(run_config, CATALOG)


def declared_keys() -> dict[str, Any]:
    """{key: default} of every run-config key: the shared ones and every algorithm's."""
    declared = RunConfig.core_keys()
    for options in CATALOG.values():
        declared.update(options.declared())
    return declared
