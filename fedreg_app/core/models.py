"""Models split into named parameter groups: ``base``, ``head_g`` and ``head_p``.

Strategies and clients split parameters by these state-dict prefixes, never by position.
``head_g`` is the head shared with the server; ``head_p`` (present only when an algorithm
asks for a private head) has the same structure and never leaves the client.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedreg_app.core.config import ConfigError, RunConfig
from fedreg_app.core.data import IMAGE, TEXT, DatasetInfo
from fedreg_app.core.persist import load_arrays

BASE = "base"
HEAD_G = "head_g"
HEAD_P = "head_p"
EXTRA = "extra"  # algorithm-specific modules, e.g. GPFL's embeddings: ``extra.<name>.*``
GROUPS = (BASE, HEAD_G, HEAD_P, EXTRA)


def group_of(key: str) -> str:
    """The parameter group a state-dict key belongs to (its first path component)."""
    group = key.split(".", 1)[0]
    if group not in GROUPS:
        raise KeyError(f"state-dict key {key!r} belongs to no parameter group {GROUPS}")
    return group


def checked_value(key: str, value: object, into: torch.Tensor) -> torch.Tensor:
    """``value`` as a tensor to copy into ``into``, refused (ValueError naming the key)
    unless it has exactly its shape and dtype and, for floats, finite entries. A model's
    values come from the wire (the server's message) or the disk (private state, an
    ``init-model`` file); ``copy_`` alone would broadcast a wrong shape and cast a wrong
    dtype without a word, and a NaN would be trained on and saved as private state."""
    if isinstance(value, np.ndarray) and not value.dtype.isnative:
        value = value.astype(value.dtype.newbyteorder("="))  # the same numbers, read here
    try:
        tensor = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"{key}: cannot be read as a tensor ({err})") from None
    if tuple(tensor.shape) != tuple(into.shape) or tensor.dtype != into.dtype:
        raise ValueError(
            f"{key}: got {str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}, "
            f"expected {str(into.dtype).removeprefix('torch.')}{list(into.shape)}"
        )
    if tensor.is_floating_point() and not torch.isfinite(tensor).all():
        raise ValueError(f"{key}: holds NaN or infinite values")
    return tensor


def check_keys(what: str, expected: Iterable[str], given: Iterable[str]) -> None:
    """A KeyError naming the missing and the unexpected keys, unless the two sets match:
    arrays from the wire or the disk must be exactly the entries they stand for."""
    expected, given = set(expected), set(given)
    if expected != given:
        missing, extra = sorted(expected - given), sorted(given - expected)
        raise KeyError(f"{what}: missing keys {missing}, unexpected keys {extra}")


class SplitModel(nn.Module):
    """``base`` then ``head_g`` (global prediction); optional ``head_p`` (private)."""

    def __init__(self, base: nn.Module, head_g: nn.Module, head_p: nn.Module | None) -> None:
        super().__init__()
        self.base = base
        self.head_g = head_g
        self.head_p = head_p
        # Empty unless an algorithm adds modules; adds no state-dict keys when empty.
        self.extra = nn.ModuleDict()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The global model's prediction: head_g(base(x))."""
        return self.head_g(self.base(x))

    def group_state(self, *groups: str) -> dict[str, np.ndarray]:
        """The named groups' parameters as numpy arrays (copies), keyed by full name."""
        return {
            key: value.detach().cpu().numpy().copy()
            for key, value in self.state_dict().items()
            if group_of(key) in groups
        }

    def load_group_state(self, arrays: dict[str, np.ndarray], *groups: str) -> None:
        """Load exactly the named groups; a missing or unexpected key is an error."""
        own = {k: v for k, v in self.state_dict().items() if group_of(k) in groups}
        given = {k: v for k, v in arrays.items() if group_of(k) in groups}
        check_keys(f"groups {groups}", own, given)
        with torch.no_grad():
            for key, tensor in own.items():
                tensor.copy_(checked_value(key, given[key], tensor))

    def load_entries(self, arrays: dict[str, np.ndarray]) -> None:
        """Copy in the given entries only (some layers of a group, a partial pre-trained
        file); everything else keeps its values. An unknown key is an error."""
        own = self.state_dict()
        unknown = sorted(set(arrays) - set(own))
        if unknown:
            raise KeyError(f"state-dict keys {unknown} are not in this model")
        with torch.no_grad():
            for key, value in arrays.items():
                own[key].copy_(checked_value(key, value, own[key]))

    def parameters_of(self, *groups: str) -> list[nn.Parameter]:
        return [p for name, p in self.named_parameters() if group_of(name) in groups]

    @property
    def feature_dim(self) -> int:
        """The size of the base's feature: the in-features of the head's first Linear
        layer (the modules FedCP and FedDBE add work on that feature)."""
        return next(m for m in self.head_g.modules() if isinstance(m, nn.Linear)).in_features

    def parameter_names_of(self, *groups: str) -> list[str]:
        """Names in the order of :meth:`parameters_of`."""
        return [name for name, _ in self.named_parameters() if group_of(name) in groups]


class MaxPool2x2(nn.MaxPool2d):
    """``nn.MaxPool2d(2)``, whose inference on the CPU takes the elementwise maximum of
    the window's four strided views. A maximum rounds nothing and propagates NaN as
    max_pool2d does, so the outputs are the same values and the predictions the same
    bit for bit. PyTorch's NCHW CPU kernel took longer than the convolution before it
    here (``benchmarks/eval_batch.py --pool``). A forward that autograd records (training)
    keeps max_pool2d, whose backward every recorded run was trained with."""

    def __init__(self) -> None:
        super().__init__(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or (x.requires_grad and torch.is_grad_enabled()):
            return super().forward(x)
        x = x[..., : x.shape[-2] // 2 * 2, : x.shape[-1] // 2 * 2]  # floor mode drops a tail
        top = torch.maximum(x[..., 0::2, 0::2], x[..., 0::2, 1::2])
        return torch.maximum(top, torch.maximum(x[..., 1::2, 0::2], x[..., 1::2, 1::2]))


def with_torch_max_pool(model: nn.Module) -> nn.Module:
    """The model, in place, with ``nn.MaxPool2d(2)`` wherever it has :class:`MaxPool2x2`:
    the reference that the tests and ``benchmarks/eval_batch.py --pool`` compare with."""
    for name, module in list(model.named_modules()):
        if isinstance(module, MaxPool2x2):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, nn.MaxPool2d(2))
    return model


def convnet_layers(info: DatasetInfo) -> list[nn.Module]:
    """The FedDyn/FedRoD ConvNet (paper Section 4.1), as a flat list of layers."""
    flat = 64 * _conv_out(info.height) * _conv_out(info.width)
    return [
        nn.Conv2d(info.channels, 64, 5), nn.ReLU(), MaxPool2x2(),
        nn.Conv2d(64, 64, 5), nn.ReLU(), MaxPool2x2(),
        nn.Flatten(),
        nn.Linear(flat, 384), nn.ReLU(),
        nn.Linear(384, 192), nn.ReLU(),
        nn.Linear(192, info.num_classes),
    ]  # fmt: skip


def mlp_layers(info: DatasetInfo) -> list[nn.Module]:
    """The thesis testbed's 2-layer MLP (input -> 100 -> classes), for devices too weak for
    the ConvNet (Raspberry Pi-class). Its base is the hidden layer, its head the output
    layer: head-depth 1."""
    return [
        nn.Flatten(),
        nn.Linear(info.channels * info.height * info.width, 100), nn.ReLU(),
        nn.Linear(100, info.num_classes),
    ]  # fmt: skip


def cnn_layers(info: DatasetInfo) -> list[nn.Module]:
    """The 2-conv/2-FC CNN of ``002``/``004`` (FedAvg's CNN), with 'same' padding."""
    return two_conv_cnn(info, padding=2)


def fedavgcnn_layers(info: DatasetInfo) -> list[nn.Module]:
    """PFLlib's ``FedAvgCNN`` (for ``benchmarks/vs_peers.py``, side by side with peers):
    the same layers with 'valid' convolutions, so the flattened size is
    ``64 * 4 * 4 = 1024`` on 28x28 inputs and ``64 * 5 * 5 = 1600`` on 32x32. Same
    parameter shapes and layer order as PFLlib's (conv1, conv2, fc1, fc)."""
    return two_conv_cnn(info, padding=0)


def two_conv_cnn(info: DatasetInfo, padding: int) -> list[nn.Module]:
    """Conv 32 and Conv 64, 5x5 with ``padding`` (2: 'same', 0: 'valid'), each with ReLU
    and 2x2 max-pooling, then Linear -> 512 -> classes."""
    side = (lambda n: n // 4) if padding else _conv_out
    flat = 64 * side(info.height) * side(info.width)
    return [
        nn.Conv2d(info.channels, 32, 5, padding=padding), nn.ReLU(), MaxPool2x2(),
        nn.Conv2d(32, 64, 5, padding=padding), nn.ReLU(), MaxPool2x2(),
        nn.Flatten(),
        nn.Linear(flat, 512), nn.ReLU(),
        nn.Linear(512, info.num_classes),
    ]  # fmt: skip


class CharEmbedding(nn.Embedding):
    """Embedding of int16 character indices (kept compact in memory, widened here)."""

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        return super().forward(indices.long())


class LastStepLSTM(nn.Module):
    """A stacked LSTM over the sequence; its output is the last step's hidden state,
    the feature the next-character head reads."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True)

    def forward(self, sequence: torch.Tensor) -> torch.Tensor:
        outputs, _ = self.lstm(sequence)
        return outputs[:, -1, :]


def charlstm_layers(info: DatasetInfo) -> list[nn.Module]:
    """``003``'s next-character model (from FedAvg's Shakespeare LSTM): embedding 8, two
    LSTM layers of 256, Linear -> vocabulary. Base: embedding + LSTM; head: the Linear."""
    return [
        CharEmbedding(info.num_classes, 8),
        LastStepLSTM(8, 256, num_layers=2),
        nn.Linear(256, info.num_classes),
    ]


MODELS = {
    "convnet": convnet_layers,
    "mlp": mlp_layers,
    "cnn": cnn_layers,
    "fedavgcnn": fedavgcnn_layers,
    "charlstm": charlstm_layers,
}
#: The kind of data each model reads.
MODEL_MODALITY = {
    "convnet": IMAGE,
    "mlp": IMAGE,
    "cnn": IMAGE,
    "fedavgcnn": IMAGE,
    "charlstm": TEXT,
}


def check_model_fits(info: DatasetInfo, model: str) -> None:
    """Image models need images, ``charlstm`` needs next-character text."""
    if MODEL_MODALITY[model] != info.modality:
        allowed = [name for name, kind in MODEL_MODALITY.items() if kind == info.modality]
        raise ConfigError(
            f"model={model!r} is not allowed for this dataset ({info.modality} data): "
            f"expected one of {', '.join(allowed)}"
        )


def _conv_out(size: int) -> int:
    """Side length after two (5x5 valid conv, 2x2 max-pool) stages: 28 -> 4, 32 -> 5."""
    return ((size - 4) // 2 - 4) // 2


def split_layers(layers: list[nn.Module], head_depth: int) -> tuple[list, list]:
    """Head = the last ``head_depth`` Linear layers (with the activations between)."""
    linear_positions = [i for i, layer in enumerate(layers) if isinstance(layer, nn.Linear)]
    if 1 <= head_depth <= len(linear_positions):
        cut = linear_positions[-head_depth]
        if any(p.numel() for layer in layers[:cut] for p in layer.parameters()):
            return layers[:cut], layers[cut:]
    deepest = max(
        d for d in range(1, len(linear_positions) + 1)
        if any(p.numel() for layer in layers[: linear_positions[-d]] for p in layer.parameters())
    )  # fmt: skip
    raise ValueError(
        f"head-depth={head_depth} is not allowed: expected 1..{deepest} for this model "
        "(the base must keep at least one trainable layer)"
    )


def build_model(
    info: DatasetInfo,
    head_depth: int,
    seed: int,
    private_head: bool = False,
    model: str = "convnet",
) -> SplitModel:
    """Seeded initialisation: every process builds the identical initial model, so a
    client can recreate "the initial head" for its private head without asking."""
    check_model_fits(info, model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        base_layers, head_layers = split_layers(MODELS[model](info), head_depth)
        base = nn.Sequential(*base_layers)
        head_g = nn.Sequential(*head_layers)
        head_p = copy.deepcopy(head_g) if private_head else None
    return SplitModel(base, head_g, head_p)


def read_weights(path: Path) -> dict[str, np.ndarray]:
    """A state dict from ``.npz`` (numpy, no pickles) or ``.pt``/``.pth`` (PyTorch's
    ``weights_only`` loader, which refuses anything but tensors and plain containers)."""
    if path.suffix == ".npz":
        return load_arrays(path)
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):
        loaded = loaded["state_dict"]
    return {key: torch.as_tensor(value).numpy() for key, value in loaded.items()}


def load_pretrained(model: SplitModel, path: str) -> None:
    """Start from a pre-trained model (``003``): the file's keys must be this model's
    (``base.*``, ``head_g.*``, ...) with the same shapes and finite values; floats of
    another precision (a float64 ``.npz``, a half-precision checkpoint) are converted to
    the model's; groups it lacks keep their seeded initialisation, and a private head
    starts as a copy of the file's head_g."""
    own = model.state_dict()
    arrays = {
        key: value.astype(own[key].numpy().dtype)
        if key in own and value.dtype.kind == "f" and own[key].is_floating_point()
        else value
        for key, value in read_weights(Path(path)).items()
    }
    if model.head_p is not None and not any(k.startswith(HEAD_P + ".") for k in arrays):
        prefix = HEAD_G + "."
        arrays |= {HEAD_P + "." + k[len(prefix):]: v for k, v in arrays.items()
                   if k.startswith(prefix)}  # fmt: skip
    wrong = sorted(k for k, v in arrays.items() if k not in own or tuple(own[k].shape) != v.shape)
    if wrong:
        raise ConfigError(
            f"init-model={path!r} is not allowed: {len(wrong)} entries do not fit this model "
            f"(model, head-depth, dataset), e.g. {wrong[:3]}; expected keys like "
            f"{list(own)[:2]} with the same shapes"
        )
    try:
        model.load_entries(arrays)
    except ValueError as err:
        raise ConfigError(f"init-model={path!r} is not allowed: {err}") from None


def initial_model(info: DatasetInfo, config: RunConfig, private_head: bool = False) -> SplitModel:
    """The run's starting model: seeded initialisation, then ``init-model`` if given."""
    model = build_model(info, config.head_depth, config.seed, private_head, config.model)
    if config.init_model:
        load_pretrained(model, config.init_model)
    return model
