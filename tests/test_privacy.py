"""Client-level differential privacy: clipping bounds respected, the
private head untouched by noise, the noise scale of the formula, FedReG's two weights kept
through the fixed-denominator estimator, ε monotone in rounds and equal to Flower's own
accountant, and bad settings refused before any work."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Message

from fedreg_app import client_app
from fedreg_app.core.config import ConfigError
from fedreg_app.core.data import PartitionKey, load_info
from fedreg_app.core.models import BASE, HEAD_G, initial_model
from fedreg_app.core.privacy import (
    central_epsilon,
    central_release,
    clipped,
    local_epsilon,
    population_denominators,
    privatise_locally,
    update_norm,
)
from fedreg_app.core.protocol import ARRAYS, DP_REFERENCE, EFFECTIVE_EXAMPLES, METRICS, NUM_EXAMPLES
from fedreg_app.core.records import to_record
from fedreg_app.registry import get_algorithm, load_config
from strategies.base import weighted_average_by_group
from tests.inprocess import results, run_server
from tests.test_client_state import node_context, train_message

pytest.importorskip("dp_accounting")

FEDREG_WEIGHTS = {"base": NUM_EXAMPLES, "head_g": EFFECTIVE_EXAMPLES}


def private(**extra: Any) -> dict[str, Any]:
    return {"dp-mode": "central", "dp-noise-multiplier": 1.0, "dp-clip": 1.0,
            "dp-delta": 1e-5, **extra}  # fmt: skip


# ------------------------------------------------------------------ clipping and noise
def test_an_update_is_clipped_jointly_over_its_groups() -> None:
    update = {"base.w": np.full(4, 3.0), "head_g.w": np.full(1, 4.0)}  # norm sqrt(36+16)
    out = clipped(update, 1.0)
    assert update_norm(out) == pytest.approx(1.0)
    ratio = out["base.w"][0] / out["head_g.w"][0]
    assert ratio == pytest.approx(3.0 / 4.0)  # one scale for every group
    small = {"base.w": np.full(4, 0.1)}
    np.testing.assert_array_equal(clipped(small, 1.0)["base.w"], small["base.w"])


def test_the_central_noise_has_the_formulas_scale_on_each_group() -> None:
    """No client moved: what is released is noise only, of std 2 z C / D^g per group."""
    current = {"base.w": np.zeros(200_000, np.float32), "head_g.w": np.zeros(200_000, np.float32)}
    population = {p: {NUM_EXAMPLES: 100 + 50 * p, EFFECTIVE_EXAMPLES: 40 + 5 * p}
                  for p in range(8)}  # fmt: skip
    scales, denominators = population_denominators(population, FEDREG_WEIGHTS, 2)
    updates = [(current, population[0]), (current, population[3])]
    z, clip = 0.7, 2.0
    out = central_release(current, updates, FEDREG_WEIGHTS, scales, denominators,
                          2 * z * clip, clip, np.random.default_rng(0))  # fmt: skip
    for key, group in (("base.w", "base"), ("head_g.w", "head_g")):
        expected = 2 * z * clip / denominators[group]
        assert float(np.std(out[key])) == pytest.approx(expected, rel=0.01)
    # D^g = (K / N) * sum_j m_j / max_j m_j
    assert denominators["base"] == pytest.approx(2 / 8 * sum(100 + 50 * p for p in range(8)) / 450)


def test_fedregs_two_weights_survive_the_private_average() -> None:
    """With negligible noise, each group is Σ w_k Δ_k / D^g with its own weights: the base
    by |D_k|, the global head by e_k, as FedReG aggregates them."""
    current = {"base.w": np.zeros(3, np.float32), "head_g.w": np.zeros(2, np.float32)}
    population = {0: {NUM_EXAMPLES: 300, EFFECTIVE_EXAMPLES: 30},
                  1: {NUM_EXAMPLES: 100, EFFECTIVE_EXAMPLES: 90}}  # fmt: skip
    scales, denominators = population_denominators(population, FEDREG_WEIGHTS, 2)
    moved = [({"base.w": np.full(3, 0.1 * (k + 1), np.float32),
               "head_g.w": np.full(2, 0.1 * (k + 1), np.float32)}, population[k])
             for k in (0, 1)]  # fmt: skip
    out = central_release(current, moved, FEDREG_WEIGHTS, scales, denominators, 1e-12, 10.0,
                          np.random.default_rng(0))  # fmt: skip
    base = (300 / 300 * 0.1 + 100 / 300 * 0.2) / (1 + 1 / 3)
    head = (30 / 90 * 0.1 + 90 / 90 * 0.2) / (1 / 3 + 1)
    np.testing.assert_allclose(out["base.w"], base, rtol=1e-6)
    np.testing.assert_allclose(out["head_g.w"], head, rtol=1e-6)
    # Without noise and with every client sampled this is FedReG's own weighted average.
    assert base == pytest.approx((300 * 0.1 + 100 * 0.2) / 400)
    assert head == pytest.approx((30 * 0.1 + 90 * 0.2) / 120)


def test_local_privatisation_clips_then_noises_around_the_reference() -> None:
    config = load_config(
        {"algo": "fedavg", **private(**{"dp-mode": "local", "dp-noise-multiplier": 1e-9})}
    )
    reference = {"base.w": np.zeros(10, np.float32)}
    sent = {"base.w": np.full(10, 5.0, np.float32)}
    out = privatise_locally(sent, reference, config, partition_id=3, server_round=2)
    assert out["base.w"].dtype == np.float32
    assert update_norm({"base.w": out["base.w"] - reference["base.w"]}) == pytest.approx(1.0)
    again = privatise_locally(sent, reference, config, partition_id=3, server_round=2)
    np.testing.assert_array_equal(out["base.w"], again["base.w"])  # seeded from the run
    with pytest.raises(KeyError, match="no reference"):
        privatise_locally(sent, {}, config, 3, 2)


# ------------------------------------------------------------------ accounting
def test_epsilon_grows_with_rounds_and_equals_flowers_accountant() -> None:
    eps = [central_epsilon(1.0, [(5, 20)] * r, 1e-5) for r in range(0, 12)]
    assert eps[0] == 0.0 and all(a < b for a, b in zip(eps, eps[1:], strict=False))
    from flwr.supercore.privacy_accounting import (
        GaussianPrivacyEvent,
        NeighboringRelation,
        PrivacyConfig,
        SamplingMethod,
    )
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    flower = RdpAccountant(PrivacyConfig(1e-5, 20, NeighboringRelation.REPLACE_ONE,
                                         SamplingMethod.WITHOUT_REPLACEMENT))  # fmt: skip
    flower.compose(GaussianPrivacyEvent(1.0, 5, 20), 10)
    assert eps[10] == pytest.approx(flower.get_epsilon(1e-5), rel=1e-9)
    local = [local_epsilon(2.0, r, 1e-5) for r in range(1, 6)]
    assert all(a < b for a, b in zip(local, local[1:], strict=False))
    # Sampling amplifies: the same rounds cost less when only some clients are drawn.
    assert central_epsilon(1.0, [(5, 20)] * 3, 1e-5) < central_epsilon(1.0, [(20, 20)] * 3, 1e-5)


# ------------------------------------------------------------------ bad settings
@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"dp-noise-multiplier": -1.0}, "dp-noise-multiplier"),
        ({"dp-noise-multiplier": 0.0}, "dp-noise-multiplier"),
        ({"dp-clip": 0.0}, "dp-clip"),
        ({"dp-delta": 0.0}, "dp-delta"),
        ({"dp-delta": 1.0}, "dp-delta"),
        ({"dp-mode": "global"}, "dp-mode"),
    ],
)
def test_bad_privacy_settings_name_the_key(settings: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=f"^{key}=.* is not allowed: expected"):
        load_config({"algo": "fedreg", **private(**settings)})


def test_negative_noise_is_refused_even_with_privacy_off() -> None:
    with pytest.raises(ConfigError, match="dp-noise-multiplier=-0.5"):
        load_config({"dp-noise-multiplier": -0.5})


@pytest.mark.parametrize(("algo", "mode"), [("local", "central"), ("centralised", "local")])
def test_algorithms_privacy_cannot_cover_are_refused(algo: str, mode: str) -> None:
    from strategies.privacy import DifferentialPrivacy

    config = load_config({"algo": algo, **private(**{"dp-mode": mode})})
    with pytest.raises(ConfigError, match=f"dp-mode='{mode}' is not allowed with algo='{algo}'"):
        DifferentialPrivacy(get_algorithm(algo).strategy(config))


def test_a_server_that_does_more_than_average_is_refused_central_dp() -> None:
    """An overridden aggregation that does not say it works from the private release
    would see the raw updates: refused (FedDyn says it does, and runs)."""
    from strategies.base import PersonalizedStrategy
    from strategies.privacy import DifferentialPrivacy, check_privacy_allowed

    class Median(PersonalizedStrategy):
        def aggregate_updates(self, server_round, updates):  # noqa: ANN001, ANN202
            return {}

    config = load_config({"algo": "fedavg", **private()})
    with pytest.raises(ConfigError, match="does more than average the updates"):
        DifferentialPrivacy(Median(config))
    feddyn = get_algorithm("feddyn").strategy
    check_privacy_allowed(load_config({"algo": "feddyn", **private()}), feddyn)


def test_feddyn_under_central_dp_runs_from_the_private_release(
    grey_dataset: Path, tmp_path: Path
) -> None:
    """FedDyn's h and global model are computed from the noisy average only: the run
    completes with ε in every round."""
    settings = private(**{"dp-noise-multiplier": 0.01, "algo": "feddyn"})
    assert run_server(federated(grey_dataset, tmp_path, **settings))[1] is None
    document = results(tmp_path / "results")
    assert document["run"]["status"] == "completed"
    assert all(r["dp_epsilon"] > 0 for r in document["rounds"])


# ------------------------------------------------------------------ through the app
def federated(dataset: Path, where: Path, **extra: Any) -> dict[str, Any]:
    return {"algo": "fedreg", "dataset-path": str(dataset), "local-epochs": 1,
            "fraction-train": 0.5, "min-partition-size": 5, "alpha": 0.5, "seed": 2,
            "num-server-rounds": 2, "results-dir": str(where / "results"),
            "state-dir": str(where / "state"), **extra}  # fmt: skip


def head_p_of_round(where: Path, server_round: int) -> dict[str, np.ndarray]:
    from fedreg_app.core.persist import load_checked_arrays

    found = sorted(
        (where / "state").glob(f"runs/*/partition-*/round-{server_round:06d}/head_p.npz")
    )
    return {str(path.relative_to(where / "state").parts[2]): load_checked_arrays(path)
            for path in found}  # fmt: skip


@pytest.mark.parametrize("mode", ["central", "local"])
def test_a_private_fedreg_run_noises_the_shared_parts_not_the_private_head(
    grey_dataset: Path, tmp_path: Path, mode: str
) -> None:
    """Round 1 of FedReG with and without DP: the clients' private heads after training
    are identical (no noise reaches them), the global base differs (it was noised), and
    ε is in every round record and grows."""
    plain, noisy = tmp_path / "plain", tmp_path / "noisy"
    assert run_server(federated(grey_dataset, plain))[1] is None
    settings = private(**{"dp-mode": mode, "dp-noise-multiplier": 0.01})  # a model survives
    _, stopped = run_server(federated(grey_dataset, noisy, **settings))
    assert stopped is None
    heads_plain, heads_noisy = head_p_of_round(plain, 1), head_p_of_round(noisy, 1)
    assert heads_plain and heads_plain.keys() == heads_noisy.keys()
    for partition, arrays in heads_plain.items():
        for name, value in arrays.items():
            np.testing.assert_array_equal(value, heads_noisy[partition][name])
    document = results(noisy / "results")
    eps = [r["dp_epsilon"] for r in document["rounds"]]
    assert 0 < eps[0] < eps[1] and all(math.isfinite(e) for e in eps)
    assert results(plain / "results")["rounds"][0]["dp_epsilon"] is None
    from fedreg_app.core.checkpoint import Checkpoint

    models = [Checkpoint.load(next((w / "results").glob("*/")))[0].model for w in (plain, noisy)]
    assert not np.array_equal(models[0]["base.0.weight"], models[1]["base.0.weight"])


def test_a_reply_claiming_other_weights_than_declared_is_rejected(
    grey_dataset: Path, tmp_path: Path
) -> None:
    """Central DP builds its denominators on the weights each client declared; a reply
    inflating its weight (it would break the sensitivity bound) does not count."""
    from flwr.app import Message, MetricRecord, RecordDict

    from fedreg_app.core.protocol import ARRAYS, DATA, METRICS

    def inflate(msg: Message, honest: Message | None) -> Message:
        metrics = dict(honest.content[METRICS])
        metrics[NUM_EXAMPLES] = int(metrics[NUM_EXAMPLES]) * 100
        content = RecordDict({ARRAYS: honest.content[ARRAYS], METRICS: MetricRecord(metrics),
                              DATA: honest.content[DATA]})  # fmt: skip
        return Message(content, reply_to=msg)

    config = federated(grey_dataset, tmp_path, **private(**{"num-server-rounds": 1}))
    [first, *others] = first_round_sample(seed=2)
    _, stopped = run_server(config, faults={("train", 1, first): inflate})
    assert stopped is None
    [record] = results(tmp_path / "results")["rounds"]
    assert record["train_failures"] == 1 and record["train_replies"] == len(others)
    [error] = record["errors"]
    assert error["partitions"] == [first] and "declared" in error["error"]


def first_round_sample(seed: int) -> list[int]:
    from fedreg_app.core.partition_map import PartitionMap
    from strategies.fedavg import FedAvgStrategy

    strategy = FedAvgStrategy(load_config({"seed": seed, "fraction-train": 0.5}))
    strategy.set_partitions(PartitionMap(4, {p: p for p in range(4)}))
    return strategy.sample_partitions(1)


def test_a_killed_and_resumed_private_run_equals_an_uninterrupted_one(
    grey_dataset: Path, tmp_path: Path
) -> None:
    """The privacy ledger and the seeded noise come back with the checkpoint: ε and the
    model of a run killed in round 3 and resumed equal those of a run never stopped."""
    from fedreg_app.core.checkpoint import Checkpoint
    from tests.inprocess import ServerKilled

    settings = private(**{"dp-noise-multiplier": 0.01, "num-server-rounds": 3})
    _, stopped = run_server(federated(grey_dataset, tmp_path / "a", **settings),
                            kill_after=("train", 3, 1))  # fmt: skip
    assert isinstance(stopped, ServerKilled)
    assert results(tmp_path / "a" / "results")["run"]["status"] == "running"  # as a SIGKILL left it
    [folder] = list((tmp_path / "a" / "results").glob("*/"))
    resumed = federated(grey_dataset, tmp_path / "a", **settings, resume=str(folder))
    assert run_server(resumed, run_id=2)[1] is None
    assert run_server(federated(grey_dataset, tmp_path / "b", **settings))[1] is None
    [whole] = list((tmp_path / "b" / "results").glob("*/"))
    eps = [[r["dp_epsilon"] for r in results(w.parent)["rounds"]] for w in (folder, whole)]
    assert eps[0] == eps[1] and len(eps[0]) == 3
    ours, theirs = Checkpoint.load(folder)[0].model, Checkpoint.load(whole)[0].model
    for name, value in theirs.items():
        np.testing.assert_array_equal(ours[name], value)


def dp_reference_reply(dataset: Path, reference: dict[str, np.ndarray]) -> Message:
    """A FedPer client under local DP sent the base, and ``reference`` as the rest of its
    update's reference (what ``dp-reference`` carries)."""
    run_config = {"algo": "fedper", "dataset-path": str(dataset), "local-epochs": 1,
                  "min-partition-size": 5, **private(**{"dp-mode": "local"})}  # fmt: skip
    context = node_context(run_config)
    message = train_message(context, 1, {DP_REFERENCE: to_record(reference)}, groups=(BASE,))
    return client_app.train(message, context)


def initial_head(dataset: Path) -> dict[str, np.ndarray]:
    config = load_config({"algo": "fedper", "dataset-path": str(dataset)})
    return initial_model(load_info(PartitionKey.from_config(config, 4)), config).group_state(HEAD_G)


@pytest.mark.parametrize(
    ("crafted", "error"),
    [
        (lambda head, key: {**head, key: np.zeros((), np.float32)}, r"got float32\[1\], expected"),
        (lambda head, key: {**head, key: np.full_like(head[key], np.nan)}, "NaN"),
        (lambda head, key: {**head, "base.0.bias": np.zeros(1, np.float32)}, "sent arrays"),
        (lambda head, key: {**head, "head_g.extra": np.zeros(1, np.float32)}, "not an entry"),
    ],
    ids=["scalar", "nan", "a-sent-key", "no-model-entry"],
)
def test_a_crafted_local_dp_reference_is_refused_naming_the_key(
    grey_dataset: Path, crafted: Callable, error: str
) -> None:
    """The reference an update is clipped around comes off the wire: each entry is
    checked as the global model is (shape, dtype, finite) and must be a model entry the
    server did not send; else a scalar would broadcast over a layer, or the released
    update be moved where the server wants it."""
    head = initial_head(grey_dataset)
    key = sorted(head)[-1]
    reference = crafted(head, key)
    [named] = sorted(set(reference) - set(head)) or [key]
    with pytest.raises(ValueError, match=error) as refused:
        dp_reference_reply(grey_dataset, reference)
    assert named in str(refused.value)


@pytest.mark.parametrize("left_out", ["all", "one"])
def test_a_local_dp_reference_left_out_is_refused_before_any_training(
    grey_dataset: Path, left_out: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a reference for every entry the reply carries (here the global head,
    which FedPer's server aggregates but does not send), the update cannot be clipped:
    the message is refused, naming what is missing, before a single batch is trained
    (before, the whole round was trained and then thrown away)."""
    from clients.base import ClientProcedure

    head = initial_head(grey_dataset)
    reference = {} if left_out == "all" else dict(sorted(head.items())[1:])
    trained = []
    monkeypatch.setattr(ClientProcedure, "fit", lambda *args, **kw: trained.append(1))
    with pytest.raises(ValueError, match="no reference for") as refused:
        dp_reference_reply(grey_dataset, reference)
    assert sorted(head)[0] in str(refused.value) and "nothing was trained" in str(refused.value)
    assert trained == []


def test_the_honest_local_dp_reference_is_taken(grey_dataset: Path) -> None:
    reply = dp_reference_reply(grey_dataset, initial_head(grey_dataset))
    assert ARRAYS in reply.content and reply.content[METRICS][NUM_EXAMPLES] > 0


def test_a_central_dp_round_that_trains_every_client_and_the_head_averages_them_as_such() -> None:
    """Deviation tracking's fine-tune rounds train every client, and the head joins the
    aggregated groups. The fixed denominator is that round's, (K_t / N) Σ m_j / max m:
    with noise ~0 and no clipping the release is the plain average of base and head.
    The head has a denominator of its own (without one the run fails: ``KeyError:
    'head_g'``), and an ordinary round's K would double the update of a round of all 4."""
    from strategies.fedbabu_deviation import FedBABUDeviationStrategy
    from strategies.privacy import DifferentialPrivacy

    settings = private(**{"dp-noise-multiplier": 1e-12, "dp-clip": 1e6})
    config = load_config({"algo": "fedbabu-deviation", "fraction-train": 0.5,
                          "num-server-rounds": 7, **settings})  # fmt: skip
    inner = FedBABUDeviationStrategy(config)
    strategy = DifferentialPrivacy(inner, {p: {NUM_EXAMPLES: 10 * (p + 1)} for p in range(4)})
    rng = np.random.default_rng(3)
    strategy._current = {"base.w": rng.normal(size=6).astype(np.float32),
                         "head_g.w": rng.normal(size=3).astype(np.float32)}  # fmt: skip
    inner.fine_tune_round, inner.last_sampled = 2, [0, 1, 2, 3]
    updates = [({k: (v + rng.normal(size=v.shape)).astype(np.float32)
                 for k, v in strategy._current.items()}, {NUM_EXAMPLES: 10 * (p + 1)})
               for p in range(4)]  # fmt: skip
    released = strategy.aggregate_updates(3, updates)
    plain = weighted_average_by_group(updates, strategy.group_weights)
    assert set(released) == {"base.w", "head_g.w"}
    for key, value in plain.items():
        np.testing.assert_allclose(released[key], value, rtol=1e-5, atol=1e-6)
    assert strategy.releases == [(4, 4)]  # accounted as a round sampling everyone


def test_with_equal_weights_the_release_is_flowers_fixed_clipping_average() -> None:
    """FedAvg with clients of equal size is what Flower's own central DP wrapper
    (``DifferentialPrivacyServerSideFixedClipping``) can express: its clipping
    (``compute_clip_model_update``) and average give the same model as ours. Its noise
    std is z C / K on the average (``compute_stdv``), ours 2 z C / K: it takes the
    sensitivity of adding or removing a client, C, while the without-replacement
    accounting both use is for replacing one, 2C (see fedreg_app/core/privacy.py)."""
    from flwr.supercore.differential_privacy import compute_clip_model_update, compute_stdv

    rng = np.random.default_rng(4)
    current = {"base.w": rng.normal(size=50).astype(np.float32),
               "head_g.w": rng.normal(size=7).astype(np.float32)}  # fmt: skip
    replies = [{k: (v + rng.normal(scale=s, size=v.shape)).astype(np.float32)
                for k, v in current.items()} for s in (0.01, 0.5, 3.0)]  # fmt: skip
    weights = {"base": NUM_EXAMPLES, "head_g": NUM_EXAMPLES}
    population = {p: {NUM_EXAMPLES: 100} for p in range(3)}
    scales, denominators = population_denominators(population, weights, 3)
    ours = central_release(current, [(r, population[0]) for r in replies], weights, scales,
                           denominators, 0.0, 1.0, np.random.default_rng(0))  # fmt: skip
    keys = list(current)
    flower = []
    for reply in replies:
        params = [reply[k].copy() for k in keys]
        compute_clip_model_update(params, [current[k] for k in keys], 1.0)
        flower.append(params)
    for index, key in enumerate(keys):
        average = np.mean([p[index] for p in flower], axis=0)
        np.testing.assert_allclose(ours[key], average, rtol=1e-5, atol=1e-6)
    config = load_config({"algo": "fedavg", **private(**{"dp-noise-multiplier": 0.8})})
    from fedreg_app.core.privacy import noise_std

    assert noise_std(config) / denominators["base"] == pytest.approx(2 * compute_stdv(0.8, 1.0, 3))
