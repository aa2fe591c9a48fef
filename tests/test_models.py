"""The ConvNet for 1/3-channel 28/32 inputs, head depths 1-3, groups named by prefix."""

from __future__ import annotations

import pytest
import torch

from fedreg_app.core.data import DatasetInfo
from fedreg_app.core.models import (
    BASE,
    HEAD_G,
    HEAD_P,
    MaxPool2x2,
    build_model,
    group_of,
    with_torch_max_pool,
)
from fedreg_app.registry import load_config


@pytest.mark.parametrize(("channels", "size"), [(1, 28), (3, 32), (1, 32), (3, 28)])
@pytest.mark.parametrize("head_depth", [1, 2, 3])
def test_shapes_and_named_groups(channels: int, size: int, head_depth: int) -> None:
    info = DatasetInfo(num_classes=7, channels=channels, height=size, width=size)
    model = build_model(info, head_depth, seed=0, private_head=True)
    x = torch.randn(3, channels, size, size)
    features = model.base(x)
    assert model(x).shape == (3, 7)
    assert model.head_p(features).shape == (3, 7)
    linear_in_head = sum(isinstance(m, torch.nn.Linear) for m in model.head_g)
    assert linear_in_head == head_depth
    groups = {group_of(k) for k in model.state_dict()}
    assert groups == {BASE, HEAD_G, HEAD_P}
    head_g_shapes = [v.shape for k, v in model.state_dict().items() if k.startswith("head_g.")]
    head_p_shapes = [v.shape for k, v in model.state_dict().items() if k.startswith("head_p.")]
    assert head_g_shapes == head_p_shapes


def test_flattened_size_matches_paper() -> None:
    for size, flat in ((28, 1024), (32, 1600)):
        info = DatasetInfo(num_classes=10, channels=1, height=size, width=size)
        model = build_model(info, 2, seed=0)
        assert model.base(torch.zeros(1, 1, size, size)).shape == (1, 384)
        first_linear = next(m for m in model.base if isinstance(m, torch.nn.Linear))
        assert first_linear.in_features == flat


def test_seeded_initialisation_and_private_head_starts_as_global_head() -> None:
    info = DatasetInfo(num_classes=10, channels=1, height=28, width=28)
    a = build_model(info, 2, seed=5, private_head=True)
    b = build_model(info, 2, seed=5)
    c = build_model(info, 2, seed=6)
    for key, value in b.state_dict().items():
        assert torch.equal(value, a.state_dict()[key])
    assert not torch.equal(b.state_dict()["base.0.weight"], c.state_dict()["base.0.weight"])
    for (_, g), (_, p) in zip(
        a.head_g.state_dict().items(), a.head_p.state_dict().items(), strict=True
    ):
        assert torch.equal(g, p)


def test_load_group_state_rejects_missing_keys() -> None:
    info = DatasetInfo(num_classes=10, channels=1, height=28, width=28)
    model = build_model(info, 2, seed=0)
    arrays = model.group_state(BASE)
    arrays.pop(next(iter(arrays)))
    with pytest.raises(KeyError, match="missing keys"):
        model.load_group_state(arrays, BASE)


def test_mlp_is_input_100_classes_split_after_the_hidden_layer() -> None:
    from fedreg_app.core.config import ConfigError

    info = DatasetInfo(num_classes=10, channels=1, height=28, width=28)
    model = build_model(info, 1, 0, private_head=True, model="mlp")
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes == {
        "base.1.weight": (100, 784), "base.1.bias": (100,),
        "head_g.0.weight": (10, 100), "head_g.0.bias": (10,),
        "head_p.0.weight": (10, 100), "head_p.0.bias": (10,),
    }  # fmt: skip
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(ValueError, match="head-depth=2 is not allowed: expected 1..1"):
        build_model(info, 2, 0, model="mlp")
    with pytest.raises(ConfigError, match="head-depth=2"):
        load_config({"model": "mlp", "head-depth": 2})
    with pytest.raises(ConfigError, match="model='resnet' is not allowed"):
        load_config({"model": "resnet"})


def test_pretrained_init_from_npz_or_pt_without_pickled_code(tmp_path) -> None:
    import pickle

    import numpy as np

    from fedreg_app.core.config import ConfigError
    from fedreg_app.core.models import initial_model, load_pretrained
    from fedreg_app.core.persist import save_arrays

    info = DatasetInfo(num_classes=10, channels=1, height=28, width=28)
    trained = build_model(info, 2, seed=42)
    save_arrays(tmp_path / "w.npz", trained.group_state(BASE, HEAD_G))
    torch.save(trained.state_dict(), tmp_path / "w.pt")
    for name in ("w.npz", "w.pt"):
        config = load_config({"init-model": str(tmp_path / name)})
        model = initial_model(info, config, private_head=True)  # seed 0 otherwise
        state, expected = model.state_dict(), trained.state_dict()
        assert all(torch.equal(state[k], expected[k]) for k in expected)
        # the private head starts as the file's head
        assert torch.equal(state["head_p.0.weight"], expected["head_g.0.weight"])
    # another float precision is converted; a NaN is refused, naming the file and entry
    doubled = {k: v.astype(np.float64) for k, v in trained.group_state(BASE, HEAD_G).items()}
    save_arrays(tmp_path / "w64.npz", doubled)
    model = initial_model(info, load_config({"init-model": str(tmp_path / "w64.npz")}))
    assert all(torch.equal(model.state_dict()[k], trained.state_dict()[k]) for k in doubled)
    doubled["base.0.bias"][3] = np.nan
    save_arrays(tmp_path / "nan.npz", doubled)
    with pytest.raises(ConfigError, match="init-model=.*nan.npz.*base.0.bias: holds NaN"):
        load_pretrained(build_model(info, 2, 0), str(tmp_path / "nan.npz"))
    small = build_model(DatasetInfo(10, 3, 32, 32), 2, 0)
    with pytest.raises(ConfigError, match="init-model=.* do not fit this model"):
        load_pretrained(small, str(tmp_path / "w.npz"))

    class Payload:
        def __reduce__(self):
            return (print, ("pickled code ran",))

    (tmp_path / "evil.pt").write_bytes(pickle.dumps({"base.0.weight": Payload()}))
    with pytest.raises(pickle.UnpicklingError):
        load_pretrained(build_model(info, 2, 0), str(tmp_path / "evil.pt"))
    np.savez(tmp_path / "evil.npz", x=np.array([Payload()], dtype=object))
    with pytest.raises(ValueError, match="allow_pickle"):
        load_pretrained(build_model(info, 2, 0), str(tmp_path / "evil.npz"))
    with pytest.raises(ConfigError, match="init-model='missing.npz' is not allowed"):
        load_config({"init-model": "missing.npz"})


@pytest.mark.parametrize(("channels", "size", "flat"), [(1, 28, 3136), (3, 32, 4096)])
def test_cnn_of_the_related_papers(channels: int, size: int, flat: int) -> None:
    info = DatasetInfo(num_classes=10, channels=channels, height=size, width=size)
    model = build_model(info, 1, 0, model="cnn")
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes["base.0.weight"] == (32, channels, 5, 5)
    assert shapes["base.3.weight"] == (64, 32, 5, 5)
    assert shapes["base.7.weight"] == (512, flat)
    assert shapes["head_g.0.weight"] == (10, 512)
    assert model(torch.zeros(2, channels, size, size)).shape == (2, 10)


def test_charlstm_embedding_8_two_lstm_layers_of_256_and_a_linear_head() -> None:
    from fedreg_app.core.config import ConfigError

    text = DatasetInfo(num_classes=80, channels=1, height=1, width=80, modality="text")
    model = build_model(text, head_depth=1, seed=0, private_head=True, model="charlstm")
    lstm = model.base[1].lstm
    assert model.base[0].embedding_dim == 8 and model.base[0].num_embeddings == 80
    assert (lstm.input_size, lstm.hidden_size, lstm.num_layers) == (8, 256, 2)
    assert [k for k in model.state_dict() if k.startswith("head_g")] == [
        "head_g.0.weight", "head_g.0.bias"
    ]  # fmt: skip
    x = torch.randint(0, 80, (3, 80), dtype=torch.int16)
    assert model(x).shape == (3, 80) and model.head_p(model.base(x)).shape == (3, 80)
    with pytest.raises(ConfigError, match="head-depth=2 is not allowed.*charlstm"):
        load_config({"model": "charlstm", "head-depth": 2})
    image = DatasetInfo(num_classes=10, channels=1, height=28, width=28)
    with pytest.raises(ConfigError, match="model='charlstm' is not allowed.*convnet"):
        build_model(image, head_depth=1, seed=0, model="charlstm")
    with pytest.raises(ConfigError, match="model='convnet' is not allowed.*charlstm"):
        build_model(text, head_depth=2, seed=0, model="convnet")


def test_load_entries_copies_only_what_is_given_and_rejects_unknown_keys() -> None:
    info = DatasetInfo(num_classes=10, channels=1, height=28, width=28)
    model, other = build_model(info, 2, seed=0), build_model(info, 2, seed=1)
    first_layer = {k: v for k, v in other.group_state(BASE).items() if k.startswith("base.0.")}
    untouched = model.group_state(HEAD_G)
    model.load_entries(first_layer)
    assert all((model.group_state(BASE)[k] == v).all() for k, v in first_layer.items())
    assert all((model.group_state(HEAD_G)[k] == v).all() for k, v in untouched.items())
    with pytest.raises(KeyError, match="not in this model"):
        model.load_entries({"base.99.weight": first_layer["base.0.weight"]})


def _pfllib_fedavgcnn_parameters(in_features: int, num_classes: int, dim: int) -> int:
    """PFLlib's FedAvgCNN: conv1 (in->32, 5x5), conv2 (32->64, 5x5), fc1 (dim->512), fc."""
    conv1 = in_features * 32 * 25 + 32
    conv2 = 32 * 64 * 25 + 64
    return conv1 + conv2 + dim * 512 + 512 + 512 * num_classes + num_classes


@pytest.mark.parametrize(("channels", "size", "dim"), [(1, 28, 1024), (3, 32, 1600)])
def test_fedavgcnn_is_pfllibs_fedavgcnn(channels: int, size: int, dim: int) -> None:
    info = DatasetInfo(num_classes=10, channels=channels, height=size, width=size)
    model = build_model(info, 1, 0, model="fedavgcnn")
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes == {
        "base.0.weight": (32, channels, 5, 5), "base.0.bias": (32,),
        "base.3.weight": (64, 32, 5, 5), "base.3.bias": (64,),
        "base.7.weight": (512, dim), "base.7.bias": (512,),
        "head_g.0.weight": (10, 512), "head_g.0.bias": (10,),
    }  # fmt: skip
    total = sum(p.numel() for p in model.parameters())
    assert total == _pfllib_fedavgcnn_parameters(channels, 10, dim)
    assert model.base(torch.zeros(2, channels, size, size)).shape == (2, 512)
    assert model(torch.zeros(2, channels, size, size)).shape == (2, 10)


def test_fedavgcnn_head_depths_1_and_2_and_config() -> None:
    info = DatasetInfo(num_classes=10, channels=1, height=28, width=28)
    one = build_model(info, 1, 0, private_head=True, model="fedavgcnn")
    two = build_model(info, 2, 0, private_head=True, model="fedavgcnn")
    assert [k for k in one.state_dict() if not k.startswith(BASE + ".")] == [
        "head_g.0.weight", "head_g.0.bias", "head_p.0.weight", "head_p.0.bias",
    ]  # fmt: skip
    assert [k for k in two.state_dict() if k.startswith(HEAD_G + ".")] == [
        "head_g.0.weight", "head_g.0.bias", "head_g.2.weight", "head_g.2.bias",
    ]  # fmt: skip
    assert tuple(two.state_dict()["head_g.0.weight"].shape) == (512, 1024)
    assert [k for k in two.state_dict() if k.startswith(BASE + ".")] == [
        "base.0.weight", "base.0.bias", "base.3.weight", "base.3.bias",
    ]  # fmt: skip
    x = torch.randn(3, 1, 28, 28)
    assert two.head_p(two.base(x)).shape == (3, 10)
    # Same initial weights, whatever the split: the split only names the layers.
    assert torch.equal(one.state_dict()["base.7.weight"], two.state_dict()["head_g.0.weight"])
    with pytest.raises(ValueError, match="head-depth=3 is not allowed: expected 1..2"):
        build_model(info, 3, 0, model="fedavgcnn")
    assert load_config({"model": "fedavgcnn", "head-depth": 1}).model == "fedavgcnn"


def pooled_inputs() -> list[torch.Tensor]:
    """Ties (ReLU's zeros), NaN, infinities, and odd sizes that floor mode crops."""
    generator = torch.Generator().manual_seed(0)
    even = torch.randn(3, 4, 8, 6, generator=generator).clamp(min=0)
    special = even.clone()
    special[0, 0, 0, 0], special[0, 1, 2, 3] = float("nan"), float("inf")
    special[1, 2, 4, 4] = float("-inf")
    odd = torch.randn(2, 3, 7, 5, generator=generator)
    return [even, special, odd, torch.zeros(1, 1, 2, 2)]


@pytest.mark.parametrize("x", pooled_inputs())
def test_max_pool_2x2_infers_what_max_pool2d_gives(x: torch.Tensor) -> None:
    expected = torch.nn.functional.max_pool2d(x, 2)
    for context in (torch.inference_mode, torch.no_grad):
        with context():
            torch.testing.assert_close(MaxPool2x2()(x), expected, rtol=0, atol=0,
                                       equal_nan=True)  # fmt: skip


def test_max_pool_2x2_trains_with_max_pool2d_and_its_gradients() -> None:
    """Under autograd it is max_pool2d: the gradient of a tied window goes to its first
    element, as in every recorded run."""
    for x in pooled_inputs():
        ours, reference = x.clone().requires_grad_(), x.clone().requires_grad_()
        MaxPool2x2()(ours).nan_to_num(0, 0, 0).sum().backward()
        torch.nn.MaxPool2d(2)(reference).nan_to_num(0, 0, 0).sum().backward()
        assert torch.equal(ours.grad, reference.grad)


@pytest.mark.parametrize(("model", "channels", "size"),
                         [("convnet", 1, 28), ("convnet", 3, 32), ("cnn", 1, 28),
                          ("fedavgcnn", 3, 32)])  # fmt: skip
def test_pooled_models_evaluate_as_with_torchs_max_pool(model: str, channels: int,
                                                         size: int) -> None:  # fmt: skip
    """The logits of a whole model are bit-identical with torch's pooling layer in place
    of ours: every recorded accuracy stays what it was."""
    ours = build_model(DatasetInfo(10, channels, size, size), 2, seed=3, model=model).eval()
    reference = build_model(DatasetInfo(10, channels, size, size), 2, seed=3, model=model)
    assert sum(isinstance(m, MaxPool2x2) for m in reference.modules()) == 2
    with_torch_max_pool(reference)
    assert not any(isinstance(m, MaxPool2x2) for m in reference.modules())
    x = torch.randn(64, channels, size, size, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        assert torch.equal(ours(x), reference.eval()(x))
