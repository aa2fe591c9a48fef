"""Run configuration: the typed, validated view of Flower's ``run_config``.

Every key of ``[tool.flwr.app.config]`` is read here exactly once. Invalid values raise
:class:`ConfigError` naming the key and the allowed values, before any data is loaded or
any model is trained.

``head-depth = "auto"`` (the default) is each algorithm's own split, declared on its
options type (:attr:`AlgorithmOptions.default_head_depth`): 1, the last Linear layer, for
every baseline, as PFLlib (the thesis's code) cuts them at ``model.fc`` (system/main.py:
``args.head = args.model.fc``, ``BaseHeadSplit``) and as ``002``-``004`` name the head;
2 for FedReG (thesis §5.5: Table 5.4 "the number of head layers ... is 2"). The FedReG
paper does not state the baselines' split.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from fedreg_app.core import new_clients, robustness
from fedreg_app.core.keys import ConfigError, core_key
from fedreg_app.core.keys import fail as _fail
from fedreg_app.core.keys import one_of as _one_of

#: FedReG's threshold: a statistic of the client's class counts (thesis), or "global-":
#: of all clients' train sizes, divided by the client's classes (paper §3.4)
PER_CLIENT_THRESHOLDS = ("mean", "median", "max", "secmin")
#: Our automatic threshold: the largest t up to the mean whose rebalanced set is at least
#: half originals (clients/rebalance.py, ``auto_threshold``).
AUTO_THRESHOLD = "auto"
THRESHOLD_STATISTICS = (
    *PER_CLIENT_THRESHOLDS,
    *(f"global-{s}" for s in PER_CLIENT_THRESHOLDS),
    AUTO_THRESHOLD,
)
AUGMENTATIONS = ("simple", "auto")
DEVICES = ("auto", "cpu", "cuda")
GLOBAL_EVALS = ("auto", "clients", "server")
DP_MODES = ("off", "central", "local")
OPTIMIZER_STATES = ("persistent", "fresh")
HEAD_DEPTHS = (1, 2, 3)
#: The largest seed: Flower carries run-config integers as signed 64-bit on the wire, and
#: ``torch.manual_seed`` takes no more than 64 bits either.
MAX_SEED = 2**63 - 1
#: ``head-depth = "auto"``: the algorithm's ``default_head_depth``.
HEAD_DEPTH_AUTO = "auto"
HEAD_DEPTH_ALLOWED = f"'{HEAD_DEPTH_AUTO}' (the algorithm's own split) or one of {HEAD_DEPTHS}"
MODELS = ("convnet", "mlp", "cnn", "fedavgcnn", "charlstm")
PARTITIONS = ("dirichlet", "dirichlet-topup", "shard", "natural")
#: Models whose head is a single Linear layer: ``head-depth`` must be 1.
ONE_LAYER_HEADS = {"mlp": "input -> 100 -> classes", "charlstm": "LSTM -> Linear(256, vocab)"}


def option(
    key: str,
    default: Any,
    allowed: str,
    valid: Callable[[Any], bool] = lambda _: True,
    *,
    doc: str,
    source: str,
) -> Any:
    """Declare one run-config key of an algorithm: its hyphenated name, its default (whose
    type is the key's type), what is allowed (for the error) and the check itself; ``doc``
    says what it does and ``source`` where its default comes from (a paper's section,
    PFLlib's file, "our choice"). docs/configuration.md's tables are made from these
    (``python -m fedreg_tools.config_doc``)."""
    return dataclasses.field(
        default=default,
        metadata={"key": key, "allowed": allowed, "valid": valid, "doc": doc, "source": source},
    )


def at_least(minimum: float) -> Callable[[Any], bool]:
    return lambda value: value >= minimum


def positive(value: Any) -> bool:
    """A number > 0 (a step size, a threshold, a regulariser's divisor)."""
    return value > 0


@dataclass(frozen=True)
class AlgorithmOptions:
    """Base of every algorithm's options: a frozen dataclass whose fields are declared with
    :func:`option`, read and checked once from the run config, used by the algorithm's
    client and strategy alike. The base has no keys (FedAvg, FedPer, ...)."""

    #: Linear layers in the head when ``head-depth = "auto"``: the source's split. PFLlib
    #: cuts FedPer, FedRep, FedBABU, FedRoD, LG-FedAvg and GPFL at ``model.fc`` (one
    #: layer); ``002``-``004`` take "the last fully connected layer". FedReG overrides it.
    default_head_depth: ClassVar[int] = 1
    #: This algorithm's keys added after runs of it were recorded, whose default is not
    #: what those runs did: key -> the value they ran with (see :func:`as_ran`).
    earlier_meaning: ClassVar[Mapping[str, Any]] = {}

    @classmethod
    def declared(cls) -> dict[str, Any]:
        """{run-config key: default} of this algorithm's own keys."""
        return {f.metadata["key"]: f.default for f in dataclasses.fields(cls)}

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> AlgorithmOptions:
        values = {}
        for field in dataclasses.fields(cls):
            key = field.metadata["key"]
            value = _coerce(key, run_config.get(key, field.default), type(field.default))
            if not field.metadata["valid"](value):
                _fail(key, value, field.metadata["allowed"])
            values[field.name] = value
        return cls(**values)

    def check(self, config: RunConfig) -> None:
        """Checks that need the rest of the run config (e.g. rounds); none by default."""

    def to_run_config(self) -> dict[str, Any]:
        return {f.metadata["key"]: getattr(self, f.name) for f in dataclasses.fields(self)}


#: ``algo`` name -> its options type; given by the registry (this module sits below it).
Catalog = Mapping[str, type[AlgorithmOptions]]


Options = TypeVar("Options", bound=AlgorithmOptions)


@dataclass(frozen=True)
class RunConfig:
    """The keys every algorithm shares, each declared with :func:`core_key` (default,
    allowed values, meaning, source of the default), and the chosen algorithm's options."""

    algo: str = core_key(
        "fedreg",
        "an algorithm's name in the registry",
        doc="The algorithm, by its name in `fedreg_app/registry.py` ([Algorithms]"
        "(algorithms.md) describes each: FedReG, the FedReG paper's baselines, the related "
        "methods and two references). Every algorithm runs on the same partition.",
        source="our choice: the paper's algorithm (`000`)",
    )
    dataset: str = core_key(
        "zalando-datasets/fashion_mnist",
        "a Hugging Face hub id",
        doc="The dataset, by its Hugging Face hub id. The datasets and models page lists "
        "the ones checked.",
        source="paper §4.1, thesis §5.2 (Fashion-MNIST, one of their datasets)",
    )
    dataset_path: str = core_key(
        "",
        'an absolute folder path (or ~/...), or ""',
        doc="A local copy of the dataset in hub layout: a folder with `train.parquet`, and "
        "`test.parquet` or `valid.parquet` where the dataset has a second split. "
        '`""`: load `dataset` from the hub. A relative path is refused: the app runs in '
        "the SuperLink's working directory (`fedreg-experiment` makes it absolute).",
        source="our choice",
    )
    alpha: float = core_key(
        0.1,
        "a number > 0",
        doc="Dirichlet concentration of the label partition: the smaller, the fewer "
        "classes a client holds.",
        source="paper §4.1, thesis §5.3 (0.1 and 0.5)",
    )
    partition: str = core_key(
        "dirichlet",
        _one_of(PARTITIONS),
        doc="`dirichlet`: label skew by `alpha` (flwr-datasets' `DirichletPartitioner`); "
        "`dirichlet-topup`: the same, clients below `min-partition-size` topped up from "
        "the largest (needed for 200-500 clients at `alpha` 0.1); `shard`: "
        "`shard-classes` classes per client (flwr-datasets' `PathologicalPartitioner`); "
        "`natural`: the dataset's own clients, such as Shakespeare's speaking roles, one "
        "per SuperNode, drawn with the seed among those with `min-partition-size` samples.",
        source="paper §4.1, thesis §5.3 (Dirichlet); `003` (shard, natural)",
    )
    dirichlet_balance: bool = core_key(
        True,
        "true or false",
        doc="Dirichlet partitions: each class in turn is split only over the clients not "
        "yet above the mean partition size (flwr-datasets' `self_balancing`). `false`: "
        "the plain Dirichlet split.",
        source="thesis §4.1: its partition code, that of its [38] (PFNM), has this rule, "
        "as PFLlib's `dataset_utils.py` has",
    )
    shard_classes: int = core_key(
        2,
        "an integer >= 1",
        doc='Classes per client with `partition = "shard"`.',
        source="our choice (`003` varies it: 1, 5, 10, 50)",
    )
    participation_gamma: float = core_key(
        0.0,
        "a number >= 0",
        doc="Client sampling. 0: uniform. Above 0: each client's sampling probability is "
        "drawn once, with the seed, from Dirichlet(γ); the smaller γ, the more skewed.",
        source="the papers sample uniformly; γ > 0 is `003` §4.4",
    )
    data_fraction: float = core_key(
        1.0,
        "a fraction in (0, 1]",
        doc="Keep a seeded random fraction of the pooled dataset, for quick runs.",
        source="our choice (the sources use whole datasets)",
    )
    min_partition_size: int = core_key(
        10,
        "an integer >= 2",
        doc="Fewest samples a client may hold before its 75/25 train/test split "
        "(paper §4.1). A Dirichlet partition is drawn up to 10 times to give every "
        "client as many; then the run stops with an error saying what to change.",
        source="our choice",
    )
    fraction_train: float = core_key(
        0.25,
        "a fraction in (0, 1]",
        doc="Fraction of the clients trained each round.",
        source="thesis §5.3, §5.4.1 (5 of 20 clients); the paper's §4.3 says 0.2 for "
        "the same figures",
    )
    num_server_rounds: int = core_key(
        10,
        "an integer >= 1",
        doc="Rounds of federated training.",
        source="our choice, for a short first run; the sources run 100 (paper §4.1), as "
        "the files in `configs/` do",
    )
    local_epochs: int = core_key(
        5,
        "an integer >= 1",
        doc="E: local epochs of each training step.",
        source="paper §4.1, thesis §5.3",
    )
    batch_size: int = core_key(
        20,
        "an integer >= 1",
        doc="Mini-batch size of training.",
        source="paper §4.1, thesis §5.3 (the paper's Table 3: 10 at 100 clients, 1 at 200 and 500)",
    )
    lr: float = core_key(
        0.01,
        "a number > 0",
        doc="SGD learning rate.",
        source="paper §4.1, thesis §5.3",
    )
    momentum: float = core_key(
        0.9,
        "a number in [0, 1)",
        doc="SGD momentum. The proximal gradients of FedProx and Ditto go through it too.",
        source="paper §4.1, thesis §5.3. PFLlib's SGD has none (`clientbase.py`; FedProx's "
        "and Ditto's `PerturbedGradientDescent` neither)",
    )
    drop_last: bool = core_key(
        True,
        "true or false",
        doc="Each epoch leaves out its last batch when it is smaller than `batch-size` (a "
        "different few samples each epoch, as the order is reshuffled); a client with "
        "fewer train samples than `batch-size` trains nothing. `false`: every sample "
        "every epoch, the last batch short. Evaluation always uses every sample.",
        source="PFLlib's training loader (`clientbase.py`: `DataLoader(..., "
        "drop_last=True)`), the code the thesis ran; the papers do not say",
    )
    optimizer_state: str = core_key(
        "persistent",
        _one_of(OPTIMIZER_STATES),
        doc="`persistent`: each client's optimizers, one per step of its algorithm "
        "(FedReG's opt_1 and opt_2), are made once and kept with its private state, so "
        "momentum carries over from round to round; this costs one model copy per "
        "optimizer per client. `fresh`: a new optimizer for every step of every round.",
        source="thesis §3.3.2, §4.3 (opt_1 and opt_2 made once per client); PFLlib also "
        "makes each client's optimizer once, but its plain SGD keeps no state",
    )
    flush_denormals: bool = core_key(
        True,
        "true or false",
        doc="On a CPU, numbers below 1.2e-38 in magnitude (denormals) are read and written "
        "as zero (`torch.set_flush_denormal`) wherever the run trains or evaluates. x86 "
        "CPUs compute with denormals up to a hundred times slower: a client whose "
        "activations or gradients fall that low trained ten times slower (140 against "
        "1,400 samples a second, FMNIST, FedAvg, round 4). `false`: full IEEE arithmetic, "
        "as PyTorch does by default. GPUs are not affected.",
        source="ours (not in the papers, PFLlib or PyTorch's defaults): a speed setting "
        "whose only effect on figures is below 1.2e-38",
    )
    seed: int = core_key(
        0,
        "an integer from 0 to 2**63 - 1",
        doc="Seeds the partition, client sampling, initialisation, shuffling and "
        "augmentation. The bound is Flower's signed 64-bit integer.",
        source="our choice",
    )
    model: str = core_key(
        "convnet",
        _one_of(MODELS),
        doc="`convnet`: the paper's ConvNet, that of FedDyn and FedRoD; `cnn`: the "
        "2-conv/2-FC CNN of `002` and `004`; `fedavgcnn`: PFLlib's FedAvgCNN; `mlp`: "
        "input → 100 → classes, for weak devices; `charlstm`: `003`'s next-character "
        "LSTM for Shakespeare. `mlp` and `charlstm` need `head-depth` 1, `fedavgcnn` 1 or 2.",
        source="paper §4.1, thesis §5.3",
    )
    #: An int once the config is built (``__post_init__``), so the model, checkpoints and
    #: results.json see the depth that ran; ``given`` keeps "auto".
    head_depth: int | str = core_key(
        HEAD_DEPTH_AUTO,
        HEAD_DEPTH_ALLOWED,
        doc='Linear layers in the head. `"auto"`: the algorithm\'s own split: 2 for FedReG '
        "and its ablations, 1 (the last Linear) for every other algorithm and for `mlp` "
        "and `charlstm`. Resolved when the config is read: `results.json` and "
        "checkpoints record the number that ran.",
        source="thesis §5.5, Table 5.4 (FedReG: 2); PFLlib cuts the baselines at "
        "`model.fc` (`main.py`), and `002`-`004` take the last Linear as the head. The "
        "FedReG paper does not state the baselines' split",
    )
    threshold: str = core_key(
        "mean",
        f"{_one_of(THRESHOLD_STATISTICS)}, or an integer >= 1",
        doc="FedReG's rebalancing target t. `mean`, `median`, `max`, `secmin`: a "
        "statistic of the client's non-zero class counts; `global-…`: t = D / C, D the "
        "statistic of all clients' train sizes, C the client's number of classes; "
        "`auto`: the largest t up to the client's mean whose rebalanced set is at least "
        "half original samples (less training where a client's classes are skewed); an "
        "integer: that count.",
        source="thesis §3.3.1, §5.4.3 (the mean, recommended); the paper's Table 1 equals "
        "the thesis's Table 5.1, made per client. `global-…` reads the paper's §3.4. "
        "`auto` is our variant, for the paper's §6 (a threshold that cuts local training "
        "while keeping accuracy)",
    )
    augment: str = core_key(
        "simple",
        _one_of(AUGMENTATIONS),
        doc="How FedReG makes the extra samples of its rebalanced set: `simple`, a mild "
        "5-step augmentation (flip, crop, rotation, colour jitter, affine shift and "
        "scale); `auto`: torchvision's AutoAugment, CIFAR-10 policy.",
        source="thesis §5.4.3 (recommended), paper §4.3, Table 1 (simple beats AutoAugment)",
    )
    eval_every: int = core_key(
        1,
        "an integer >= 1",
        doc="Evaluate every n rounds, and always after the last.",
        source="paper §4.1, thesis §5.3 (the best accuracy over all rounds is reported)",
    )
    global_eval: str = core_key(
        "auto",
        _one_of(GLOBAL_EVALS),
        doc="Who evaluates the global model: `clients`, each on its test split, the "
        "counts summed; `server`, the ServerApp on its own copy of the union of the test "
        "splits; `auto`: the clients, except for LG-FedAvg. Both give the same figures.",
        source="our choice; the global test set is the union of the clients' test "
        "splits (paper §4.1)",
    )
    results_dir: str = core_key(
        "results",
        "a folder",
        doc="Where run folders are written.",
        source="our choice",
    )
    device: str = core_key(
        "auto",
        _one_of(DEVICES),
        doc="`auto`: CUDA where torch sees a GPU, else the CPU. In Flower's simulation a "
        "client sees a GPU only when it reserves a share of one (`fedreg-experiment "
        "--client-gpus 0.1`, or `client-resources-num-gpus`). On CUDA the process uses "
        "deterministic kernels.",
        source="our choice",
    )
    cuda_graphs: bool = core_key(
        False,
        "true or false; false with drop-last = false",
        doc="Where a client trains on CUDA, capture one training step as a CUDA graph "
        "after 3 eager warm-up steps and replay it for every other batch; elsewhere it "
        "changes nothing. Needs `drop-last = true` (a replayed step has one batch size).",
        source="our choice: opt-in until checked on a GPU inside the training loop",
    )
    state_dir: str = core_key(
        "",
        'a folder, or ""',
        doc='Where clients keep their private state and decoded data; `""`: in memory. '
        "A node's own `--node-config` `state-dir` wins.",
        source="our choice",
    )
    init_model: str = core_key(
        "",
        'the absolute path (or ~/...) of a .npz or .pt state dict, or ""',
        doc="Start from a pre-trained state dict (keys `base.*`, `head_g.*`; `.pt` read "
        "with PyTorch's `weights_only` loader); a private head starts as its head. The "
        "record keeps the file's sha256; a node's own copy must hold the same bytes.",
        source="our choice: a seeded random initial model (`003` also starts from a "
        "pre-trained one)",
    )
    resume: str = core_key(
        "",
        'a run folder, or ""',
        doc="Continue the run in this folder from its last checkpoint.",
        source="our choice",
    )
    min_train_replies: int = core_key(
        1,
        "an integer >= 1, at most the clients sampled a round",
        doc="Fewest training replies a round aggregates; with fewer connected clients "
        "the server waits.",
        source="our choice",
    )
    reply_timeout: float = core_key(
        0.0,
        "seconds >= 0",
        doc="Seconds to wait for replies; 0: until each node answers or is found gone.",
        source="our choice",
    )
    tensorboard: bool = core_key(
        False,
        "true or false",
        doc="Also write each round's scalars as TensorBoard event files in the run "
        "folder; needs the `tensorboard` extra.",
        source="our choice",
    )
    dp_mode: str = core_key(
        "off",
        _one_of(DP_MODES),
        doc="Client-level differential privacy: `central`, the server clips each update "
        "and noises the aggregate; `local`, each client clips and noises its own update. "
        "The other `dp-` keys must be set when it is on.",
        source="our choice: the sources train without DP",
    )
    dp_noise_multiplier: float = core_key(
        0.0,
        "a number >= 0; > 0 when dp-mode is on",
        doc="z: the noise's standard deviation over the replace-one sensitivity 2C.",
        source="none: to be set with `dp-mode`",
    )
    dp_clip: float = core_key(
        0.0,
        "a number >= 0; > 0 when dp-mode is on",
        doc="C: L2 bound of a client's update, over all the groups it sends, jointly.",
        source="none: to be set with `dp-mode`",
    )
    dp_delta: float = core_key(
        0.0,
        "a probability in [0, 1); in (0, 1) when dp-mode is on",
        doc="δ at which ε is reported, e.g. 1e-5.",
        source="none: to be set with `dp-mode`",
    )
    dp_seeded_noise: bool = core_key(
        True,
        "true or false",
        doc="Draw the DP noise from the run's seed (reproducible research; whoever knows "
        "the seed can remove it), or, `false`, from the OS's entropy, as a deployment "
        "that needs the guarantee must.",
        source="our choice",
    )
    update_norm_factor: float = robustness.UPDATE_NORM_FACTOR
    aggregation: str = robustness.AGGREGATION
    trim_fraction: float = robustness.TRIM_FRACTION
    krum_byzantine: int = robustness.KRUM_BYZANTINE
    multi_krum_keep: int = robustness.MULTI_KRUM_KEEP
    clip_norm: float = robustness.CLIP_NORM
    fltrust_root_samples: int = robustness.FLTRUST_ROOT_SAMPLES
    lfr_reject: int = robustness.LFR_REJECT
    flame_noise: float = robustness.FLAME_NOISE
    attack: str = robustness.ATTACK
    attack_fraction: float = robustness.ATTACK_FRACTION
    attack_scale: float = robustness.ATTACK_SCALE
    new_client_fraction: float = new_clients.NEW_CLIENT_FRACTION
    new_client_epochs: int = new_clients.NEW_CLIENT_EPOCHS
    #: The chosen algorithm's own keys (``prox-mu``, ``fedreg-head-weight``, ...).
    options: AlgorithmOptions = dataclasses.field(default_factory=AlgorithmOptions)
    #: Every key as given (other algorithms' keys too), for ``results.json``.
    given: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        """Resolve ``head-depth = "auto"`` with the algorithm's options (those of
        :meth:`from_run_config`; a test's ``RunConfig()`` has the base options: 1)."""
        if self.head_depth == HEAD_DEPTH_AUTO:
            object.__setattr__(self, "head_depth", auto_head_depth(self.model, self.options))

    @classmethod
    def core_keys(cls) -> dict[str, Any]:
        """{run-config key: default} of the keys every algorithm shares."""
        return {
            f.name.replace("_", "-"): f.default
            for f in dataclasses.fields(cls)
            if f.name not in ("options", "given")
        }

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any], catalog: Catalog) -> RunConfig:
        """Build from Flower's run config (hyphenated keys) and check every key once:
        the shared ones here, each algorithm's through its options type in ``catalog``
        (the registry's), so that a bad value of any key fails before any work."""
        known = set(cls.core_keys()).union(*(o.declared() for o in catalog.values()))
        for key in run_config:
            if key not in known:
                raise ConfigError(unknown_key_message(key, known))
        values: dict[str, Any] = {"given": dict(run_config)}
        for key, default in cls.core_keys().items():
            if key in run_config:
                values[key.replace("-", "_")] = _coerce(key, run_config[key], type(default))
        algo = values.get("algo", cls.algo)
        if algo not in catalog:
            _fail("algo", algo, f"one of {', '.join(sorted(catalog))}")
        every = {name: kind.from_run_config(run_config) for name, kind in catalog.items()}
        config = cls(**values, options=every[algo])
        config.validate()
        config.options.check(config)
        return config

    def to_run_config(self) -> dict[str, Any]:
        """The hyphenated form, as Flower and ``results.json`` show it (all keys)."""
        core = {key: getattr(self, key.replace("-", "_")) for key in self.core_keys()}
        return {**self.given, **core, **self.options.to_run_config()}

    def options_as(self, kind: type[Options]) -> Options:
        """The algorithm's options as ``kind``; a config built without them (a test's
        ``RunConfig()``) gets the defaults of ``kind``."""
        if isinstance(self.options, kind):
            return self.options
        if type(self.options) is AlgorithmOptions:
            return kind()
        raise TypeError(f"options are {type(self.options).__name__}, not {kind.__name__}")

    def validate(self) -> None:
        """Raise :class:`ConfigError` for the first value that cannot work."""
        if not 0 <= self.seed <= MAX_SEED:
            _fail("seed", self.seed, f"an integer from 0 to {MAX_SEED} (2**63 - 1)")
        if not self.alpha > 0:
            _fail("alpha", self.alpha, "a number > 0 (Dirichlet concentration)")
        if self.partition not in PARTITIONS:
            _fail("partition", self.partition, f"one of {', '.join(PARTITIONS)}")
        if self.shard_classes < 1:
            _fail("shard-classes", self.shard_classes, "an integer >= 1 (classes per client)")
        if self.participation_gamma < 0:
            _fail(
                "participation-gamma",
                self.participation_gamma,
                "a number >= 0 (0: uniform sampling; else Dirichlet(gamma) probabilities)",
            )
        if not 0 < self.data_fraction <= 1:
            _fail("data-fraction", self.data_fraction, "a fraction in (0, 1]")
        if not 0 < self.fraction_train <= 1:
            _fail("fraction-train", self.fraction_train, "a fraction in (0, 1]")
        if self.model not in MODELS:
            _fail("model", self.model, f"one of {', '.join(MODELS)}")
        if self.head_depth not in HEAD_DEPTHS:
            _fail("head-depth", self.head_depth, HEAD_DEPTH_ALLOWED)
        if self.model in ONE_LAYER_HEADS and self.head_depth != 1:
            _fail(
                "head-depth",
                self.head_depth,
                f"1 with model='{self.model}' ({ONE_LAYER_HEADS[self.model]})",
            )
        if self.augment not in AUGMENTATIONS:
            _fail("augment", self.augment, f"one of {', '.join(AUGMENTATIONS)}")
        if self.global_eval not in GLOBAL_EVALS:
            _fail("global-eval", self.global_eval, f"one of {', '.join(GLOBAL_EVALS)}")
        if self.device not in DEVICES:
            _fail("device", self.device, f"one of {', '.join(DEVICES)}")
        if self.cuda_graphs and not self.drop_last:
            _fail("cuda-graphs", True, "false with drop-last = false (a captured step "
                  "replays batches of one size; the short last batch has another)")  # fmt: skip
        threshold_statistic_or_count(self.threshold)
        for key, value, minimum in (
            ("num-server-rounds", self.num_server_rounds, 1),
            ("local-epochs", self.local_epochs, 1),
            ("batch-size", self.batch_size, 1),
            ("eval-every", self.eval_every, 1),
            ("min-partition-size", self.min_partition_size, 2),
            ("min-train-replies", self.min_train_replies, 1),
        ):
            if value < minimum:
                _fail(key, value, f"an integer >= {minimum}")
        if not self.reply_timeout >= 0:
            _fail("reply-timeout", self.reply_timeout, "seconds >= 0 (0: wait for every reply)")
        if not self.lr > 0:
            _fail("lr", self.lr, "a number > 0")
        if not 0 <= self.momentum < 1:
            _fail("momentum", self.momentum, "a number in [0, 1)")
        if self.optimizer_state not in OPTIMIZER_STATES:
            _fail("optimizer-state", self.optimizer_state, f"one of {', '.join(OPTIMIZER_STATES)}")
        self.validate_privacy()
        robustness.check_robustness(self)
        new_clients.check_new_clients(self)
        if not self.dataset and not self.dataset_path:
            _fail("dataset", self.dataset, "a Hugging Face hub id, or set dataset-path")
        if self.dataset_path:
            check_dataset_path(self.dataset_path)
        if self.init_model and not Path(self.init_model).expanduser().is_file():
            _fail("init-model", self.init_model, "the path of a .npz or .pt state dict")

    @property
    def keeps_optimizers(self) -> bool:
        """Whether clients carry optimizer state (momentum buffers) between rounds."""
        return self.optimizer_state == "persistent" and self.momentum > 0

    def validate_privacy(self) -> None:
        """The ``dp-`` keys: never negative, and all set once ``dp-mode`` is on."""
        if self.dp_mode not in DP_MODES:
            _fail("dp-mode", self.dp_mode, f"one of {', '.join(DP_MODES)}")
        on = self.dp_mode != "off"
        when = f" with dp-mode={self.dp_mode!r}" if on else ""
        if not (self.dp_noise_multiplier > 0 if on else self.dp_noise_multiplier >= 0):
            _fail("dp-noise-multiplier", self.dp_noise_multiplier,
                  f"a number > 0{when} (the noise std over the clipping bound)")  # fmt: skip
        if not (self.dp_clip > 0 if on else self.dp_clip >= 0):
            _fail("dp-clip", self.dp_clip, f"a number > 0{when} (L2 bound of a client update)")
        if not (0 < self.dp_delta < 1 if on else 0 <= self.dp_delta < 1):
            _fail("dp-delta", self.dp_delta,
                  f"a probability in (0, 1){when}, e.g. 1e-5 (it has no default)")  # fmt: skip

    @property
    def private(self) -> bool:
        """Whether client-level differential privacy is on."""
        return self.dp_mode != "off"

    def is_eval_round(self, server_round: int) -> bool:
        """Evaluate every ``eval-every`` rounds and always after the last one."""
        return server_round % self.eval_every == 0 or server_round == self.num_server_rounds


def auto_head_depth(model: str, options: AlgorithmOptions) -> int:
    """What ``head-depth = "auto"`` means: the algorithm's split, but 1 for a model
    whose head is a single Linear layer (``mlp``, ``charlstm``)."""
    return 1 if model in ONE_LAYER_HEADS else options.default_head_depth


def head_depth_or_auto(value: Any) -> int | str:
    """``head-depth`` as given: "auto" or an integer (TOML may give a whole float)."""
    if value == HEAD_DEPTH_AUTO:
        return HEAD_DEPTH_AUTO
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and math.isfinite(value) and float(value).is_integer():
        return int(value)
    _fail("head-depth", value, HEAD_DEPTH_ALLOWED)
    raise AssertionError("unreachable")


def threshold_statistic_or_count(threshold: str) -> str | int:
    """Parse ``threshold``: a statistic name, or a positive integer given as text."""
    text = str(threshold).strip()
    if text in THRESHOLD_STATISTICS:
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    _fail("threshold", threshold, f"one of {', '.join(THRESHOLD_STATISTICS)} or an integer >= 1")
    raise AssertionError("unreachable")


SECOND_SPLITS = ("test", "valid", "validation")  # merged with train into one pool


def check_dataset_path(dataset_path: str) -> Path:
    """A local dataset folder in hub layout: ``train.parquet`` and, where the dataset has
    one, a second split ``test.parquet`` (or ``valid``/``validation``, as Tiny-ImageNet
    names it). Shakespeare has a train split only."""
    folder = Path(dataset_path).expanduser()
    if not (folder / "train.parquet").is_file():
        raise ConfigError(
            f"dataset-path={dataset_path!r}: train.parquet not found in {folder.resolve()}; "
            "expected a folder with train.parquet (and test.parquet or valid.parquet if the "
            'dataset has a second split) in Hugging Face layout, or dataset-path="" to load '
            "the hub dataset"
        )
    return folder.resolve()


#: Run-config keys that name input files: the dataset folder and the initial model.
INPUT_PATH_KEYS = ("dataset-path", "init-model")


def refuse_relative_paths(run_config: Mapping[str, Any], named: str = "") -> None:
    """Raise :class:`ConfigError` for a relative :data:`INPUT_PATH_KEYS` path in the run
    config a ServerApp or ClientApp was given (``named``: how to call the key there). Why:
    these apps run in the SuperLink's working directory (the managed local SuperLink's
    is the folder of the ``flwr run`` that started it), and Flower passes the app no trace
    of the folder ``flwr run`` was called from (neither the folder nor the app's path), so
    a relative path would be read against another folder than the user's. ``~`` is fine.
    ``fedreg-experiment`` and ``fedreg-replay`` make such paths absolute before they submit
    a run; a SuperNode's own ``--node-config dataset-path`` is read in the SuperNode's
    working directory, where it was started (the ClientApp's node config)."""
    for key in INPUT_PATH_KEYS:
        value = run_config.get(key)
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            raise ConfigError(
                f"{named or key}={value!r} is a relative path; give an absolute one (the "
                f"output of `realpath {value}`): the app runs in the SuperLink's working "
                "directory, not in the folder `flwr run` was called from, so a relative "
                "path would name another folder"
            )


#: Run-config keys that say where and how a run ran, not what it computes (paths, the
#: device, logging, how failures are waited for, where G is evaluated: the same figures):
#: two runs that differ in these alone are runs of one setting.
PLACE_KEYS = frozenset(
    {"resume", "results-dir", "state-dir", "dataset-path", "device", "cuda-graphs",
     "tensorboard", "reply-timeout", "min-train-replies", "global-eval"}
)  # fmt: skip


def is_count(value: Any) -> bool:
    """An integer >= 1 (not a bool, which Python counts as an int): rounds, seeds, clients."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def is_whole(value: Any) -> bool:
    """An integer >= 0 (not a bool): counts that may be none."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


#: Shared keys added after runs were recorded, whose default is not what those runs did:
#: the value with which a recorded config that lacks the key ran (before 0.4.0 every epoch
#: trained its last partial batch; before 0.3.0 every Dirichlet partition was drawn
#: without self-balancing; before 0.2.0 optimizers were made afresh). An algorithm's own
#: keys say theirs on its options (:attr:`AlgorithmOptions.earlier_meaning`). Read every
#: recorded config through :func:`as_ran`, or an old record passes for the current
#: default setting.
EARLIER_MEANING: dict[str, Any] = {
    "dirichlet-balance": False,
    "drop-last": False,
    "flush-denormals": False,
    "optimizer-state": "fresh",
}
DIRICHLET_PARTITIONS = ("dirichlet", "dirichlet-topup")


def earlier_meanings(catalog: Catalog) -> dict[str, Any]:
    """Every key's earlier meaning: the shared keys' and each algorithm's own."""
    every = dict(EARLIER_MEANING)
    for options in catalog.values():
        every.update(options.earlier_meaning)
    return every


def as_ran(recorded: Mapping[str, Any], catalog: Catalog) -> dict[str, Any]:
    """A recorded run config with the keys its version lacked, where they matter to it,
    set to what it did: a shared key's earlier meaning (``dirichlet-balance`` only for a
    Dirichlet partition), and those of the recorded algorithm's own keys (``catalog``,
    the registry's: a FedAvg record never had FedBABU's keys)."""
    applies = dict(EARLIER_MEANING)
    if recorded.get("partition", "dirichlet") not in DIRICHLET_PARTITIONS:
        applies.pop("dirichlet-balance")
    options = catalog.get(recorded.get("algo", RunConfig.algo))
    if options is not None:
        applies.update(options.earlier_meaning)
    missing = {key: value for key, value in applies.items() if key not in recorded}
    return {**missing, **recorded}


def setting_differences(
    ours: Mapping[str, Any], theirs: Mapping[str, Any], catalog: Catalog,
    ignore: Iterable[str] = (),
) -> list[str]:  # fmt: skip
    """Where two recorded run configs are not one setting: ``key=ours, not theirs`` for
    each key both record with different values, leaving out :data:`PLACE_KEYS` and
    ``ignore``; a key one record lacks is read as its version ran it (:func:`as_ran`) or,
    where that is not known, not judged. Why: figures are published per setting, so runs
    of another setting must never be counted as this one's (a finished run of an edited
    config, a seed run elsewhere, a run of an earlier version)."""
    ours, theirs = as_ran(ours, catalog), as_ran(theirs, catalog)
    skipped = PLACE_KEYS | set(ignore)
    return [
        f"{key}={ours[key]!r}, not {theirs[key]!r}"
        for key in sorted(ours.keys() & theirs.keys())
        if key not in skipped and ours[key] != theirs[key]
    ]


def unknown_key_message(key: str, known: Iterable[str], where: str = "run config") -> str:
    """Our message for a key nobody declares, with the closest declared keys."""
    close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(repr(k) for k in close)}?" if close else ""
    return (
        f"{key!r} is not a key of the {where}{hint} (the declared keys are those of "
        "[tool.flwr.app.config] in pyproject.toml)"
    )


def _coerce(key: str, value: Any, wanted: type) -> Any:
    """Flower gives TOML scalars; accept ints for floats and numbers for the threshold.
    Floats must be finite: ``nan`` compares false with every bound and would slip past
    range checks. ``head-depth`` is "auto" or an integer."""
    if key == "head-depth":
        return head_depth_or_auto(value)
    if wanted is float and isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ConfigError(f"{key}={value!r} is not allowed: expected a finite number")
        return float(value)
    if wanted is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if wanted is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if wanted is str and key == "threshold" and isinstance(value, int):
        return str(value)
    if isinstance(value, wanted):
        return value
    kinds = {float: "a number", int: "an integer", bool: "true or false", str: "a string"}
    raise ConfigError(f"{key}={value!r} is not allowed: expected {kinds.get(wanted, wanted)}")
