"""Client-level differential privacy that keeps each parameter group's own aggregation
weights (FedReG: the base by |D_k|, the global head by e_k).

Two modes (``dp-mode``):

- ``central``: the server is trusted with the clients' updates, the released global model
  is private. Each accepted update Δ_k (a reply's aggregated groups minus the global
  model it was trained from, every group a client uploads, private heads never among
  them) is clipped to L2 norm ``dp-clip`` = C over all its groups jointly. Each group g
  is then averaged with the fixed-denominator estimator (McMahan et al. 2018, DP-FedAvg):

      Δ^g = (Σ_{k in sample} w_k^g Δ_k^g + N(0, σ² I)) / D^g,   σ = 2 z C,

  with w_k^g = m_k^g / max_j m_j^g (m^g the group's weight metric, so 0 < w ≤ 1 and the
  ratios between clients are the algorithm's own) and D^g = (K / N) Σ_j w_j^g over all N
  clients, K sampled per round: the expected sum of the sampled weights, a constant. The
  pair of weighted sums over all groups changes by at most 2C when one client's data is
  replaced (its own update moves by at most 2C, and every w ≤ 1), so σ = 2 z C is the
  Gaussian mechanism with noise multiplier z for that sensitivity. Clients' sample counts
  are treated as public, as DP-FedAvg treats them: the guarantee covers what a client's
  data is, not how much of it there is.
- ``local``: clients do not trust the server. Each client clips its own update to C and
  adds N(0, (2 z C)² I) before sending; the server aggregates the noisy updates with the
  algorithm's usual weights (post-processing).

Accounting (``dp-accounting``'s RDP accountant, the replace-one relation, ε at
``dp-delta``): central, one sampled Gaussian per round that released an update, clients
drawn K of N without replacement (the project's sampling); local, a client's Gaussian
releases composed without amplification (an observer of the wire knows who was sampled),
reported for the client that has released most. Noise is drawn from the run's seed by
default (``dp-seeded-noise``, for reproducible research): anyone who knows the seed can
remove it, so a deployment that needs the guarantee sets ``dp-seeded-noise = false``.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from functools import cache

import numpy as np

from fedreg_app.core.config import ConfigError, RunConfig
from fedreg_app.core.models import group_of
from fedreg_app.core.seeds import rng

Arrays = Mapping[str, np.ndarray]


def update_norm(update: Arrays) -> float:
    """L2 norm of all arrays together (float64)."""
    return math.sqrt(sum(float(np.sum(np.square(v, dtype=np.float64))) for v in update.values()))


def clipped(update: Arrays, bound: float) -> dict[str, np.ndarray]:
    """The update scaled to L2 norm at most ``bound``, jointly over its arrays (float64)."""
    norm = update_norm(update)
    scale = min(1.0, bound / norm) if norm > 0 else 1.0
    return {key: np.asarray(value, dtype=np.float64) * scale for key, value in update.items()}


def difference(arrays: Arrays, reference: Arrays) -> dict[str, np.ndarray]:
    """arrays − reference, key by key (float64); every key needs its reference."""
    missing = sorted(set(arrays) - set(reference))
    if missing:
        raise KeyError(f"no reference for {missing[:3]}: the update cannot be computed")
    return {k: np.asarray(v, np.float64) - np.asarray(reference[k], np.float64)
            for k, v in arrays.items()}  # fmt: skip


def noise_std(config: RunConfig) -> float:
    """σ = 2 z C: z times the replace-one sensitivity of a sum of updates clipped to C."""
    return 2.0 * config.dp_noise_multiplier * config.dp_clip


def noise_generator(config: RunConfig, stream: str, *context: int) -> np.random.Generator:
    """The run's seeded stream, or OS entropy with ``dp-seeded-noise = false``."""
    return rng(config.seed, stream, *context) if config.dp_seeded_noise else np.random.default_rng()


def add_noise(total: np.ndarray, std: float, generator: np.random.Generator) -> np.ndarray:
    return total + generator.normal(0.0, std, size=total.shape)


def privatise_locally(
    arrays: Arrays, reference: Arrays, config: RunConfig, partition_id: int, server_round: int
) -> dict[str, np.ndarray]:
    """Local DP on a client: reference + clip(arrays − reference) + N(0, σ²), in the
    arrays' own dtypes."""
    generator = noise_generator(config, "dp-local-noise", partition_id, server_round)
    update = clipped(difference(arrays, reference), config.dp_clip)
    std = noise_std(config)
    return {
        key: (np.asarray(reference[key], np.float64) + add_noise(delta, std, generator)).astype(
            np.asarray(arrays[key]).dtype
        )
        for key, delta in update.items()
    }


def population_denominators(
    population: Mapping[int, Mapping[str, float]],
    group_weights: Mapping[str, str],
    sample_size: int,
) -> tuple[dict[str, float], dict[str, float]]:
    """Per group: the weight scale max_j m_j (so every w ≤ 1) and the fixed denominator
    D = (K / N) Σ_j m_j / max_j m_j over all N clients."""
    num_clients = len(population)
    scales, denominators = {}, {}
    for group, key in group_weights.items():
        values = [float(weights[key]) for weights in population.values()]
        if not values or max(values) <= 0:
            raise ValueError(f"dp-mode='central': no client has a positive {key} for {group}")
        scales[group] = max(values)
        denominators[group] = sample_size / num_clients * sum(v / scales[group] for v in values)
    return scales, denominators


def central_release(
    current: Arrays,
    updates: Sequence[tuple[Arrays, Mapping[str, float]]],
    group_weights: Mapping[str, str],
    scales: Mapping[str, float],
    denominators: Mapping[str, float],
    std: float,
    clip: float,
    generator: np.random.Generator,
) -> dict[str, np.ndarray]:
    """The new values of the aggregated groups: current + the fixed-denominator noisy
    average of the clipped updates (see the module docstring)."""
    sums: dict[str, np.ndarray] = {}
    for arrays, metrics in updates:
        for key, delta in clipped(difference(arrays, current), clip).items():
            group = group_of(key)
            if group not in group_weights:
                raise KeyError(f"received {key!r} but the strategy aggregates only "
                               f"{list(group_weights)}")  # fmt: skip
            weight = float(metrics[group_weights[group]]) / scales[group]
            if not 0 <= weight <= 1 + 1e-9:
                raise ValueError(
                    f"{group_weights[group]}={metrics[group_weights[group]]} exceeds the "
                    f"largest the clients declared ({scales[group]}): the sensitivity bound "
                    "would not hold"
                )
            sums[key] = sums.get(key, 0.0) + weight * delta
    released = {}
    for key in sorted(sums):  # a fixed order: the noise drawn for each key is reproducible
        average = add_noise(sums[key], std, generator) / denominators[group_of(key)]
        released[key] = (np.asarray(current[key], np.float64) + average).astype(current[key].dtype)
    return released


# ----------------------------------------------------------------------- accounting
def require_accounting() -> None:
    """Fail before any work when a private run cannot account its privacy."""
    try:
        _accounting()
    except ImportError as err:
        raise ConfigError(
            "dp-mode needs the dp-accounting package: pip install -e '.[privacy]' "
            "(or set dp-mode='off')"
        ) from err


@cache
def _accounting():  # noqa: ANN202 - the library's modules
    """dp-accounting, imported once and only where privacy is on (it logs loudly)."""
    logging.getLogger("absl").setLevel(logging.ERROR)
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    return dp_accounting, rdp_privacy_accountant


def central_epsilon(
    noise_multiplier: float, releases: Sequence[tuple[int, int]], delta: float
) -> float:
    """ε after the ``releases``, each a Gaussian on K of N clients drawn without
    replacement, given as (K, N) (replace-one neighbours)."""
    if not releases:
        return 0.0
    dpa, rdp = _accounting()
    accountant = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    for (sample_size, population), count in sorted(Counter(map(tuple, releases)).items()):
        event = dpa.GaussianDpEvent(noise_multiplier)
        if sample_size < population:  # sampling amplifies privacy only if it leaves some out
            event = dpa.SampledWithoutReplacementDpEvent(population, sample_size, event)
        accountant.compose(event, count)
    return float(accountant.get_epsilon(delta))


def sum_epsilon(releases: Sequence[tuple[int, int]], config: RunConfig) -> float:
    """Central DP's ε at ``dp-delta`` after the run's releases so far."""
    return central_epsilon(config.dp_noise_multiplier, releases, config.dp_delta)


def local_epsilon(noise_multiplier: float, releases: int, delta: float) -> float:
    """ε of one client after ``releases`` Gaussian releases of its own (no amplification)."""
    if releases == 0:
        return 0.0
    dpa, rdp = _accounting()
    accountant = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dpa.GaussianDpEvent(noise_multiplier), releases)
    return float(accountant.get_epsilon(delta))
