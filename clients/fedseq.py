"""FedSeq layer scheduling (``004_…``), ``fedseq-vanilla`` and ``fedseq-anti``.

The base is cut into its K trainable layers. ``004`` takes the head to be the last Linear
layer (head-depth 1, its "auto"): its 2-conv/2-FC CNN (``model = "cnn"``) has K = 3 (conv1,
conv2, fc1); the ConvNet has K = 4, or K = 3 with head-depth 2.
The head stays frozen at its shared initialisation. Base layers are unfrozen one at a time
at the rounds in ``fedseq-unfreeze-rounds`` ("1,4,7": the first at round 1, the second at
round 4, ...; empty: evenly spread over the training rounds): Vanilla from the input side,
Anti from the output side. A layer once unfrozen stays so. Only unfrozen base layers are
trained, sent and aggregated; frozen ones stay at the seeded initialisation, identical on
every client. The last ``fedseq-finetune-rounds`` (F) rounds fine-tune base + head on every
client, locally (``004``'s Algorithm 1, lines 20-26, has no aggregation there): the first
fine-tune round starts from the global model, each later one from the client's own
fine-tuned model, kept in its state (``FINETUNED``). The personal model is that fine-tuned
model once it exists, the global model before. The server still averages the fine-tuned
models, but only for the evaluation-only global figure (as for FedPer).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clients.base import ClientProcedure, TrainResult
from fedreg_app.core.config import AlgorithmOptions, ConfigError, RunConfig, at_least, option
from fedreg_app.core.models import BASE, HEAD_G, SplitModel, check_keys
from fedreg_app.core.records import from_record, to_record

UNFREEZE_ROUNDS = "fedseq-unfreeze-rounds"
FINETUNE_ROUNDS = "fedseq-finetune-rounds"


def _round_list(text: str) -> bool:
    return all(part.strip().isdigit() for part in text.split(",")) if text.strip() else True


@dataclass(frozen=True)
class FedSeqOptions(AlgorithmOptions):
    unfreeze_rounds: str = option(
        UNFREEZE_ROUNDS, "", "comma-separated round numbers, or ''", _round_list,
        doc='The round at which each base layer unfreezes, e.g. `"1,4,7"`; `""`: evenly '
        "spread over the rounds.",
        source="`004` Algorithm 1",
    )  # fmt: skip
    finetune_rounds: int = option(
        FINETUNE_ROUNDS, 1, "an integer >= 0", at_least(0),
        doc="Final rounds in which every client fine-tunes its own base and head.",
        source="`004` Algorithm 1",
    )  # fmt: skip

    def check(self, config: RunConfig) -> None:
        finetune_rounds(config)


FINETUNED = "fedseq-finetuned"  # client state: the client's own fine-tuned base + head


def base_layers(model: SplitModel) -> list[str]:
    """Prefixes of the base's trainable layers, input side first (``base.0``, ``base.3``)."""
    children = model.base.named_children()
    return [f"{BASE}.{name}" for name, module in children if list(module.parameters())]


def finetune_rounds(config: RunConfig) -> int:
    rounds = config.options_as(FedSeqOptions).finetune_rounds
    if not 0 <= rounds < config.num_server_rounds:
        raise ConfigError(
            f"{FINETUNE_ROUNDS}={rounds} is not allowed: expected 0..{config.num_server_rounds - 1}"
            " (fewer than num-server-rounds)"
        )
    return rounds


def unfreeze_rounds(config: RunConfig, num_layers: int) -> list[int]:
    """The round at which each layer (in schedule order) is unfrozen."""
    training_rounds = config.num_server_rounds - finetune_rounds(config)
    text = config.options_as(FedSeqOptions).unfreeze_rounds.strip()
    if not text:
        return [1 + k * training_rounds // num_layers for k in range(num_layers)]
    try:
        rounds = [int(part) for part in text.split(",")]
    except ValueError:
        rounds = []
    if len(rounds) != num_layers or rounds != sorted(set(rounds)) or rounds[0] < 1:
        raise ConfigError(
            f"{UNFREEZE_ROUNDS}={text!r} is not allowed: expected {num_layers} increasing "
            f"round numbers >= 1, one per base layer, e.g. "
            f"'{','.join(str(1 + k * training_rounds // num_layers) for k in range(num_layers))}'"
        )
    return rounds


def unfrozen_at(model: SplitModel, config: RunConfig, anti: bool, server_round: int) -> list[str]:
    """Base layers trained (and sent) in this round of the layer-by-layer phase."""
    layers = base_layers(model)[::-1] if anti else base_layers(model)
    starts = unfreeze_rounds(config, len(layers))
    return [layer for layer, start in zip(layers, starts, strict=True) if start <= server_round]


def is_finetuning(config: RunConfig, server_round: int) -> bool:
    return server_round > config.num_server_rounds - finetune_rounds(config)


def of_layers(arrays: dict[str, np.ndarray], layers: list[str]) -> dict[str, np.ndarray]:
    return {k: v for k, v in arrays.items() if any(k.startswith(p + ".") for p in layers)}


class FedSeqClient(ClientProcedure):
    state_records = (FINETUNED,)
    anti = False
    schedule_over_rounds = True  # unfreezing and fine-tune rounds spread over the run

    def train(self, global_arrays: dict[str, np.ndarray], server_round: int) -> TrainResult:
        finetuning = is_finetuning(self.config, server_round)
        if finetuning:
            self.load_global(global_arrays)
            self.restore_finetuned()
            trainable_keys = self.model.parameter_names_of(BASE, HEAD_G)
        else:
            layers = unfrozen_at(self.model, self.config, self.anti, server_round)
            expected = of_layers(dict.fromkeys(self.model.state_dict()), layers)
            check_keys(f"round {server_round} trains layers {layers}", expected, global_arrays)
            self.model.load_entries(global_arrays)  # what the strategy sends; the rest: seeded init
            trainable_keys = list(of_layers(dict.fromkeys(self.model.parameter_names_of(BASE)),
                                            layers))  # fmt: skip
        named = dict(self.model.named_parameters())
        trainable = [named[key] for key in trainable_keys]
        processed = self.fit(trainable, self.cross_entropy(self.model), self.data.train,
                             self.config.local_epochs, server_round)  # fmt: skip
        state = self.model.group_state(BASE, HEAD_G)
        if finetuning:
            self.setup.state[FINETUNED] = to_record(state)
        return TrainResult({k: state[k] for k in trainable_keys}, self.train_metrics(processed))

    def restore_finetuned(self) -> None:
        """The client's own fine-tuned model, over the global one, once it has one."""
        if FINETUNED in self.setup.state:
            self.model.load_group_state(from_record(self.setup.state[FINETUNED]), BASE, HEAD_G)

    def prepare_personal_model(self, server_round: int) -> None:
        self.restore_finetuned()


class FedSeqAntiClient(FedSeqClient):
    anti = True
