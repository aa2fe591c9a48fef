"""The keys of robustness against clients that lie: the bound every run has on updates,
the robust aggregation rules, and the attacks a run can simulate to measure them.

Declared here and used as fields of :class:`~fedreg_app.core.config.RunConfig` (flat
run-config keys like every other); checked by :func:`check_robustness`. The rules are in
``strategies/robust.py``, the attacks in ``clients/attacks.py``.
"""

from __future__ import annotations

import math
from typing import Protocol

from fedreg_app.core.keys import core_key, fail, one_of

AGGREGATIONS = (
    "mean",
    "median",
    "trimmed-mean",
    "krum",
    "multi-krum",
    "norm-clip",
    "cosine-trust",
    "fltrust",
    "flame",
    "lfr",
)
ATTACKS = ("none", "scale", "sign-flip", "label-flip", "noise", "replay")

UPDATE_NORM_FACTOR = core_key(
    100.0,
    "a number > 1, or 0 (off)",
    doc="Refuse a training reply whose change of a parameter group (L2 norm of reply − "
    "global model) is more than this many times the median of the round's other replies "
    "for that group (with one reply: the last round's median), and record it as a failed "
    "reply. Per group, so FedReG's base and head are each judged; replies with weight 0 "
    "for a group neither count nor are judged for it.",
    source="our rule: the median of the round's update norms as the reference, as FLAME "
    "(Nguyen et al. 2022) clips to it, and a reply far above what the others sent is "
    "dropped, as TFF's robust_aggregator zeroes one (Andrew et al. 2021); 100 leaves "
    "room for clients whose local step counts differ 100-fold",
)
AGGREGATION = core_key(
    "mean",
    one_of(AGGREGATIONS),
    doc="How each parameter group's updates are combined: `mean`, the algorithm's own "
    "weighted average; `median`, coordinate-wise; `trimmed-mean`; `krum`, `multi-krum`; "
    "`norm-clip`, clipped then averaged; `cosine-trust`, clipped then averaged with each "
    "update's weight times the ReLU of its cosine with the coordinate-wise median; "
    "`fltrust`, each update rescaled to the norm of an update the server trains on a "
    "root dataset and averaged with its weight times the ReLU of its cosine with it; "
    "`flame`, the updates of the tightest majority of the replies by cosine distance, "
    "clipped at the round's median norm and averaged; `lfr`, the weighted average of the "
    "replies whose removal from it would not lower its loss on the root dataset. See the "
    "[robustness page](robustness.md).",
    source="`mean`: every source; the others: Yin et al. 2018, Blanchard et al. 2017, "
    "Sun et al. 2019; `fltrust`: Cao et al. 2021 (the group weight kept as a factor and "
    "the server's passes matched to the median client's samples: ours); `flame`: Nguyen "
    "et al. 2022 (the group weight kept among the admitted: ours); `cosine-trust`: our "
    "variant of FLTrust, with the round's median in place of the server's root-data update; "
    "`lfr`: our variant of Fang et al. 2020's loss-function-based rejection (every reply "
    "that raises the loss is rejected, where LFR rejects an assumed number of liars)",
)
TRIM_FRACTION = core_key(
    0.2,
    "a fraction in [0, 0.5)",
    doc="β of `trimmed-mean`: the share of values left out at each end, per coordinate.",
    source="Flower's FedTrimmedAvg (beta = 0.2); Yin et al. 2018, Def. 2",
)
KRUM_BYZANTINE = core_key(
    0,
    "an integer >= 0",
    doc="f of `krum` and `multi-krum`: the liars assumed among a round's replies.",
    source="Flower's Krum (num_malicious_nodes = 0); Blanchard et al. 2017",
)
MULTI_KRUM_KEEP = core_key(
    0,
    "an integer >= 0",
    doc="m of `multi-krum`: how many best-scored updates are averaged; 0: n − f.",
    source="Blanchard et al. 2017 (m = n − f in their experiments)",
)
CLIP_NORM = core_key(
    0.0,
    "a number >= 0",
    doc="The L2 bound of `norm-clip` and `cosine-trust`, per group; 0: the round's median norm.",
    source="0: FLAME (Nguyen et al. 2022); a fixed bound: Sun et al. 2019",
)
FLTRUST_ROOT_SAMPLES = core_key(
    100,
    "an integer >= 1",
    doc="The root dataset of `fltrust` and `lfr`: this many samples drawn once, seeded, "
    "from the union of the clients' train splits, on which the server trains its reference "
    "update every round (`fltrust`) or measures each reply's impact on the loss (`lfr`).",
    source="Cao et al. 2021 (100 root examples, drawn uniformly from the training data); "
    "`lfr`: the same set, as the server's one dataset (Fang et al. 2020 assume a small "
    "validation set on the server)",
)
LFR_REJECT = core_key(
    0,
    "an integer >= 0",
    doc="c of `lfr`: reject the c replies whose removal lowers the root loss most, whatever "
    "their sign; 0: every reply whose removal lowers it, however many.",
    source="c > 0: Fang et al. 2020's LFR (c, the liars assumed); 0: our variant",
)
FLAME_NOISE = core_key(
    0.0,
    "a number >= 0",
    doc="λ of `flame`: Gaussian noise of standard deviation λ × the round's median update "
    "norm added to each group's aggregate, against backdoors; 0: none.",
    source="Nguyen et al. 2022 (σ = λ · S_t, λ set per application); 0: the attacks "
    "simulated here are untargeted, where the noise only costs accuracy",
)
ATTACK = core_key(
    "none",
    one_of(ATTACKS),
    doc="Simulate lying clients (research only): `scale`, the update times "
    "`attack-scale`; `sign-flip`, the update reversed; `label-flip`, training on label "
    "C − 1 − y; `noise`, Gaussian noise of the honest update's spread in its place; "
    "`replay`, the client's first update again in every later round.",
    source="Bagdasaryan et al. 2020 (scaling); Fang et al. 2020 (label flipping, "
    "Gaussian); Li et al. 2019, RSA (sign flipping); our choice (replay)",
)
ATTACK_FRACTION = core_key(
    0.0,
    "a fraction in [0, 1]; > 0 when attack is set",
    doc="Share of the partitions that lie, drawn once from the run's seed.",
    source="none: to be set with `attack`",
)
ATTACK_SCALE = core_key(
    10.0,
    "a number > 0",
    doc="The factor of `attack = scale`.",
    source="Bagdasaryan et al. 2020 (boosting by n / η; 10 clients a round, η = 1)",
)


class LiarSettings(Protocol):
    """What :func:`attackers` reads of a run config."""

    seed: int
    attack: str
    attack_fraction: float


def attackers(config: LiarSettings, num_partitions: int) -> frozenset[int]:
    """The partitions that lie: ⌈attack-fraction · N⌉ of them, a seeded draw that
    depends on the seed and N only (the clients lie by it, the server reports the honest
    clients' figures by it)."""
    if config.attack == "none" or num_partitions < 1:
        return frozenset()
    from fedreg_app.core.seeds import drawn_partitions  # here: config loads without torch

    count = min(num_partitions, math.ceil(config.attack_fraction * num_partitions - 1e-9))
    return drawn_partitions(config.seed, "attackers", num_partitions, count)


class RobustnessSettings(Protocol):
    """What :func:`check_robustness` reads of a run config (a ``RunConfig``)."""

    update_norm_factor: float
    aggregation: str
    trim_fraction: float
    krum_byzantine: int
    multi_krum_keep: int
    clip_norm: float
    fltrust_root_samples: int
    lfr_reject: int
    flame_noise: float
    attack: str
    attack_fraction: float
    attack_scale: float
    dp_mode: str


def check_robustness(config: RobustnessSettings) -> None:
    """Raise :class:`~fedreg_app.core.keys.ConfigError` for the first robustness key
    that cannot work: the bound, the rule, the attack."""
    factor = config.update_norm_factor
    if not (factor == 0 or factor > 1):
        fail("update-norm-factor", factor, "a number > 1, or 0 to turn the bound off")
    if config.aggregation not in AGGREGATIONS:
        fail("aggregation", config.aggregation, one_of(AGGREGATIONS))
    if not 0 <= config.trim_fraction < 0.5:
        fail("trim-fraction", config.trim_fraction, "a fraction in [0, 0.5)")
    for key, value in (("krum-byzantine", config.krum_byzantine),
                       ("multi-krum-keep", config.multi_krum_keep),
                       ("lfr-reject", config.lfr_reject)):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            fail(key, value, "an integer >= 0")
    if not config.clip_norm >= 0:
        fail("clip-norm", config.clip_norm, "a number >= 0 (0: the round's median norm)")
    roots = config.fltrust_root_samples
    if isinstance(roots, bool) or not isinstance(roots, int) or roots < 1:
        fail("fltrust-root-samples", roots, "an integer >= 1")
    if not config.flame_noise >= 0:
        fail("flame-noise", config.flame_noise, "a number >= 0 (0: no noise)")
    if config.aggregation != "mean" and config.dp_mode == "central":
        fail("aggregation", config.aggregation, "'mean' with dp-mode='central' (its noise "
             "is calibrated to the weighted average's sensitivity)")  # fmt: skip
    if config.attack not in ATTACKS:
        fail("attack", config.attack, one_of(ATTACKS))
    attacking = config.attack != "none"
    low = config.attack_fraction > 0 if attacking else config.attack_fraction >= 0
    if not (low and config.attack_fraction <= 1):
        allowed = f"(0, 1] with attack={config.attack!r}" if attacking else "[0, 1]"
        fail("attack-fraction", config.attack_fraction, f"a fraction in {allowed}")
    if not config.attack_scale > 0:
        fail("attack-scale", config.attack_scale, "a number > 0")
