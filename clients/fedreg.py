"""FedReG client (paper Algorithm 1 and §3.4; thesis Algorithm 2 and Sections 3.3, 4.3).

A round has two steps. (1) Original data, loss CE(head_g(z) + head_p(z), y), z = base(x):
gradients flow through both heads into the base. (2) Rebalanced data (``clients/
rebalance.py``), loss CE(head_g(base(x)), y), updating base and head_g; head_p untouched.
Sent: base and head_g with |D_k| and the effective sample count e_k. head_p stays in the
client's state. Each step has its own optimizer (the thesis's opt_1 and opt_2; streams 1
and 2 of :meth:`ClientProcedure.fit`, also the seeded shuffles' streams).

What the sources leave open, one switch each:

* ``fedreg-schedule``: how the E local epochs wrap the two steps. The round's body in
  the paper's Algorithm 1 and the thesis's Algorithm 2 (lines 5-19 in both) is one pass
  over the original data, then one over the rebalanced data; neither says how E local
  epochs (thesis §5.3: "5 local training rounds") repeat them. ``interleaved``
  (default): each of the E epochs runs one pass of step (1), then one of step (2) — the
  algorithm's body repeated E times, as PFLlib, the code base the thesis extends, wraps
  the whole body of a round's training in ``for epoch in range(max_local_epochs)``
  (``system/flcore/clients/clientrod.py`` ``train()``: both of FedRoD's updates of a
  batch inside the one epoch loop; likewise clientavg, clientper, clientgpfl; PFLlib runs
  steps one after the other only where each has its own epoch count, as FedRep's
  ``plocal_epochs`` head epochs before its base epochs). ``sequential``: E epochs of
  step (1), then E epochs of step (2) — the behaviour before 0.2.0, reproduced bit
  for bit. Under both, every pass of a step draws its shuffle from the step's one seeded
  generator of the round (client, round, step), so each epoch gets a new order and the
  e-th pass of a step the same order under either schedule; and each step keeps one
  optimizer over the round, with ``optimizer-state = fresh`` too
  (:meth:`ClientProcedure.kept_optimizer`).
* ``fedreg-step1``: what step (1) updates. ``prose`` (default): base and head_p; head_g
  gets gradients but stays as received — the paper's §3.2 ("the optimizer updates the
  parameters of the Base and Head_P, while Head_G remains unchanged"; its Algorithm 1,
  line 11, names two parameter sets) and the thesis's prose (§3.3.2: "opt_1 updates the
  model's base and head H2 ..., while head H1 is not updated"). ``pseudocode``: base,
  head_p and head_g — the thesis's Algorithm 2, line 11 ("Optimizer updates w_b, w_H1,
  w_H2").
* ``threshold`` (shared key, see ``clients/rebalance.py``): per client, a statistic of its
  non-zero class counts (thesis §3.3.1; ``mean`` by default), or ``global-*``: the
  paper's §3.4 Q = D / C, D a statistic of all clients' train sizes, C the client's
  classes. The client computes all sizes from the seeded partitioning
  (``ClientSetup.partition_key``), no message carries them. e_k uses the same t.

Where FedReG differs from its baselines (FedRoD above all), one switch each, to measure
what each difference does; the defaults are FedReG as the sources describe it:

* ``fedreg-personal``: the personal prediction. ``sum`` (default): head_g(z) + head_p(z),
  in step (1)'s loss and in personal evaluation. ``private``: head_p(z) alone, in both.
  ``kept-global``: in evaluation, head_p(z) plus the client's own head_g as its last
  training left it (kept in the client's state, record ``fedreg-kept-head-g``), instead
  of the head_g just received; training is that of ``sum`` (step (1) adds the model's
  head_g: the received one, then as step (2) moves it from epoch to epoch). A client that
  never trained uses the received head_g. ``sum`` and ``kept-global`` train the same
  weights; only P differs: whether P follows G because the received head_g's logits are
  added at evaluation. ``weighted``: in evaluation, head_p(z) + λ·head_g(z) with the
  received head_g and a fixed λ (``fedreg-personal-weight``); ``learned``: the same with
  λ ≥ 0 fitted per client at each evaluation, the λ that minimises the cross-entropy of
  the client's train split (:func:`fitted_global_weight`). Both train as ``sum``.
* ``fedreg-private-detach``: ``true`` computes head_p's logits in step (1) on z.detach(),
  so head_p's gradient does not reach the base (FedRoD's personal head); head_g's term
  keeps its gradient.
* ``fedreg-private-init``: ``copy`` (default): head_p starts as a copy of head_g's
  initial weights, as the thesis's code does (§4.3, ``copy.deepcopy()``). ``random``:
  its own seeded initialisation (stream ``private-init``), the same on every client.
* ``fedreg-step1-lr``, ``fedreg-step2-lr``: the learning rates of opt_1 and opt_2; 0 (the
  default) is the run's ``lr``. Kept momentum is stored without the rate, so it carries
  over unchanged.

FedReG combined with what steadies its baselines' global model (the paper's §6, our
variants; defaults off):

* ``fedreg-global-loss = "balanced-softmax"``: step (2) trains with FedRoD's balanced
  softmax, the log class counts of the data it trains on added to the logits. On the
  rebalanced set every class present has t samples, so what remains is that the classes
  the client lacks leave its softmax.
* ``fedreg-dyn-alpha`` > 0: FedDyn's regulariser on base and head_g in both steps, its
  correction in the client's state, and the server's h (``strategies/fedreg.py``).
* ``threshold = "auto"`` (``clients/rebalance.py``): less step-(2) training where a
  client's classes are skewed.

Without a private head (ablation (b)) ``fedreg-personal``, ``fedreg-private-detach`` and
``fedreg-private-init`` change nothing.

Ablations of the paper's Section 4.7 / Table 5, one switch each (defaults = FedReG):
(a) ``fedreg-head-weight = "original"``: head_g averaged by |D_k| like the base;
(b) ``fedreg-private-head = false``: no head_p; one head trained on the original data,
    then on the rebalanced data; the personal model is the global one;
(c) ``fedreg-rebalance = false``: step (2) runs on the original data;
(d) ``fedreg-original-step = false``: only step (2).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 - the usual name

from clients.base import ClientProcedure, ClientSetup, TrainResult, same_weights
from clients.feddyn import DynamicRegulariser
from clients.fedrod import balanced_softmax_loss, log_class_prior
from clients.rebalance import (
    RebalancedData,
    cached_rebalanced,
    class_threshold,
    effective_samples,
    is_global_threshold,
    partition_train_sizes,
)
from fedreg_app.core.config import AlgorithmOptions, at_least, option
from fedreg_app.core.data import TensorData
from fedreg_app.core.models import (
    BASE,
    HEAD_G,
    HEAD_P,
    SplitModel,
    check_keys,
    checked_value,
    initial_model,
)
from fedreg_app.core.protocol import EFFECTIVE_EXAMPLES, PERSONAL_GLOBAL_WEIGHT
from fedreg_app.core.records import from_record, to_record
from fedreg_app.core.seeds import seed_int, torch_generator
from fedreg_app.core.training import Forward, LossFn

HEAD_WEIGHTS = ("effective", "original")
SCHEDULES = ("interleaved", "sequential")
STEP1_UPDATES = ("prose", "pseudocode")
PERSONAL = ("sum", "private", "kept-global", "weighted", "learned")
PRIVATE_INITS = ("copy", "random")
GLOBAL_LOSSES = ("ce", "balanced-softmax")
#: Client-state record of ``fedreg-personal = "kept-global"``: head_g after the client's
#: last training, by its state-dict names (``head_g.*``).
KEPT_HEAD_G = "fedreg-kept-head-g"
#: fit's streams: one optimizer and one seeded shuffle per step.
ORIGINAL_STREAM, REBALANCED_STREAM = 1, 2


@dataclass(frozen=True)
class FedReGOptions(AlgorithmOptions):
    """The switches of the paper's Section 4.7 ablations and of what the sources leave
    open (module docstring); the defaults are FedReG."""

    #: ``head-depth = "auto"``: two Linear layers (thesis §5.5, Table 5.4: "the number of
    #: head layers ... is 2").
    default_head_depth: ClassVar[int] = 2
    #: Before 0.2.0 FedReG ran its two steps in sequence.
    earlier_meaning: ClassVar[Mapping[str, Any]] = {"fedreg-schedule": "sequential"}

    head_weight: str = option(
        "fedreg-head-weight", "effective", f"one of {', '.join(HEAD_WEIGHTS)}",
        lambda v: v in HEAD_WEIGHTS,
        doc="Weight of a client's `head_g` in aggregation: `effective`, the non-augmented "
        "samples of its rebalanced set; `original`, its train size (ablation (a)).",
        source="paper §3.5, §4.7",
    )  # fmt: skip
    private_head: bool = option(
        "fedreg-private-head", True, "true or false",
        doc="`false`: ablation (b), one head, trained on the original data, then on the "
        "rebalanced data.",
        source="paper §4.7",
    )  # fmt: skip
    rebalance: bool = option(
        "fedreg-rebalance", True, "true or false",
        doc="`false`: ablation (c), step 2 on the original data.",
        source="paper §4.7",
    )  # fmt: skip
    original_step: bool = option(
        "fedreg-original-step", True, "true or false",
        doc="`false`: ablation (d), only the rebalanced step.",
        source="paper §4.7",
    )  # fmt: skip
    schedule: str = option(
        "fedreg-schedule", "interleaved", f"one of {', '.join(SCHEDULES)}",
        lambda v: v in SCHEDULES,
        doc="How the E local epochs wrap the two steps: `interleaved`, each epoch one pass "
        "of step 1, then one of step 2; `sequential`, E epochs of step 1, then E of "
        "step 2.",
        source="our reading; neither paper says. The body of the thesis's Algorithm 2 "
        "(the paper's Algorithm 1) is one pass of each, and PFLlib wraps a round's whole "
        "body in its epoch loop (`clientrod.py`, `clientavg.py`)",
    )  # fmt: skip
    step1: str = option(
        "fedreg-step1", "prose", f"one of {', '.join(STEP1_UPDATES)}",
        lambda v: v in STEP1_UPDATES,
        doc="What step 1 updates: `prose`, the base and `head_p` (`head_g` gets gradients "
        "but does not move); `pseudocode`, `head_g` too.",
        source="paper §3.2, thesis §3.3.2, their prose; `pseudocode` is the thesis's "
        "Algorithm 2, line 11",
    )  # fmt: skip
    personal: str = option(
        "fedreg-personal", "sum", f"one of {', '.join(PERSONAL)}",
        lambda v: v in PERSONAL,
        doc="The personal prediction: `sum`, `head_g(z) + head_p(z)` in step 1's loss and "
        "in personal evaluation; `private`, `head_p(z)` alone in both; `kept-global`, "
        "evaluation adds the client's own `head_g` as its last training left it (kept in "
        "its state) instead of the one just received, training as `sum` (a client that "
        "never trained uses the received one); `weighted`, evaluation adds the received "
        "`head_g`'s logits times `fedreg-personal-weight`; `learned`, times the weight "
        "λ >= 0 that minimises the cross-entropy of the client's train split, fitted at "
        "each evaluation. `weighted` and `learned` train as `sum`. No effect without a "
        "private head.",
        source="paper §3.2 and Algorithm 1, line 9 (`sum`); the others are our variants "
        "(does adding the received `head_g`'s logits make P follow G, and how much of "
        "them helps?)",
    )  # fmt: skip
    personal_weight: float = option(
        "fedreg-personal-weight", 0.5, "a number >= 0", at_least(0),
        doc="λ of `fedreg-personal = \"weighted\"`: the personal prediction is "
        "`head_p(z) + λ·head_g(z)` (1: `sum`, 0: `head_p` alone in evaluation).",
        source="our variant; 0.5 halfway between the paper's sum (1) and the private "
        "head alone (0)",
    )  # fmt: skip
    private_detach: bool = option(
        "fedreg-private-detach", False, "true or false",
        doc="`true`: step 1 computes `head_p`'s logits on `z.detach()`, so its gradient "
        "does not reach the base; `head_g`'s term keeps its gradient. No effect without "
        "a private head.",
        source="paper §3.2 (the loss backpropagates through both heads into the base); "
        "`true` is our variant, as FedRoD's personal head (`clients/fedrod.py`)",
    )  # fmt: skip
    private_init: str = option(
        "fedreg-private-init", "copy", f"one of {', '.join(PRIVATE_INITS)}",
        lambda v: v in PRIVATE_INITS,
        doc="How `head_p` starts: `copy`, a copy of `head_g`'s initial weights; `random`, "
        "its own seeded initialisation, the same on every client (with `init-model`, the "
        "file then sets the base and `head_g` only). No effect without a private head.",
        source="thesis §4.3 (head H2 is a `copy.deepcopy()` of the model's head); "
        "`random` is our variant (a personal head that does not start as the global one)",
    )  # fmt: skip
    step1_lr: float = option(
        "fedreg-step1-lr", 0.0, "a number >= 0 (0: the run's lr)", at_least(0),
        doc="Learning rate of step 1's optimizer (opt_1); 0 uses `lr`.",
        source="paper §4.1, thesis §5.3: one learning rate for both optimizers; other "
        "values are our variant (the balance of the two steps)",
    )  # fmt: skip
    step2_lr: float = option(
        "fedreg-step2-lr", 0.0, "a number >= 0 (0: the run's lr)", at_least(0),
        doc="Learning rate of step 2's optimizer (opt_2); 0 uses `lr`.",
        source="as `fedreg-step1-lr`",
    )  # fmt: skip
    global_loss: str = option(
        "fedreg-global-loss", "ce", f"one of {', '.join(GLOBAL_LOSSES)}",
        lambda v: v in GLOBAL_LOSSES,
        doc="Step 2's loss: `ce`, cross-entropy; `balanced-softmax`, FedRoD's "
        "balanced-softmax CE with the class counts of the data step 2 trains on (the "
        "rebalanced set's: every class present at t, so the classes the client lacks "
        "are left out of its softmax).",
        source="paper §3.2 (`ce`); `balanced-softmax` is our variant, FedReG with FedRoD's "
        "generic loss (Chen & Chao 2022, `clients/fedrod.py`), for the paper's §6",
    )  # fmt: skip
    dyn_alpha: float = option(
        "fedreg-dyn-alpha", 0.0, "a number >= 0 (0: off)", at_least(0),
        doc="α of FedDyn's regulariser on the shared parts (base and `head_g`): each "
        "step's loss adds −⟨g_k, w⟩ + α/2‖w − w_g‖², the client keeps its correction g_k, "
        "and the server subtracts h/α from FedReG's weighted average. 0: off.",
        source="0 is FedReG (paper §3.2); > 0 is our variant, FedReG with FedDyn's "
        "regulariser (Acar et al. 2021; `dyn-alpha`'s 0.01 is its value there), for the "
        "paper's §6",
    )  # fmt: skip


@dataclass(frozen=True)
class Step:
    """One of the round's two steps: what it trains, on which data, its stream."""

    trainable: list[nn.Parameter]
    loss_fn: LossFn
    data: TensorData
    stream: int


class FedReGClient(ClientProcedure):
    private_head = True
    private_groups = (HEAD_P,)

    def __init__(self, setup: ClientSetup) -> None:
        self.options = setup.config.options_as(FedReGOptions)
        if not self.options.private_head:  # ablation (b)
            self.private_head, self.private_groups = False, ()
        #: ``fedreg-personal = "kept-global"``: head_g as the client's last training left
        #: it, read from its state by :meth:`restore_private` (None: never trained).
        self.kept_head_g: nn.Module | None = None
        #: The weight of head_g's logits in the personal prediction (``fedreg-personal``
        #: ``weighted`` and ``learned``), set before each personal evaluation.
        self.global_weight = 1.0
        #: ``fedreg-dyn-alpha`` > 0: FedDyn's terms of the round being trained.
        self.regulariser: DynamicRegulariser | None = None
        super().__init__(setup)

    def new_model(self, private_head: bool = False) -> SplitModel:
        """The run's model; with ``fedreg-private-init = "random"``, head_p gets its own
        seeded initialisation, made on the CPU (the same numbers on every device)."""
        if not (private_head and self.options.private_init == "random"):
            return super().new_model(private_head)
        model = initial_model(self.setup.info, self.config, private_head)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed_int(self.config.seed, "private-init"))
            for module in model.head_p.modules():
                if hasattr(module, "reset_parameters"):
                    module.reset_parameters()
        return model.to(self.device)

    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        self.load_global(global_arrays)
        self.restore_private()
        alpha = self.options.dyn_alpha
        self.regulariser = DynamicRegulariser(self, alpha) if alpha > 0 else None
        steps = self.round_steps()
        epochs = self.config.local_epochs
        processed = 0
        if self.options.schedule == "sequential":
            for step in steps:
                processed += self.fit(step.trainable, step.loss_fn, step.data, epochs,
                                      server_round, stream=step.stream)  # fmt: skip
        else:  # interleaved: Algorithm 2's body (one pass of each step) per epoch
            shuffles = {step.stream: self.shuffle(server_round, step.stream) for step in steps}
            for _ in range(epochs):
                for step in steps:
                    processed += self.fit(step.trainable, step.loss_fn, step.data, 1,
                                          server_round, stream=step.stream,
                                          generator=shuffles[step.stream])  # fmt: skip
        if self.regulariser is not None:
            self.regulariser.save_correction()
        self.save_private()
        if self.private_head and self.options.personal == "kept-global":
            self.setup.state[KEPT_HEAD_G] = to_record(self.model.group_state(HEAD_G))
        metrics = self.train_metrics(processed, **{EFFECTIVE_EXAMPLES: self.effective_samples()})
        return TrainResult(self.model.group_state(BASE, HEAD_G), metrics)

    def round_steps(self) -> list[Step]:
        """Step (1) unless ablation (d) drops it, then step (2)."""
        model = self.model
        data = self.second_step_data()
        second = Step(model.parameters_of(BASE, HEAD_G), self.regularised(self.step2_loss(data)),
                      data, REBALANCED_STREAM)  # fmt: skip
        if not self.options.original_step:
            return [second]
        trainable, loss = self.original_step()
        return [Step(trainable, self.regularised(loss), self.data.train, ORIGINAL_STREAM), second]

    def step2_loss(self, data: TensorData) -> LossFn:
        """CE of head_g(base(x)), or its balanced softmax with ``data``'s class counts."""
        model = self.model
        if self.options.global_loss == "ce":
            return self.cross_entropy(model)
        counts = data.class_counts(self.setup.info.num_classes)
        log_prior = log_class_prior(counts).to(self.device)
        return lambda x, y: balanced_softmax_loss(model(x), y, log_prior)

    def regularised(self, loss: LossFn) -> LossFn:
        """``loss`` plus FedDyn's terms on the shared parts (``fedreg-dyn-alpha`` > 0)."""
        regulariser = self.regulariser
        if regulariser is None:
            return loss
        alpha = regulariser.alpha
        return lambda x, y: loss(x, y) - regulariser.linear() + alpha / 2 * regulariser.distance()

    def original_step(self) -> tuple[list[nn.Parameter], LossFn]:
        """Trainable parameters and loss of step (1)."""
        model = self.model
        if not self.options.private_head:  # ablation (b): the one head learns both data
            return model.parameters_of(BASE, HEAD_G), self.cross_entropy(model)
        groups = (BASE, HEAD_P) if self.options.step1 == "prose" else (BASE, HEAD_P, HEAD_G)
        return model.parameters_of(*groups), self.cross_entropy(self.step1_logits)

    def step1_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Step (1)'s prediction, z = base(x): head_g(z) + head_p(z) (``sum``,
        ``kept-global``) or head_p(z) (``private``); head_p reads z.detach() under
        ``fedreg-private-detach``."""
        model = self.model
        z = model.base(x)
        private_z = z.detach() if self.options.private_detach else z
        if self.options.personal == "private":
            return model.head_p(private_z)
        logits = model.head_g(z)
        return logits + model.head_p(private_z)

    # ------------------------------------------------------ the personal model
    def personal_head(self, features: torch.Tensor) -> torch.Tensor:
        """The personal prediction at evaluation (``fedreg-personal``); without a private
        head (ablation (b)) the global head's."""
        model = self.model
        if model.head_p is None:
            return model.head_g(features)
        if self.options.personal == "private":
            return model.head_p(features)
        head_g = self.kept_head_g if self.kept_head_g is not None else model.head_g
        logits = head_g(features)
        if self.global_weight != 1.0:
            logits = self.global_weight * logits
        return logits + model.head_p(features)

    def count_correct(
        self, global_parts: tuple[nn.Module, Forward] | None
    ) -> dict[str, int | float]:
        """The counts, and with a weighted personal prediction the λ it used."""
        weight = self.personal_global_weight()
        self.global_weight = 1.0 if weight is None else weight
        counts: dict[str, int | float] = {**super().count_correct(global_parts)}
        if weight is not None:
            counts[PERSONAL_GLOBAL_WEIGHT] = weight
        return counts

    def personal_global_weight(self) -> float | None:
        """λ of the personal prediction head_p(z) + λ·head_g(z): ``fedreg-personal-weight``
        (``weighted``), fitted on the client's train split (``learned``); None where the
        prediction weights nothing (the plain sum, or no private head)."""
        personal = self.options.personal
        if self.model.head_p is None or personal not in ("weighted", "learned"):
            return None
        if personal == "weighted":
            return self.options.personal_weight
        features = self.base_features(self.data.train)
        with torch.no_grad():
            private = self.model.head_p(features.x)
            shared = self.model.head_g(features.x)
        return fitted_global_weight(private, shared, features.y)

    def personal_head_is(self, head: Forward) -> bool:
        """Without a private head the personal head is the global one (one forward pass
        serves both, as for FedAvg)."""
        return (
            self.model.head_p is None
            and isinstance(head, nn.Module)
            and same_weights(head, self.model.head_g)
        )

    def restore_private(self) -> None:
        super().restore_private()
        self.kept_head_g = None
        if self.private_head and self.options.personal == "kept-global":
            stored = self.setup.state.get(KEPT_HEAD_G)
            if stored is not None:
                self.kept_head_g = self.stored_head(KEPT_HEAD_G, from_record(stored))

    def stored_head(self, record: str, arrays: dict[str, np.ndarray]) -> nn.Module:
        """A head of head_g's structure holding ``arrays`` (keys ``head_g.*``), checked as
        anything read from the node's disk is."""
        head = copy.deepcopy(self.model.head_g).requires_grad_(False)
        own = {f"{HEAD_G}.{key}": value for key, value in head.state_dict().items()}
        check_keys(f"client state {record!r}", own, arrays)
        with torch.no_grad():
            for key, tensor in own.items():
                tensor.copy_(checked_value(f"{record}: {key}", arrays[key], tensor))
        return head

    def stream_lr(self, stream: int) -> float:
        """opt_1's and opt_2's learning rates (``fedreg-step1-lr``, ``fedreg-step2-lr``;
        0: the run's ``lr``)."""
        lr = {ORIGINAL_STREAM: self.options.step1_lr, REBALANCED_STREAM: self.options.step2_lr}
        return lr.get(stream) or self.config.lr

    def shuffle(self, server_round: int, stream: int) -> torch.Generator:
        """The step's shuffle generator of this round: the one ``fit`` makes for the
        stream, made once here and passed to every pass of the step, so that its passes
        continue one random stream (a new order each epoch, the same orders as one
        ``fit`` over all E epochs) rather than restart it."""
        return torch_generator(
            self.config.seed, "shuffle", self.data.partition_id, server_round, stream
        )

    def second_step_data(self) -> TensorData:
        return self.rebalanced().data if self.options.rebalance else self.data.train

    def rebalanced(self) -> RebalancedData:
        cfg = self.config
        seed = seed_int(cfg.seed, "rebalance", self.data.partition_id)
        name = f"rebalanced-{self.data.partition_id}-{cfg.threshold}-{cfg.augment}-{seed}.npz"
        return cached_rebalanced(
            self.data.train,
            self.setup.info.num_classes,
            cfg.threshold,
            cfg.augment,
            seed,
            disk=self.setup.cache / name if self.setup.cache else None,
            client_sizes=self.client_sizes(),
        )

    def client_sizes(self) -> tuple[int, ...] | None:
        """Every client's train size, for a ``global-*`` threshold (else None): computed
        from the seeded partitioning, as this client's own data was."""
        if not is_global_threshold(self.config.threshold):
            return None
        key = self.setup.partition_key
        if key is None:
            raise ValueError(
                f"threshold={self.config.threshold!r} needs every client's train size, "
                "computed from the partitioning: this client was set up without one "
                "(ClientSetup.partition_key)"
            )
        return partition_train_sizes(key, self.setup.cache)

    def threshold(self) -> int:
        """t, as the rebalanced set uses it."""
        counts = self.data.train.class_counts(self.setup.info.num_classes)
        return class_threshold(counts, self.config.threshold, self.client_sizes())

    def aggregation_weights(self) -> dict[str, float | int]:
        return {**super().aggregation_weights(), EFFECTIVE_EXAMPLES: self.effective_samples()}

    def effective_samples(self) -> int:
        """e_k = sum_c min(n_c, t), with the rebalanced set's t; defined by t even when no
        rebalanced set is built."""
        counts = self.data.train.class_counts(self.setup.info.num_classes)
        return effective_samples(counts, self.threshold())


def fitted_global_weight(
    private_logits: torch.Tensor,
    global_logits: torch.Tensor,
    labels: torch.Tensor,
    iterations: int = 50,
) -> float:
    """argmin over λ >= 0 of the mean cross-entropy of ``private + λ·global``.

    The loss is convex in λ (a log-sum-exp of affine functions minus a linear one), so
    projected Newton steps, halved until the loss does not rise, reach the minimum in a
    few iterations; in float64 on the CPU, so the fit adds no rounding of the device's
    own. An empty split keeps λ = 1 (``sum``)."""
    if len(labels) == 0:
        return 1.0
    p = private_logits.detach().cpu().double()
    g = global_logits.detach().cpu().double()
    y = labels.detach().cpu().long().unsqueeze(1)

    def loss(weight: float) -> float:
        return float(F.cross_entropy(p + weight * g, y.squeeze(1)))

    weight, current = 1.0, loss(1.0)
    for _ in range(iterations):
        probs = torch.softmax(p + weight * g, dim=1)
        expected = (probs * g).sum(1)
        slope = float((expected - g.gather(1, y).squeeze(1)).mean())
        curvature = float(((probs * g * g).sum(1) - expected**2).mean())
        if curvature <= 1e-12:
            break
        step = slope / curvature
        candidate = max(0.0, weight - step)
        while loss(candidate) > current and abs(candidate - weight) > 1e-9:
            candidate = (candidate + weight) / 2
        if abs(candidate - weight) <= 1e-9:
            break
        weight, current = candidate, loss(candidate)
    return weight
