"""Aggregation that a few lying clients cannot steer, per parameter group.

Every rule works on the updates Δ_k = w_k − w (the reply minus the global model it was
trained from), one parameter group at a time, so FedReG's base and global head each get
the rule with their own weights (base by |D_k|, head by e_k):

- ``median``: the coordinate-wise median (Yin et al., ICML 2018, "Byzantine-robust
  distributed learning: towards optimal statistical rates", Def. 1), unweighted as there:
  a weighted median would hand a coordinate to any client whose weight reaches half the
  total. The group weights say who votes (a client with weight 0 for a group, such as a
  FedReG client with no rebalanced samples for its head, does not), not how much.
- ``trimmed-mean``: per coordinate, the ⌊β n⌋ largest and smallest values are left out
  (Yin et al. 2018, Def. 2, β = ``trim-fraction``) and the rest averaged with the
  group weights, renormalised per coordinate.
- ``krum`` / ``multi-krum``: each update scored by the summed squared distances to its
  n − f − 2 nearest others (Blanchard et al., NeurIPS 2017, "Machine learning with
  adversaries: Byzantine tolerant gradient descent", f = ``krum-byzantine``); Krum takes
  the best-scored update, Multi-Krum averages the m best (``multi-krum-keep``; 0: n − f)
  with the group weights. Scores are unweighted, as in the paper.
- ``norm-clip``: each update scaled down to at most ``clip-norm`` in L2 norm, then the
  weighted average (Sun et al. 2019, "Can you really backdoor federated learning?",
  norm-difference clipping); ``clip-norm = 0`` clips at the round's median norm, as FLAME
  does (Nguyen et al., USENIX Security 2022).
- ``cosine-trust``: our variant of FLTrust (Cao et al., NDSS 2021, "FLTrust: Byzantine-
  robust federated learning via trust bootstrapping"). Each update's trust is the ReLU
  of its cosine with a reference direction; updates are clipped at a reference norm
  and averaged with weight × trust. FLTrust's reference is an update the server trains
  on a root dataset of its own; this one needs no data on the server, so the reference
  is the round's coordinate-wise median (Yin et al. 2018), and the norm is the round's
  median norm (or ``clip-norm``) as in ``norm-clip``. An update that points away from
  what most clients agree on, as a sign-flipped one does, gets no weight at all.
- ``fltrust``: FLTrust itself (Alg. 1), the reference trained by the server on its root
  dataset (``strategies/root_reference.py``); every update is rescaled to that update's
  norm and averaged with weight × trust.
- ``flame``: FLAME's filtering and clipping (Nguyen et al., USENIX Security 2022,
  "FLAME: taming backdoors in federated learning", Alg. 1): only the models of the
  tightest majority by cosine distance are admitted (:func:`majority_cluster`); their
  updates are clipped at the median norm of all the round's updates and averaged (with
  the group weights: ours; FLAME's average is plain), and ``flame-noise`` λ adds
  Gaussian noise of standard deviation λ × that median.
- ``lfr``: our variant of LFR, the loss-function-based rejection of Fang et al. (USENIX
  Security 2020, "Local model poisoning attacks to Byzantine-robust federated
  learning"). Each reply's impact is the loss, on the server's root dataset
  (the one ``fltrust`` draws), of the round's weighted average without that reply,
  minus the loss of the average with every reply (:func:`removal_verdicts`). LFR
  rejects the c replies with the lowest impact, c the number of liars assumed
  (``lfr-reject`` = c); with ``lfr-reject = 0``, the default, every reply whose removal
  lowers the loss is rejected, so no c is needed (ours). The kept replies are averaged
  with the group weights, one verdict per reply for all its groups.

:func:`norm_outliers` is the bound every run has on by default (``update-norm-factor``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedreg_app.core.config import RunConfig
from fedreg_app.core.models import group_of
from fedreg_app.core.seeds import rng

Arrays = Mapping[str, np.ndarray]


def group_keys(arrays: Arrays, group: str) -> list[str]:
    return [key for key in arrays if group_of(key) == group]


def flat_updates(replies: Sequence[Arrays], current: Arrays, keys: Sequence[str]) -> np.ndarray:
    """(n, d) float64: each reply's change of ``keys`` from ``current``, flattened (d = 0
    when the replies carry none of the group, as FedSeq's carry no head while it trains
    the base layer by layer)."""
    if not keys:
        return np.zeros((len(replies), 0))
    rows = [
        np.concatenate(
            [
                (np.asarray(r[k], np.float64) - np.asarray(current[k], np.float64)).ravel()
                for k in keys
            ]  # fmt: skip
        )
        for r in replies
    ]
    return np.stack(rows) if rows else np.zeros((0, 0))


def flat_values(current: Arrays, keys: Sequence[str]) -> np.ndarray:
    """(d,) float64: ``current``'s values of ``keys``, flattened as :func:`flat_updates`."""
    if not keys:
        return np.zeros(0)
    return np.concatenate([np.asarray(current[k], np.float64).ravel() for k in keys])


def unflatten(flat: np.ndarray, current: Arrays, keys: Sequence[str]) -> dict[str, np.ndarray]:
    """``current`` + ``flat`` (a change), back into named arrays of ``current``'s dtypes."""
    out, start = {}, 0
    for key in keys:
        reference = np.asarray(current[key])
        size = reference.size
        change = flat[start : start + size].reshape(reference.shape)
        out[key] = (reference.astype(np.float64) + change).astype(reference.dtype)
        start += size
    return out


def weighted_mean(updates: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return (weights / weights.sum()) @ updates


def coordinate_median(updates: np.ndarray) -> np.ndarray:
    return np.median(updates, axis=0)


def trimmed_mean(updates: np.ndarray, weights: np.ndarray, beta: float) -> np.ndarray:
    """Per coordinate, leave out the ⌊β n⌋ smallest and largest values; the weighted
    mean of the rest. The sort is stable, so ties keep the reply order."""
    n = updates.shape[0]
    cut = int(np.floor(beta * n))
    if cut == 0:
        return weighted_mean(updates, weights)
    order = np.argsort(updates, axis=0, kind="stable")
    kept = order[cut : n - cut]  # (n - 2 cut, d) row indices per coordinate
    values = np.take_along_axis(updates, kept, axis=0)
    kept_weights = weights[kept]
    return (values * kept_weights).sum(axis=0) / kept_weights.sum(axis=0)


def krum_scores(updates: np.ndarray, byzantine: int) -> np.ndarray:
    """Each update's sum of squared distances to its n − f − 2 nearest others (at least
    one, so that two replies still have a score)."""
    n = updates.shape[0]
    squares = (updates * updates).sum(axis=1)
    distances = np.maximum(squares[:, None] + squares[None, :] - 2.0 * updates @ updates.T, 0.0)
    neighbours = max(1, n - byzantine - 2)
    scores = np.empty(n)
    for i in range(n):
        others = np.delete(distances[i], i)
        scores[i] = np.sort(others)[: min(neighbours, n - 1)].sum() if n > 1 else 0.0
    return scores


def krum_selection(updates: np.ndarray, byzantine: int, keep: int) -> np.ndarray:
    """Indices of the ``keep`` best-scored updates (ties: the earlier reply)."""
    scores = krum_scores(updates, byzantine)
    return np.argsort(scores, kind="stable")[:keep]


def clipped_mean(updates: np.ndarray, weights: np.ndarray, bound: float) -> np.ndarray:
    norms = np.linalg.norm(updates, axis=1)
    if bound <= 0:  # the round's median norm (FLAME)
        bound = float(np.median(norms))
    scale = np.where(norms > bound, bound / np.maximum(norms, 1e-300), 1.0)
    return weighted_mean(updates * scale[:, None], weights)


def median_trust(updates: np.ndarray) -> np.ndarray:
    """``cosine-trust``'s trust in each update: the ReLU of its cosine with the
    coordinate-wise median; 1 for all where the median is zero (no direction to trust:
    the clipped mean)."""
    reference = coordinate_median(updates)
    if not reference.any():
        return np.ones(updates.shape[0])
    return np.maximum(trust_cosines(updates, reference), 0.0)


def cosine_trust(
    updates: np.ndarray, weights: np.ndarray, bound: float, trust: np.ndarray | None = None
) -> np.ndarray:
    """Clipped updates averaged with weight × ``trust`` (default :func:`median_trust`).
    No update with positive trust leaves the group where it is, as FLTrust does."""
    trusted = weights * (median_trust(updates) if trust is None else trust)
    if not trusted.sum() > 0:
        return np.zeros(updates.shape[1])
    return clipped_mean(updates, trusted, bound)


def fltrust(
    updates: np.ndarray, weights: np.ndarray, reference: np.ndarray, trust: np.ndarray | None = None
) -> np.ndarray:
    """FLTrust's aggregate (Cao et al. 2021, Alg. 1): each update rescaled to the norm
    of the server's ``reference`` update and averaged with its weight times its trust
    (default: the ReLU of its cosine with the reference). No update with positive trust
    leaves the group where it is."""
    if trust is None:
        trust = np.maximum(trust_cosines(updates, reference), 0.0)
    norms = np.linalg.norm(updates, axis=1)
    scale = np.divide(np.linalg.norm(reference), norms, out=np.zeros_like(norms), where=norms > 0)
    trusted = weights * trust
    if not trusted.sum() > 0:
        return np.zeros(updates.shape[1])
    return weighted_mean(updates * scale[:, None], trusted)


def trust_cosines(updates: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Each update's cosine with ``reference`` (0 for an update of norm 0)."""
    norms = np.linalg.norm(updates, axis=1) * np.linalg.norm(reference)
    dots = updates @ reference
    return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)


def cosine_distances(vectors: np.ndarray) -> np.ndarray:
    """(n, n): 1 − the cosine of each pair (1 where either vector is zero)."""
    norms = np.linalg.norm(vectors, axis=1)
    unit = np.divide(vectors, norms[:, None], out=np.zeros_like(vectors), where=norms[:, None] > 0)
    distances = 1.0 - unit @ unit.T
    distances[(norms == 0)[:, None] | (norms == 0)[None, :]] = 1.0
    np.fill_diagonal(distances, 0.0)
    return np.maximum(distances, 0.0)


def majority_cluster(models: np.ndarray) -> np.ndarray:
    """FLAME's filter: which of the n ``models`` (rows) are admitted.

    FLAME clusters the models by their pairwise cosine distances with HDBSCAN, minimum
    cluster size ⌊n/2⌋ + 1, one sample per core and a single cluster allowed, and admits
    the cluster's members. With one sample per core HDBSCAN's mutual reachability is the
    distance itself (single linkage); with a minimum size above n/2 there is one
    cluster, whose members are the models still together when it breaks up. Those are
    the first single-linkage component (closest pairs joined first) to hold ⌊n/2⌋ + 1
    models, which is what this computes (scikit-learn's ``HDBSCAN`` labels the same)."""
    n = models.shape[0]
    need = n // 2 + 1
    if n <= 2:
        return np.ones(n, dtype=bool)
    distances = cosine_distances(models)
    rows, cols = np.triu_indices(n, k=1)
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    size = [1] * n
    for edge in np.argsort(distances[rows, cols], kind="stable"):
        a, b = root(int(rows[edge])), root(int(cols[edge]))
        if a == b:
            continue
        parent[b] = a
        size[a] += size[b]
        if size[a] >= need:
            return np.asarray([root(i) == a for i in range(n)])
    return np.ones(n, dtype=bool)  # unreachable: the last union joins all n


def flame(
    updates: np.ndarray,
    weights: np.ndarray,
    admitted: np.ndarray,
    noise: float = 0.0,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """FLAME's aggregate of the ``admitted`` updates: each clipped at the median norm of
    all the round's updates, averaged with its weight, plus Gaussian noise of standard
    deviation ``noise`` × that median."""
    bound = float(np.median(np.linalg.norm(updates, axis=1)))
    change = clipped_mean(updates, weights * admitted, bound)
    if noise > 0 and bound > 0:
        if rng is None:
            raise ValueError("flame-noise > 0 needs a seeded generator")
        change = change + rng.normal(0.0, noise * bound, change.shape)
    return change


#: The rules that weight each update by its trust (the ReLU of a cosine; FLAME's: 1
#: admitted, 0 not).
TRUST_RULES = ("cosine-trust", "fltrust", "flame")
#: The rules whose trust is one verdict per reply, given by the caller (``lfr``'s: 1
#: kept, 0 rejected), rather than judged here from the group's updates.
VERDICT_RULES = ("lfr",)


def averaged_groups(
    replies: Sequence[Arrays],
    weights: Mapping[str, Sequence[float]],
    current: Arrays,
    left_out: int | None = None,
) -> dict[str, np.ndarray]:
    """Each group's weighted average of the replies (group -> each reply's weight),
    without reply ``left_out``; a group that no remaining reply has weight for keeps
    ``current``'s values."""
    out: dict[str, np.ndarray] = {}
    for group, group_weights in weights.items():
        keys = [k for k in group_keys(replies[0], group) if k in current] if replies else []
        chosen = [i for i, w in enumerate(group_weights) if w > 0 and i != left_out]
        if not keys:
            continue
        if not chosen:
            out.update({k: np.asarray(current[k]) for k in keys})
            continue
        shares = np.asarray([group_weights[i] for i in chosen], np.float64)
        shares = shares / shares.sum()
        for key in keys:
            total = sum(s * np.asarray(replies[i][key], np.float64)
                        for s, i in zip(shares, chosen, strict=True))  # fmt: skip
            out[key] = np.asarray(total).astype(np.asarray(current[key]).dtype)
    return out


def removal_verdicts(
    replies: Sequence[Arrays],
    weights: Mapping[str, Sequence[float]],
    current: Arrays,
    loss_of: Callable[[dict[str, np.ndarray]], float],
    reject: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """``lfr``: per reply, its impact (the loss ``loss_of`` gives the weighted average
    without it, minus the loss with every reply) and its verdict, 0 (rejected) or 1:
    with ``reject`` = c > 0, the c replies whose removal gives the lowest loss are
    rejected, whatever its sign (Fang et al.'s LFR; at least one reply is kept); with 0,
    every reply whose removal lowers the loss. A loss that is not finite counts as +inf,
    so a reply that alone makes the average blow up is the one left out, and the others
    are kept."""

    def loss(left_out: int | None) -> float:
        value = float(loss_of({**current, **averaged_groups(replies, weights, current, left_out)}))
        return value if np.isfinite(value) else float("inf")

    everyone = loss(None)
    without = np.asarray([loss(i) for i in range(len(replies))], np.float64)
    if reject > 0:
        verdicts = np.ones(len(replies))
        verdicts[np.argsort(without, kind="stable")[: min(reject, len(replies) - 1)]] = 0.0
    else:
        verdicts = np.where(without < everyone, 0.0, 1.0)
    with np.errstate(invalid="ignore"):
        impacts = without - everyone  # inf - inf: nan, for a reply that changes nothing
    return impacts, verdicts


def update_trust(
    updates: np.ndarray,
    config: RunConfig,
    reference: np.ndarray | None = None,
    start: np.ndarray | None = None,
) -> np.ndarray:
    """The trust a trust rule gives each update (before its group weight): under
    ``flame``, 1 for the models (``start`` + update, ``start`` the group's global values)
    that :func:`majority_cluster` admits and 0 for the others; the ReLU of its cosine
    with the server's update (``fltrust``); else :func:`median_trust` (a group the
    server's training did not move is judged as ``cosine-trust`` judges it)."""
    if config.aggregation == "flame":
        models = updates if start is None else updates + start[None, :]
        return majority_cluster(models).astype(np.float64)
    if config.aggregation == "fltrust" and reference is not None and reference.any():
        return np.maximum(trust_cosines(updates, reference), 0.0)
    return median_trust(updates)


def robust_change(
    updates: np.ndarray,
    weights: np.ndarray,
    config: RunConfig,
    reference: np.ndarray | None = None,
    trust: np.ndarray | None = None,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """The group's aggregated change under ``aggregation`` (never "mean"). ``reference``:
    the server's own update of the group (``fltrust``); where it did not move the group
    (a group the root training does not train), the round's median stands in for it, as
    in ``cosine-trust``. ``trust``: the trust rules' :func:`update_trust`, where the
    caller has it already (``flame`` clusters the updates themselves without it), or
    ``lfr``'s verdicts (required there). ``rng``: the seeded generator of ``flame``'s noise."""
    rule = config.aggregation
    if rule in VERDICT_RULES:
        if trust is None:
            raise ValueError(f"aggregation={rule!r} needs each reply's verdict from the server")
        kept = weights * trust
        return weighted_mean(updates, kept) if kept.sum() > 0 else np.zeros(updates.shape[1])
    if rule == "flame":
        admitted = update_trust(updates, config) if trust is None else trust
        return flame(updates, weights, admitted, config.flame_noise, rng)
    if rule in TRUST_RULES:
        trust = update_trust(updates, config, reference) if trust is None else trust
        if rule == "fltrust" and reference is not None and reference.any():
            return fltrust(updates, weights, reference, trust)
        return cosine_trust(updates, weights, config.clip_norm, trust)
    if rule == "median":
        return coordinate_median(updates)
    if rule == "trimmed-mean":
        return trimmed_mean(updates, weights, config.trim_fraction)
    if rule in ("krum", "multi-krum"):
        n = updates.shape[0]
        keep = 1 if rule == "krum" else (config.multi_krum_keep or n - config.krum_byzantine)
        chosen = krum_selection(updates, config.krum_byzantine, max(1, min(keep, n)))
        return weighted_mean(updates[chosen], weights[chosen])
    if rule == "norm-clip":
        return clipped_mean(updates, weights, config.clip_norm)
    raise ValueError(f"aggregation={rule!r} has no robust rule")


def robust_aggregate(
    replies: Sequence[Arrays],
    weights: Mapping[str, Sequence[float]],
    current: Arrays,
    config: RunConfig,
    reference: Arrays | None = None,
    trust: dict[str, dict[int, float]] | None = None,
    server_round: int = 0,
    verdicts: Sequence[float] | None = None,
) -> dict[str, np.ndarray]:
    """New values of each group in ``weights`` (group -> each reply's weight): the global
    model plus the rule's change, over the replies with a positive weight for it.
    ``reference``: the server's own trained values (``fltrust``), judged as a reply.
    ``trust``, filled under a trust rule: group -> {reply index: its trust}.
    ``server_round`` seeds ``flame``'s noise, with the group's place among the groups.
    ``verdicts``: ``lfr``'s, one per reply (1 kept, 0 rejected; :func:`removal_verdicts`)."""
    out: dict[str, np.ndarray] = {}
    for index, (group, group_weights) in enumerate(weights.items()):
        keys = group_keys(replies[0], group)
        voters = [i for i, w in enumerate(group_weights) if w > 0]
        if not keys or not voters:
            continue
        updates = flat_updates([replies[i] for i in voters], current, keys)
        chosen_weights = np.asarray([group_weights[i] for i in voters], np.float64)
        own = None
        if reference is not None and all(key in reference for key in keys):
            own = flat_updates([reference], current, keys)[0]
        start = flat_values(current, keys) if config.aggregation == "flame" else None
        given = (update_trust(updates, config, own, start)
                 if config.aggregation in TRUST_RULES else None)  # fmt: skip
        if config.aggregation in VERDICT_RULES and verdicts is not None:
            given = np.asarray([verdicts[i] for i in voters], np.float64)
        noise_rng = (rng(config.seed, "flame-noise", server_round, index)
                     if config.aggregation == "flame" and config.flame_noise else None)  # fmt: skip
        change = robust_change(updates, chosen_weights, config, own, given, noise_rng)
        out.update(unflatten(change, current, keys))
        if trust is not None and given is not None:
            trust[group] = {i: float(t) for i, t in zip(voters, given, strict=True)}
    return out


# ------------------------------------------------------------- the bound on every run
def group_norms(replies: Sequence[Arrays], current: Arrays, group: str) -> list[float]:
    """Each reply's L2 norm of its change of ``group``'s entries."""
    keys = [k for k in group_keys(replies[0], group) if k in current] if replies else []
    return [float(np.linalg.norm(row)) for row in flat_updates(replies, current, keys)]


#: The least reference of the bound, as a share of the group's own weights' norm: where
#: the round's other replies barely moved a group (a module whose gradient is still near
#: zero, as FedCP's policy network in a client's first steps), an honest change of a
#: thousandth of the weights is not judged against their near-zero median. Our choice.
REFERENCE_FLOOR = 1e-3


def weights_norm(replies: Sequence[Arrays], current: Arrays, group: str) -> float:
    """The L2 norm of the global model's entries of ``group`` that the replies carry."""
    keys = [k for k in group_keys(replies[0], group) if k in current] if replies else []
    return float(np.sqrt(sum(float(np.square(current[k], dtype=np.float64).sum()) for k in keys)))


def norm_ratios(
    norms: Sequence[float],
    weights: Sequence[float],
    fallback: float | None = None,
    floor: float = 0.0,
) -> dict[int, tuple[float, float]]:
    """Each reply's (norm, reference): the reference is the median of the round's other
    replies' norms, at least ``floor``. Only replies with a positive weight for the group
    are compared or used as reference; a reply with no such other is compared with
    ``fallback`` (an earlier round's median) when there is one. A reference of 0 (nobody
    else moved the group, and no floor) judges nothing: such replies are left out."""
    voters = [i for i, w in enumerate(weights) if w > 0]
    found: dict[int, tuple[float, float]] = {}
    for i in voters:
        others = [norms[j] for j in voters if j != i]
        reference = float(np.median(others)) if others else fallback
        if reference is not None and max(reference, floor) > 0:
            found[i] = (norms[i], max(reference, floor))
    return found


def norm_outliers(
    norms: Sequence[float],
    weights: Sequence[float],
    factor: float,
    fallback: float | None = None,
) -> dict[int, tuple[float, float]]:
    """Replies whose change is more than ``factor`` times their reference (see
    :func:`norm_ratios`): index -> (its norm, the reference)."""
    return {
        i: (norm, reference)
        for i, (norm, reference) in norm_ratios(norms, weights, fallback).items()
        if not norm <= factor * reference  # NaN-safe: inf or NaN is out
    }


@dataclass
class Bounded:
    """What :func:`bound` found in a round: the refused replies (index -> why) and, per
    group, the largest ratio among the accepted ones (how close honest clients came)."""

    refused: dict[int, str] = field(default_factory=dict)
    ratio_max: dict[str, float] = field(default_factory=dict)


def bound(
    replies: Sequence[Arrays],
    metrics: Sequence[Mapping[str, float]],
    current: Arrays,
    group_weights: Mapping[str, str],
    factor: float,
    medians: dict[str, float],
) -> Bounded:
    """The bound on every update (``update-norm-factor``), per group: a reply whose
    change is more than ``factor`` times the median of the round's other replies is
    refused. ``medians`` (group -> the last round's median of the accepted norms) is the
    reference of a lone reply, and is updated in place for the next round."""
    found = Bounded()
    for group, key in group_weights.items():
        weights = [float(m[key]) for m in metrics]
        norms = group_norms(replies, current, group)
        floor = REFERENCE_FLOOR * weights_norm(replies, current, group)
        ratios = norm_ratios(norms, weights, medians.get(group), floor)
        out = {i for i, (norm, reference) in ratios.items() if not norm <= factor * reference}
        alone = len(ratios) == 1
        of = "the last round's median" if alone else "the median of the round's other replies"
        for i in sorted(out):
            norm, reference = ratios[i]
            found.refused.setdefault(
                i,
                f"its update of {group} has L2 norm {norm:.4g}, more than "
                f"update-norm-factor={factor:g} times {reference:.4g}, {of}",
            )
        kept = [norms[i] for i, w in enumerate(weights) if w > 0 and i not in out]
        if kept:
            medians[group] = float(np.median(kept))
        accepted = [norm / reference for i, (norm, reference) in ratios.items() if i not in out]
        if accepted:
            found.ratio_max[group] = round(max(accepted), 3)
    return found
