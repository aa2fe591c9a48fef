"""Clients that lie: the robust aggregation rules, the bound on every update, and the
simulated attacks that measure them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ConfigRecord, RecordDict

from clients.attacks import REPLAYED_UPDATE, flipped, lie
from fedreg_app.core.config import ConfigError
from fedreg_app.core.data import DatasetInfo, PartitionKey, TensorData, split_sizes
from fedreg_app.core.models import BASE, HEAD_G, build_model
from fedreg_app.core.protocol import (
    EFFECTIVE_EXAMPLES,
    NUM_EXAMPLES,
    NUM_PROCESSED,
)
from fedreg_app.core.records import from_record, to_record
from fedreg_app.core.robustness import AGGREGATIONS, attackers
from fedreg_app.registry import load_config
from strategies.fedreg import FedReGStrategy
from strategies.robust import (
    bound,
    coordinate_median,
    cosine_trust,
    flame,
    fltrust,
    krum_selection,
    majority_cluster,
    norm_outliers,
    removal_verdicts,
    robust_aggregate,
    robust_change,
    trimmed_mean,
)
from strategies.root_reference import RootReference
from tests.inprocess import final_model, results, run_server, train_reply

CURRENT = {"base.0.weight": np.zeros((2, 2), np.float32), "head_g.0.bias": np.zeros(2, np.float32)}


def reply(base: float, head: float) -> dict[str, np.ndarray]:
    return {"base.0.weight": np.full((2, 2), base, np.float32),
            "head_g.0.bias": np.full(2, head, np.float32)}  # fmt: skip


def config(**keys: Any):
    return load_config({"algo": "fedreg", **keys})


def distance_from(target: float):
    """A stand-in for the root loss: the mean absolute distance of the base from ``target``."""
    return lambda arrays: float(np.abs(arrays["base.0.weight"] - target).mean())


# ------------------------------------------------------------------ the rules
def test_the_median_is_yin_et_al_s_coordinate_wise_median() -> None:
    updates = np.array([[1.0, 5.0], [2.0, -1.0], [100.0, 0.0], [3.0, 2.0]])
    assert np.array_equal(coordinate_median(updates), [2.5, 1.0])


def test_the_trimmed_mean_leaves_out_each_ends_share_then_weights_the_rest() -> None:
    updates = np.array([[1.0], [2.0], [3.0], [1e9], [-1e9]])
    weights = np.array([1.0, 1.0, 2.0, 5.0, 5.0])
    # beta 0.2 of 5 replies: one value left out at each end; (1 + 2 + 2*3) / 4
    assert trimmed_mean(updates, weights, 0.2)[0] == pytest.approx(9 / 4)
    # beta small enough to leave nothing out: the weighted mean
    assert trimmed_mean(updates, weights, 0.1)[0] == pytest.approx(
        float(weights @ updates[:, 0] / 14)
    )


def test_krum_picks_an_update_of_the_majority_and_multi_krum_the_m_best() -> None:
    honest = [[1.0, 1.0], [1.1, 0.9], [0.9, 1.1], [1.0, 1.05]]
    updates = np.array([*honest, [50.0, -50.0]])
    assert krum_selection(updates, byzantine=1, keep=1)[0] in range(4)
    assert set(krum_selection(updates, byzantine=1, keep=4)) == {0, 1, 2, 3}


@pytest.mark.parametrize("rule", [rule for rule in AGGREGATIONS if rule != "mean"])
def test_each_rule_keeps_a_1e30_reply_out_of_both_groups(rule: str) -> None:
    replies = [reply(1.0, 2.0), reply(1.2, 2.2), reply(0.8, 1.8), reply(1.1, 2.1),
               reply(1e30, -1e30)]  # fmt: skip
    weights = {"base": [1.0] * 5, "head_g": [1.0] * 5}
    settings = config(aggregation=rule, **{"krum-byzantine": 1})
    server = reply(1.0, 2.0) if rule == "fltrust" else None  # the server's own update
    verdicts = None
    if rule == "lfr":  # the loss: how far the average's base is from the honest ones'
        _, verdicts = removal_verdicts(replies, weights, CURRENT, distance_from(1.0))
    merged = robust_aggregate(replies, weights, CURRENT, settings, server, None, 0, verdicts)
    assert np.abs(merged["base.0.weight"]).max() < 2
    assert np.abs(merged["head_g.0.bias"]).max() < 3


def test_a_client_with_no_weight_for_a_group_has_no_vote_on_it() -> None:
    """FedReG's head by e_k: a client with e_k = 0 does not vote on head_g's median."""
    replies = [reply(1.0, 5.0), reply(2.0, 6.0), reply(3.0, -100.0)]
    merged = robust_aggregate(
        replies, {"base": [1, 1, 1], "head_g": [1, 1, 0]}, CURRENT, config(aggregation="median")
    )
    assert np.all(merged["base.0.weight"] == 2.0)
    assert np.all(merged["head_g.0.bias"] == 5.5)


def test_norm_clip_clips_at_the_median_norm_and_keeps_the_group_weights() -> None:
    replies = [reply(1.0, 0.0), reply(1.0, 0.0), reply(100.0, 0.0)]
    weights = {"base": [1.0, 1.0, 2.0], "head_g": [1.0, 1.0, 1.0]}
    merged = robust_aggregate(replies, weights, CURRENT, config(aggregation="norm-clip"))
    # the median norm is 2 (a 2x2 of ones): the third is scaled to ones, then (1+1+2)/4
    assert np.allclose(merged["base.0.weight"], 1.0)


def test_cosine_trust_gives_a_sign_flipped_update_no_weight() -> None:
    honest = np.array([[1.0, 2.0, 0.0], [2.0, 1.0, 0.5], [1.5, 1.5, -0.5], [1.0, 1.0, 0.0]])
    flipped = -3.0 * honest[:1]  # reversed (and louder) than client 0's honest update
    weights = np.array([1.0, 2.0, 1.0, 1.0, 4.0])
    merged = cosine_trust(np.vstack([honest, flipped]), weights, bound=0.0)
    # by hand: the reference is the median (1, 1, 0); each honest update's trust is its
    # cosine with it, the flipped one's is 0; clipping at the median norm |(1, 2, 0)|
    reference = np.array([1.0, 1.0, 0.0])
    norms = np.linalg.norm(honest, axis=1)
    trust = honest @ reference / (norms * np.linalg.norm(reference))
    bound = np.median(np.linalg.norm(np.vstack([honest, flipped]), axis=1))
    clipped = honest * np.minimum(1.0, bound / norms)[:, None]
    expected = (weights[:4] * trust) @ clipped / (weights[:4] * trust).sum()
    assert np.allclose(merged, expected)
    assert merged @ flipped[0] < 0  # the liar pulled nothing its way


def test_cosine_trust_with_no_median_direction_is_the_clipped_mean() -> None:
    crossing = np.array([[1.0, 1.0], [-1.0, -1.0], [1.0, 1.0], [-1.0, -1.0], [0.0, 0.0]])
    assert np.array_equal(coordinate_median(crossing), [0.0, 0.0])
    weights = np.array([3.0, 1.0, 1.0, 1.0, 1.0])
    assert np.allclose(cosine_trust(crossing, weights, 0.0), [2 / 7, 2 / 7])


def test_cosine_trust_leaves_a_group_alone_when_every_update_points_away_from_the_median() -> None:
    updates = np.array([[1.0, 1.0, -3.0], [1.0, -3.0, 1.0], [-3.0, 1.0, 1.0]])
    assert np.array_equal(coordinate_median(updates), [1.0, 1.0, 1.0])  # each dot is -1
    assert np.array_equal(cosine_trust(updates, np.ones(3), 0.0), np.zeros(3))


def test_fltrust_rescales_to_the_servers_norm_and_trusts_by_cosine() -> None:
    """Cao et al. 2021, Alg. 1, by hand: the server's update (1, 0); an update along it
    counts at the server's norm, one at 45° with weight cos 45° (and the server's norm),
    one orthogonal or reversed not at all; the group weights multiply the trust."""
    server = np.array([1.0, 0.0])
    updates = np.array([[2.0, 0.0], [0.0, 3.0], [-5.0, 0.0], [1.0, 1.0]])
    weights = np.array([1.0, 1.0, 9.0, 2.0])
    trust = np.array([1.0, 0.0, 0.0, 2 * np.sqrt(0.5)])  # weight x ReLU(cos)
    rescaled = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [np.sqrt(0.5), np.sqrt(0.5)]])
    assert np.allclose(fltrust(updates, weights, server), trust @ rescaled / trust.sum())
    assert np.array_equal(fltrust(-updates[:1], weights[:1], server), [0.0, 0.0])  # none trusted


def test_the_trust_rules_report_each_replys_trust_and_other_rules_none() -> None:
    """Per group and reply: a reply reversed from the rest gets 0, as it had no weight."""
    replies = [reply(1.0, 2.0), reply(1.2, 2.2), reply(0.8, 1.8), reply(-3.0, -6.0)]
    weights = {"base": [1.0] * 4, "head_g": [1.0] * 4}
    for rule, server in (("cosine-trust", None), ("fltrust", reply(1.0, 1.0)), ("flame", None)):
        trust: dict[str, dict[int, float]] = {}
        robust_aggregate(replies, weights, CURRENT, config(aggregation=rule), server, trust)
        assert set(trust) == {"base", "head_g"}
        for given in trust.values():
            assert given[3] == 0 and all(given[i] == pytest.approx(1.0) for i in range(3))
    trust = {}
    robust_aggregate(replies, weights, CURRENT, config(aggregation="median"), None, trust)
    assert trust == {}


def test_flame_admits_the_tightest_majority_by_cosine_distance() -> None:
    """Three models that point one way and two that do not: ⌊5/2⌋ + 1 = 3 are admitted,
    the three; with four close ones, the first three to join (closest pairs first)."""
    models = np.array([[1.0, 0.1], [1.0, 0.12], [1.0, 0.08], [-1.0, 0.5], [0.2, 1.0]])
    assert majority_cluster(models).tolist() == [True, True, True, False, False]
    models = np.array([[1.0, 0.0], [1.0, 0.01], [1.0, 0.03], [1.0, 0.1], [-1.0, 0.0]])
    assert majority_cluster(models).tolist() == [True, True, True, False, False]
    assert majority_cluster(np.ones((2, 3))).tolist() == [True, True]  # ⌊2/2⌋ + 1 = 2
    zero = np.array([[1.0, 0.0], [1.0, 0.1], [0.0, 0.0]])  # a zero model is at distance 1
    assert majority_cluster(zero).tolist() == [True, True, False]


def test_flames_filter_labels_as_scikit_learns_hdbscan_does() -> None:
    """FLAME's HDBSCAN settings (minimum cluster size ⌊n/2⌋ + 1, one sample per core, a
    single cluster allowed) on precomputed cosine distances, against ours, on random
    rounds of honest models around one direction and liars around others."""
    hdbscan = pytest.importorskip("sklearn.cluster").HDBSCAN
    from strategies.robust import cosine_distances

    generator = np.random.default_rng(7)
    for trial in range(60):
        n = int(generator.integers(3, 16))
        liars = int(generator.integers(0, (n - 1) // 2 + 1))
        centre = generator.normal(size=20)
        honest = centre + generator.normal(scale=generator.uniform(0.1, 1.5), size=(n - liars, 20))
        lying = generator.normal(size=(liars, 20)) * 2
        models = np.concatenate([honest, lying])[generator.permutation(n)]
        clusterer = hdbscan(min_cluster_size=n // 2 + 1, min_samples=1, allow_single_cluster=True,
                            metric="precomputed", copy=True)  # fmt: skip
        labels = clusterer.fit(cosine_distances(models)).labels_
        assert (labels >= 0).tolist() == majority_cluster(models).tolist(), trial


def test_flame_clips_the_admitted_at_the_median_norm_of_all_and_weights_them() -> None:
    updates = np.array([[3.0, 0.0], [1.0, 0.0], [2.0, 0.0], [-9.0, 0.0]])
    admitted = np.array([1.0, 1.0, 1.0, 0.0])
    # median norm of all four: 2.5; clipped: 2.5, 1, 2 (the liar left out), weights 1, 2, 1
    change = flame(updates, np.array([1.0, 2.0, 1.0, 5.0]), admitted)
    assert change == pytest.approx([(2.5 + 2 * 1.0 + 2.0) / 4, 0.0])


def test_flames_noise_is_lambda_times_the_median_norm_and_seeded() -> None:
    updates = np.zeros((4, 20_000))
    updates[:, 0] = [1.0, 2.0, 3.0, 4.0]  # median norm 2.5
    admitted = np.ones(4)
    plain = flame(updates, np.ones(4), admitted)
    noisy = flame(updates, np.ones(4), admitted, 0.01, np.random.default_rng(1))
    assert (noisy - plain)[1:].std() == pytest.approx(0.025, rel=0.03)
    again = flame(updates, np.ones(4), admitted, 0.01, np.random.default_rng(1))
    assert np.array_equal(noisy, again)
    with pytest.raises(ValueError, match="seeded"):
        flame(updates, np.ones(4), admitted, 0.01)
    replies = [reply(1.0, 2.0), reply(1.2, 2.2), reply(0.8, 1.8)]
    weights = {"base": [1.0] * 3, "head_g": [1.0] * 3}
    settings = config(aggregation="flame", **{"flame-noise": 0.1})
    rounds = [
        robust_aggregate(replies, weights, CURRENT, settings, server_round=r) for r in (1, 1, 2)
    ]
    assert np.array_equal(rounds[0]["base.0.weight"], rounds[1]["base.0.weight"])
    assert not np.array_equal(rounds[0]["base.0.weight"], rounds[2]["base.0.weight"])


def test_flame_leaves_a_label_flipping_minority_out_of_the_head() -> None:
    """Honest heads move one way from the global model, two liars' another: FLAME's
    admitted set is the honest majority, on the models (global + update) as in FLAME."""
    current = {"base.0.weight": np.ones((2, 2), np.float32),
               "head_g.0.bias": np.array([1.0, 1.0], np.float32)}  # fmt: skip
    honest = [np.array([1.5, 0.6]), np.array([1.6, 0.5]), np.array([1.4, 0.55])]
    liars = [np.array([0.5, 1.5]), np.array([0.45, 1.6])]
    replies = [{"base.0.weight": np.full((2, 2), 1.1, np.float32),
                "head_g.0.bias": head.astype(np.float32)} for head in honest + liars]  # fmt: skip
    trust: dict[str, dict[int, float]] = {}
    merged = robust_aggregate(replies, {"base": [1.0] * 5, "head_g": [1.0] * 5}, current,
                              config(aggregation="flame"), None, trust)  # fmt: skip
    assert trust["head_g"] == {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.0, 4: 0.0}
    assert merged["head_g.0.bias"][0] > 1.0 > merged["head_g.0.bias"][1]


def test_lfr_rejects_each_reply_whose_removal_lowers_the_loss_of_the_average() -> None:
    """Average of the four bases 2.0, loss 1.0. Without the 5.0 reply the average is
    1.0 and the loss 0: it is rejected. Without any other the loss rises: kept. The kept
    replies are then averaged with their group weights, the head's by its own."""
    replies = [reply(1.0, 1.0), reply(1.2, 3.0), reply(0.8, 2.0), reply(5.0, 9.0)]
    weights = {"base": [0.25] * 4, "head_g": [0.5, 0.25, 0.25, 0.0]}
    impacts, verdicts = removal_verdicts(replies, weights, CURRENT, distance_from(1.0))
    assert verdicts.tolist() == [1.0, 1.0, 1.0, 0.0]
    assert impacts[3] == pytest.approx(-1.0) and (impacts[:3] > 0).all()
    merged = robust_aggregate(replies, weights, CURRENT, config(aggregation="lfr"),
                              None, None, 0, verdicts.tolist())  # fmt: skip
    assert np.allclose(merged["base.0.weight"], 1.0)
    assert np.allclose(merged["head_g.0.bias"], (0.5 * 1.0 + 0.25 * 3.0 + 0.25 * 2.0) / 1.0)


def test_lfr_with_c_rejects_the_c_replies_whose_removal_helps_most() -> None:
    """Fang et al.'s LFR: c = 2 rejects the two lowest losses-without, even one whose
    removal raises the loss; c never rejects every reply."""
    replies = [reply(1.0, 1.0), reply(1.3, 1.0), reply(0.9, 1.0), reply(5.0, 1.0)]
    weights = {"base": [0.25] * 4, "head_g": [0.25] * 4}
    impacts, verdicts = removal_verdicts(replies, weights, CURRENT, distance_from(1.0), 2)
    assert verdicts.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert impacts[1] > 0  # rejected all the same: it is the second most harmful
    _, verdicts = removal_verdicts(replies, weights, CURRENT, distance_from(1.0), 9)
    assert verdicts.sum() == 1


def test_lfr_counts_a_loss_that_is_not_finite_as_the_worst() -> None:
    """A reply that alone makes the average's loss NaN is rejected; the others, whose
    removal leaves it NaN, are kept rather than judged by NaN comparisons."""
    replies = [reply(1.0, 1.0), reply(1.2, 1.0), reply(np.nan, 1.0)]
    weights = {"base": [1 / 3] * 3, "head_g": [1 / 3] * 3}
    _, verdicts = removal_verdicts(replies, weights, CURRENT, distance_from(1.0))
    assert verdicts.tolist() == [1.0, 1.0, 0.0]


def test_lfr_keeps_the_global_model_when_every_reply_is_rejected() -> None:
    updates = np.array([[1.0, 2.0], [3.0, 4.0]])
    change = robust_change(updates, np.ones(2), config(aggregation="lfr"), None, np.zeros(2))
    assert np.array_equal(change, [0.0, 0.0])
    with pytest.raises(ValueError, match="verdict"):
        robust_change(updates, np.ones(2), config(aggregation="lfr"))


def test_fltrust_judges_a_group_the_server_did_not_move_by_the_median() -> None:
    """A group the root training leaves where it was (no reference direction): judged
    as `cosine-trust` judges it."""
    updates = np.array([[1.0, 2.0], [2.0, 1.0], [-3.0, -3.0]])
    weights = np.ones(3)
    settings = config(aggregation="fltrust")
    expected = cosine_trust(updates, weights, 0.0)
    assert np.array_equal(robust_change(updates, weights, settings, np.zeros(2)), expected)
    assert np.array_equal(robust_change(updates, weights, settings, None), expected)


def test_fltrust_trains_its_reference_on_a_seeded_root_sample_of_the_train_union() -> None:
    """The root dataset: fltrust-root-samples drawn once from the union, the same for the
    same seed; the server's update: the same for the same round (a resumed run aggregates
    as the uninterrupted one), another for another round, and the server's own model is
    not moved."""
    generator = torch.Generator().manual_seed(0)
    union = TensorData(torch.randn(500, 1, 28, 28, generator=generator),
                       torch.randint(0, 10, (500,), generator=generator))  # fmt: skip
    settings = config(aggregation="fltrust", **{"fltrust-root-samples": 40, "local-epochs": 1})
    reference = RootReference(settings, union)
    assert len(reference.root) == 40
    assert torch.equal(RootReference(settings, union).root.y, reference.root.y)
    assert len(RootReference(settings, TensorData(union.x[:30], union.y[:30])).root) == 30
    server = build_model(DatasetInfo(10, 1, 28, 28), 2, 0, True)
    before = {k: v.clone() for k, v in server.state_dict().items()}
    current = server.group_state(BASE, HEAD_G)
    first = reference.trained(server, current, 1, [40])
    assert set(first) == set(current)
    assert all(
        np.array_equal(first[k], v) for k, v in reference.trained(server, current, 1, [40]).items()
    )
    assert any(not np.array_equal(first[k], v)
               for k, v in reference.trained(server, current, 2, [40]).items())  # fmt: skip
    assert not np.allclose(first["head_g.0.weight"], current["head_g.0.weight"])  # it trained
    assert all(torch.equal(v, server.state_dict()[k]) for k, v in before.items())
    # as much as the round's median client trained: 130 samples is 3 passes over 40
    assert reference.passes([40, 130, 1000]) == 3 and reference.passes([5]) == 1
    longer = reference.trained(server, current, 1, [400])
    moved = [
        np.linalg.norm(a["head_g.0.weight"] - current["head_g.0.weight"]) for a in (first, longer)
    ]
    assert moved[1] > moved[0]


def test_fedreg_aggregates_each_group_with_the_rule_and_its_own_weights() -> None:
    strategy = FedReGStrategy(config(aggregation="trimmed-mean", **{"trim-fraction": 0.0}))
    strategy._current = dict(CURRENT)
    updates = [(reply(1.0, 10.0), {NUM_EXAMPLES: 1, "effective-examples": 3}),
               (reply(3.0, 20.0), {NUM_EXAMPLES: 3, "effective-examples": 1})]  # fmt: skip
    merged = strategy.aggregate_updates(1, updates)
    assert np.allclose(merged["base.0.weight"], (1 * 1 + 3 * 3) / 4)  # by |D_k|
    assert np.allclose(merged["head_g.0.bias"], (3 * 10 + 1 * 20) / 4)  # by e_k


# ------------------------------------------------------------------ the bound
def test_the_bound_finds_a_huge_update_and_leaves_honest_spread_alone() -> None:
    norms = [1.0, 3.0, 40.0, 2.0, 1e30]
    assert list(norm_outliers(norms, [1] * 5, factor=100)) == [4]
    assert norm_outliers([1.0, 3.0, 40.0, 2.0], [1] * 4, factor=100) == {}


def test_the_bound_compares_a_lone_reply_with_the_last_rounds_median() -> None:
    assert list(norm_outliers([1e30], [1], factor=100, fallback=2.0)) == [0]
    assert norm_outliers([1e30], [1], factor=100) == {}  # nothing to compare with yet
    assert norm_outliers([5.0, 1e30], [1, 0], factor=100, fallback=2.0) == {}  # weight 0


def test_the_bound_judges_each_group_and_keeps_the_median_for_a_lone_reply() -> None:
    """Round 1: four replies, the fourth's head is 1e30 off (its base honest): refused for
    the head. Round 2: a lone reply 1e30 off is judged against round 1's median."""
    replies = [reply(1.0, 1.0), reply(1.1, 2.0), reply(0.9, 1.5), reply(1.0, 1e30)]
    metrics = [{NUM_EXAMPLES: 10, "effective-examples": 5}] * 4
    weights = {"base": NUM_EXAMPLES, "head_g": "effective-examples"}
    medians: dict[str, float] = {}
    first = bound(replies, metrics, CURRENT, weights, 100.0, medians)
    assert list(first.refused) == [3] and "its update of head_g has L2 norm" in first.refused[3]
    assert set(first.ratio_max) == {"base", "head_g"} and first.ratio_max["head_g"] < 2
    assert medians["head_g"] == pytest.approx(np.linalg.norm([1.5, 1.5]))  # the honest three
    second = bound([reply(1e30, 1.0)], metrics[:1], CURRENT, weights, 100.0, medians)
    assert "more than update-norm-factor=100 times 2, the last round's median" in \
        second.refused[0]  # fmt: skip


def test_the_bound_is_nan_safe_and_off_at_zero() -> None:
    assert list(norm_outliers([1.0, 1.0, float("inf")], [1, 1, 1], factor=100)) == [2]
    strategy = FedReGStrategy(config(**{"update-norm-factor": 0.0}))
    assert strategy.norm_outliers([object()]) == {}  # off: the replies are not even read


def test_checks_bound_and_aggregation_decode_each_reply_once(monkeypatch) -> None:
    strategy = FedReGStrategy(config())
    strategy._current = dict(CURRENT)
    counts = {NUM_EXAMPLES: 10, EFFECTIVE_EXAMPLES: 5, NUM_PROCESSED: 20}
    messages = [train_reply(i, reply(v, v), **counts) for i, v in enumerate((1.0, 2.0, 3.0))]
    decoded = []
    numpy = Array.numpy
    monkeypatch.setattr(Array, "numpy", lambda self: decoded.append(self) or numpy(self))
    for msg in messages:  # what the reply checks read
        assert strategy.reply_arrays(msg) is strategy.reply_arrays(msg)
    assert strategy.norm_outliers(messages) == {}
    aggregated, _ = strategy.aggregate_train(1, messages)
    assert len(decoded) == 2 * len(messages)  # two arrays a reply, each decoded once
    np.testing.assert_allclose(from_record(aggregated)["base.0.weight"], 2.0)
    strategy.configure_train(2, to_record(CURRENT), ConfigRecord(), grid=None)
    assert strategy._decoded == {}  # a new round decodes its own replies


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"aggregation": "avg"}, "aggregation='avg'"),
        ({"trim-fraction": 0.5}, "trim-fraction=0.5"),
        ({"update-norm-factor": 0.5}, "update-norm-factor=0.5"),
        ({"krum-byzantine": -1}, "krum-byzantine=-1"),
        ({"clip-norm": -1.0}, "clip-norm=-1.0"),
        ({"fltrust-root-samples": 0}, "fltrust-root-samples=0"),
        ({"flame-noise": -0.1}, "flame-noise=-0.1"),
        ({"lfr-reject": -1}, "lfr-reject=-1"),
        ({"attack": "flood"}, "attack='flood'"),
        ({"attack": "scale"}, "attack-fraction=0.0"),
        ({"attack-fraction": 1.5}, "attack-fraction=1.5"),
        ({"attack-scale": 0.0}, "attack-scale=0.0"),
        (
            {
                "aggregation": "median",
                "dp-mode": "central",
                "dp-noise-multiplier": 1.0,
                "dp-clip": 1.0,
                "dp-delta": 1e-5,
            },
            "with dp-mode='central'",
        ),  # fmt: skip
        ({"algo": "local", "aggregation": "median"}, "no client update reaches the server"),
    ],
)
def test_bad_robustness_settings_name_the_key(keys: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(".", r"\.")):
        settings = config(**keys)
        from fedreg_app.registry import get_algorithm

        get_algorithm(settings.algo).strategy.check_config(settings)


# ------------------------------------------------------------------ attacks
def test_the_liars_are_a_seeded_share_of_the_partitions() -> None:
    liars = attackers(config(attack="scale", **{"attack-fraction": 0.2}), 20)
    assert len(liars) == 4
    assert liars == attackers(config(attack="sign-flip", **{"attack-fraction": 0.2}), 20)
    assert liars != attackers(config(attack="scale", seed=1, **{"attack-fraction": 0.2}), 20)
    assert attackers(config(), 20) == frozenset()


def test_label_flipping_maps_y_to_c_minus_1_minus_y() -> None:
    train = TensorData(torch.zeros(3, 1, 2, 2, dtype=torch.uint8), torch.tensor([0, 3, 9]))
    assert flipped(train, 10).y.tolist() == [9, 6, 0]


@pytest.mark.parametrize(
    ("attack", "expected"),
    [("scale", 10.0), ("sign-flip", -1.0)],
)
def test_scaling_and_sign_flipping_act_on_the_update(attack: str, expected: float) -> None:
    sent, trained = reply(1.0, 1.0), reply(1.5, 0.5)
    lied = lie(trained, sent, config(attack=attack, **{"attack-fraction": 0.1}), RecordDict(), 0, 1)
    assert np.allclose(lied["base.0.weight"], 1.0 + expected * 0.5)
    assert np.allclose(lied["head_g.0.bias"], 1.0 + expected * -0.5)


def test_noise_has_the_honest_updates_spread_and_is_seeded() -> None:
    sent = {"w": np.zeros(10_000, np.float32)}
    trained = {"w": np.random.default_rng(0).normal(0, 0.3, 10_000).astype(np.float32)}
    settings = config(attack="noise", **{"attack-fraction": 0.1})
    lied = lie(trained, sent, settings, RecordDict(), 0, 1)["w"]
    assert (
        abs(float(lied.std()) - 0.3) < 0.01
        and abs(float(np.corrcoef(lied, trained["w"])[0, 1])) < 0.05
    )
    assert np.array_equal(lied, lie(trained, sent, settings, RecordDict(), 0, 1)["w"])


def test_a_replaying_client_sends_its_first_update_again() -> None:
    settings, state = config(attack="replay", **{"attack-fraction": 0.1}), RecordDict()
    first = lie(reply(1.5, 1.0), reply(1.0, 1.0), settings, state, 0, 1)
    assert np.allclose(first["base.0.weight"], 1.5) and REPLAYED_UPDATE in state
    later = lie(reply(9.0, 9.0), reply(2.0, 2.0), settings, state, 0, 5)
    assert np.allclose(later["base.0.weight"], 2.5) and np.allclose(later["head_g.0.bias"], 2.0)


# ------------------------------------------------------------ through a real round
@pytest.fixture
def federation(grey_dataset: Path, tmp_path: Path) -> dict[str, Any]:
    """Four clients, all trained every round, on the in-process federation."""
    return {
        "algo": "fedreg", "dataset-path": str(grey_dataset), "local-epochs": 1,
        "fraction-train": 1.0, "min-partition-size": 5, "num-server-rounds": 2, "seed": 5,
        "results-dir": str(tmp_path / "results"),
    }  # fmt: skip


def test_a_scaling_liar_is_refused_every_round_and_the_model_stays_sound(
    federation: dict[str, Any], tmp_path: Path
) -> None:
    """One client in four sends its update times 1e30 (through the ClientApp's own
    attack path): the bound refuses it in every round, naming it, and the global model
    stays where the honest three put it."""
    lying = {**federation, "attack": "scale", "attack-fraction": 0.25, "attack-scale": 1e30}
    [liar] = attackers(load_config(lying), 4)
    run_server(lying)
    document = results(tmp_path / "results")
    for record in document["rounds"]:
        assert (record["train_replies"], record["train_failures"]) == (3, 1)
        [error] = record["errors"]
        assert error["partitions"] == [liar]
        assert "more than update-norm-factor=100 times" in error["error"]
        ratios = record["update_norm_ratio_max"]  # the honest three's, for each group
        assert set(ratios) == {"base", "head_g"} and all(0 < r < 100 for r in ratios.values())
    model = final_model(tmp_path / "results")
    assert all(np.isfinite(v).all() and np.abs(v).max() < 10 for v in model.values())


def test_a_label_flipping_liar_is_still_the_client_its_data_says(
    federation: dict[str, Any], tmp_path: Path
) -> None:
    """Label flipping changes what the client trains on, not the data it names: its
    replies pass the server's checks (and are averaged, as the bound cannot tell). The
    round records P over the three honest clients apart: their accuracies weighted by
    their test samples, the liar's left out."""
    lying = {**federation, "attack": "label-flip", "attack-fraction": 0.25}
    [liar] = attackers(load_config(lying), 4)
    run_server(lying)
    document = results(tmp_path / "results")
    tests = {
        p: n for p, (_, n) in split_sizes(PartitionKey.from_config(load_config(lying), 4)).items()
    }
    for record in document["rounds"]:
        assert (record["train_replies"], record["train_failures"]) == (4, 0)
        honest = {int(p): a for p, a in record["client_accuracies"].items() if int(p) != liar}
        assert len(honest) == 3
        expected = sum(a * tests[p] for p, a in honest.items()) / sum(tests[p] for p in honest)
        assert record["personal_accuracy_honest"] == pytest.approx(expected)
    figures = [r["personal_accuracy_honest"] for r in document["rounds"]]
    assert document["best_personal_accuracy_honest"] == max(figures)
    assert document["final_personal_accuracy_honest"] == figures[-1]


def same_model_twice(keys: dict[str, Any], tmp_path: Path) -> list[dict[str, np.ndarray]]:
    """Run one config twice (results in ``first`` and ``second``); both complete and end
    on the same weights. Returns both final models."""
    models = []
    for name in ("first", "second"):
        run_server({**keys, "results-dir": str(tmp_path / name)})
        assert results(tmp_path / name)["run"]["status"] == "completed"
        models.append(final_model(tmp_path / name))
    assert all(np.array_equal(models[0][k], models[1][k]) for k in models[0])
    return models


def test_fltrust_runs_through_the_server_app_and_the_same_seed_gives_the_same_model(
    federation: dict[str, Any], tmp_path: Path
) -> None:
    """The ServerApp hands fltrust the union of the train splits it decodes anyway; the
    root draw and the server's training are seeded, so two runs of one config end on the
    same weights, with a sign-flipping liar among the clients."""
    lying = {**federation, "aggregation": "fltrust", "attack": "sign-flip",
             "attack-fraction": 0.25, "fltrust-root-samples": 20}  # fmt: skip
    assert "train" in FedReGStrategy.server_splits(load_config(lying))
    models = same_model_twice(lying, tmp_path)
    assert all(np.isfinite(v).all() for v in models[0].values())
    for record in results(tmp_path / "first")["rounds"]:  # each reply's trust, by group
        trust = record["update_trust"]
        assert set(trust) == {"base", "head_g"}
        assert all(set(t) == {str(p) for p in record["sampled_clients"]} for t in trust.values())
        assert all(0 <= v <= 1 for t in trust.values() for v in t.values())


def test_lfr_runs_through_the_server_app_and_leaves_a_scaling_liar_out(
    federation: dict[str, Any], tmp_path: Path
) -> None:
    """A real run under ``lfr`` with the bound off and one client in four sending its
    update times 100: the root dataset's loss finds it in every round (verdict 0 in both
    groups), the honest three are kept, the model stays sound, and the same seed ends
    on the same weights."""
    lying = {**federation, "aggregation": "lfr", "attack": "scale", "attack-fraction": 0.25,
             "attack-scale": 100.0, "update-norm-factor": 0,
             "fltrust-root-samples": 40}  # fmt: skip
    [liar] = attackers(load_config(lying), 4)
    assert "train" in FedReGStrategy.server_splits(load_config(lying))
    models = same_model_twice(lying, tmp_path)
    assert all(np.isfinite(v).all() and np.abs(v).max() < 10 for v in models[0].values())
    for record in results(tmp_path / "first")["rounds"]:
        for group, given in record["update_trust"].items():
            assert given[str(liar)] == 0.0, group
            assert sum(given.values()) >= len(given) - 1


def test_flame_runs_through_the_server_app_and_records_whom_it_admitted(
    federation: dict[str, Any], tmp_path: Path
) -> None:
    """A real run under ``flame`` with a label-flipping liar: it completes, and every
    round records, per group and sampled partition, 1 (admitted) or 0, a majority of
    each round's replies admitted."""
    lying = {**federation, "aggregation": "flame", "attack": "label-flip",
             "attack-fraction": 0.25}  # fmt: skip
    run_server(lying)
    document = results(tmp_path / "results")
    assert document["run"]["status"] == "completed"
    assert all(np.isfinite(v).all() for v in final_model(tmp_path / "results").values())
    for record in document["rounds"]:
        for given in record["update_trust"].values():
            assert set(given) <= {str(p) for p in record["sampled_clients"]}
            assert set(given.values()) <= {0.0, 1.0}
            assert sum(given.values()) >= len(given) // 2 + 1


def test_without_liars_no_honest_figure_is_written(
    federation: dict[str, Any], tmp_path: Path
) -> None:
    run_server(federation)
    document = results(tmp_path / "results")
    assert all(r["personal_accuracy_honest"] is None for r in document["rounds"])
    assert document["best_personal_accuracy_honest"] is None


def test_the_bound_judges_no_honest_change_against_a_near_zero_median() -> None:
    """Others barely moved a group: a change of 3 % of its weights is not refused (the
    reference is at least a thousandth of the weights' norm), a 1e30 change still is."""
    current = {"extra.cpn.weight": np.full((10, 10), 1.0, dtype=np.float32)}  # norm 10
    still = [{"extra.cpn.weight": current["extra.cpn.weight"] + 1e-6} for _ in range(4)]
    moved = {"extra.cpn.weight": current["extra.cpn.weight"] + 0.03}  # norm of change 0.3
    huge = {"extra.cpn.weight": current["extra.cpn.weight"] * 1e30}
    weights = [{NUM_EXAMPLES: 10}] * 6
    checked = bound([*still, moved, huge], weights, current, {"extra": NUM_EXAMPLES}, 100, {})
    assert list(checked.refused) == [5]
    assert checked.ratio_max["extra"] == pytest.approx(0.3 / 0.01, rel=1e-3)
