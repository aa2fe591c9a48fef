"""The training core's own SGD: bit-identical to ``torch.optim.SGD``, and a fresh process
that trains never imports ``torch._dynamo`` (what made every deployed training message
about 2 s slower); evaluation gives the same logits at any batch size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.nn import functional as F  # noqa: N812

from fedreg_app.core.config import ConfigError
from fedreg_app.core.data import TEXT, DatasetInfo, TensorData, normalise
from fedreg_app.core.models import BASE, HEAD_P, build_model
from fedreg_app.core.training import (
    EVAL_BATCH_ENV,
    MIN_EVAL_BATCH,
    MomentumSGD,
    _graphed_epochs,
    count_correct_each,
    eval_batch_size,
    eval_batches,
    only_trainable,
    train_epochs,
)
from fedreg_app.registry import load_config

CPU = torch.device("cpu")


def train_steps(optimizer_class, momentum: float, frozen: tuple[str, ...]) -> dict:
    """A few steps on a seeded model; ``frozen`` groups get no gradient (as in FedReG's
    step 1, where head_g is frozen but gradients flow through it)."""
    model = build_model(DatasetInfo(10, 1, 28, 28), 2, seed=3, private_head=True)
    moving = [p for n, p in model.named_parameters() if n.split(".")[0] not in frozen]
    for name, param in model.named_parameters():
        param.requires_grad_(name.split(".")[0] not in frozen)
    optimizer = optimizer_class(moving, lr=0.05, momentum=momentum)
    generator = torch.Generator().manual_seed(0)
    for _ in range(6):
        x = torch.randn(8, 1, 28, 28, generator=generator)
        y = torch.randint(0, 10, (8,), generator=generator)
        optimizer.zero_grad()
        features = model.base(x)
        F.cross_entropy(model.head_g(features) + model.head_p(features), y).backward()
        optimizer.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("frozen", [(), ("head_g",), (BASE, HEAD_P)])
def test_momentum_sgd_is_bit_identical_to_torch(momentum: float, frozen: tuple) -> None:
    ours = train_steps(MomentumSGD, momentum, frozen)
    theirs = train_steps(torch.optim.SGD, momentum, frozen)
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    initial = build_model(DatasetInfo(10, 1, 28, 28), 2, seed=3, private_head=True).state_dict()
    for key in ours:  # frozen groups did not move; the others did
        moved = not torch.equal(ours[key], initial[key])
        assert moved == (key.split(".")[0] not in frozen), key


CLIENT_PROCESS = textwrap.dedent(
    """
    import sys, torch
    from pathlib import Path
    from flwr.app import RecordDict
    from clients.base import ClientSetup
    from fedreg_app.core.data import ClientData, DatasetInfo, TensorData
    from fedreg_app.core.models import BASE, HEAD_G, build_model
    from fedreg_app.registry import get_algorithm, load_config
    algo, cache = sys.argv[1], Path(sys.argv[2])
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (40, 1, 28, 28), generator=g, dtype=torch.uint8)
    data = TensorData(x=x, y=torch.arange(40) % 7)
    info = DatasetInfo(10, 1, 28, 28)
    config = load_config({"algo": algo, "local-epochs": 1})
    arrays = build_model(info, config.head_depth, config.seed).group_state(BASE, HEAD_G)
    setup = ClientSetup(config, info, ClientData(0, data, data), RecordDict(), cache=cache)
    client = get_algorithm(algo).client(setup)
    client.train(arrays, 1)
    client.evaluate(arrays, 1)
    print("torch._dynamo" in sys.modules)
    """
)


def dynamo_imported(algo: str, cache) -> bool:
    result = subprocess.run([sys.executable, "-c", CLIENT_PROCESS, algo, str(cache)],
                            capture_output=True, text=True, check=True, timeout=120)  # fmt: skip
    return result.stdout.strip().splitlines()[-1] == "True"


@pytest.mark.parametrize("algo", ["fedavg", "fedreg"])
def test_a_client_process_with_its_cache_never_imports_dynamo(algo: str, tmp_path) -> None:
    """FedReG's first round augments with torchvision (which imports torch._dynamo) to
    build the rebalanced set; from its cached copy on, a message's process trains and
    evaluates without it."""
    dynamo_imported(algo, tmp_path)  # first process: builds the caches
    if algo == "fedreg":
        assert list(tmp_path.glob("rebalanced-*.npz"))
    assert not dynamo_imported(algo, tmp_path)


# ------------------------------------------------------------- evaluation batch size
EVAL_MODELS = [
    ("cnn", DatasetInfo(10, 1, 28, 28)),
    ("cnn", DatasetInfo(10, 3, 32, 32)),
    ("fedavgcnn", DatasetInfo(10, 3, 32, 32)),
    ("convnet", DatasetInfo(100, 3, 32, 32)),
    ("mlp", DatasetInfo(10, 1, 28, 28)),
    ("charlstm", DatasetInfo(80, 1, 1, 80, TEXT)),
]


def eval_inputs(info: DatasetInfo, n: int) -> TensorData:
    """Raw inputs as clients hold them: uint8 images, or character indices for text."""
    generator = torch.Generator().manual_seed(1)
    if info.modality == TEXT:
        x = torch.randint(0, info.num_classes, (n, info.width), generator=generator)
    else:
        shape = (n, info.channels, info.height, info.width)
        x = torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)
    return TensorData(x=x, y=torch.randint(0, info.num_classes, (n,), generator=generator))


@pytest.mark.parametrize(("model_name", "info"), EVAL_MODELS)
def test_evaluation_does_not_depend_on_the_batch_size(
    model_name: str, info: DatasetInfo, monkeypatch
) -> None:
    """On one thread (a simulation's client actor) each sample's base features and logits,
    and so every correct count, are bit-identical at any evaluation batch size, remainders
    under ``MIN_EVAL_BATCH`` joining the batch before. 517 samples: at 512, 64, 100, 128
    and 258 the remainder (5, 5, 17, 5, 1) joins the batch before; at 150 it (67) stays a
    batch of its own. (With several threads the kernels share a batch's work among them by
    its size: see ``eval_batch_size``.)"""
    model = build_model(info, 1, seed=2, model=model_name).eval()
    data = eval_inputs(info, 517)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        outputs = {}
        for size in (512, 64, 100, 128, 150, 258):
            monkeypatch.setenv(EVAL_BATCH_ENV, str(size))
            with torch.inference_mode():
                parts = [(model.base(x), model(x)) for x, _ in eval_batches(data, CPU)]
            assert min(len(f) for f, _ in parts) >= MIN_EVAL_BATCH
            correct = count_correct_each({"m": (model.base, model.head_g)}, data, CPU)["m"]
            features, logits = (torch.cat(column) for column in zip(*parts, strict=True))
            outputs[size] = (features, logits, correct)
    finally:
        torch.set_num_threads(previous)
    features, logits, correct = outputs[512]
    for size, (other_features, other_logits, other_correct) in outputs.items():
        assert torch.equal(other_features, features), size
        assert torch.equal(other_logits, logits), size
        assert other_correct == correct, size


def test_a_split_of_fewer_than_the_minimum_is_one_batch(monkeypatch) -> None:
    monkeypatch.setenv(EVAL_BATCH_ENV, str(MIN_EVAL_BATCH))
    info = DatasetInfo(10, 1, 28, 28)
    for n, expected in ((3, [3]), (130, [64, 66]), (192, [64, 64, 64]), (255, [64, 64, 127])):
        assert [len(y) for _, y in eval_batches(eval_inputs(info, n), CPU)] == expected, n


def test_eval_batch_size_default_override_and_bad_value(monkeypatch) -> None:
    monkeypatch.delenv(EVAL_BATCH_ENV, raising=False)
    assert eval_batch_size(CPU) == 128 * torch.get_num_threads()
    assert eval_batch_size(torch.device("cuda")) == 512  # a GPU keeps what it always used
    monkeypatch.setenv(EVAL_BATCH_ENV, "64")
    assert eval_batch_size(CPU) == 64
    for bad in ("0", "3", "63", "-3", "big", "1.5", ""):
        monkeypatch.setenv(EVAL_BATCH_ENV, bad)
        with pytest.raises(ConfigError, match=f"{EVAL_BATCH_ENV}=.*integer >= 64"):
            eval_batch_size(CPU)


def device_flags_after(calls: str, env: dict[str, str] | None = None) -> dict:
    """The determinism flags of a fresh process after ``calls`` (global state: run apart)."""
    script = textwrap.dedent(f"""
        import json, os, torch
        from fedreg_app.core.training import select_device
        {calls}
        print(json.dumps({{
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "fill": torch.utils.deterministic.fill_uninitialized_memory,
            "cublas": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        }}))
    """)
    base_env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**base_env, **(env or {})}, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_cuda_device_switches_to_deterministic_kernels_and_the_cpu_keeps_its_own() -> None:
    """Choosing CUDA (a torch.device needs no GPU to exist) turns on cuDNN's and torch's
    deterministic kernels and cuBLAS's fixed workspace, without filling allocations;
    choosing the CPU changes nothing, so every recorded CPU run keeps its kernels."""
    cpu = device_flags_after('select_device("cpu")')
    assert cpu == {"deterministic": False, "warn_only": False, "cudnn_deterministic": False,
                   "cudnn_benchmark": False, "fill": True, "cublas": None}  # fmt: skip
    cuda = device_flags_after('select_device("cuda")')
    assert cuda == {"deterministic": True, "warn_only": True, "cudnn_deterministic": True,
                    "cudnn_benchmark": False, "fill": False, "cublas": ":4096:8"}  # fmt: skip
    kept = device_flags_after('select_device("cuda")', {"CUBLAS_WORKSPACE_CONFIG": ":16:8"})
    assert kept["cublas"] == ":16:8" and kept["deterministic"]


def trained_by_us(data: TensorData, drop_last: bool, epochs: int = 2) -> tuple[dict, int]:
    model = build_model(DatasetInfo(10, 1, 28, 28), 1, seed=3)
    processed = train_epochs(
        model, list(model.parameters()), lambda x, y: F.cross_entropy(model(x), y), data,
        epochs=epochs, batch_size=10, lr=0.05, momentum=0.9,
        generator=torch.Generator().manual_seed(5), device=CPU, drop_last=drop_last,
    )  # fmt: skip
    return model.state_dict(), processed


def trained_by_a_torch_loader(data: TensorData, drop_last: bool, epochs: int = 2) -> dict:
    """PFLlib's loop: ``DataLoader(..., drop_last)`` and ``torch.optim.SGD``, its sampler
    drawing one ``randperm`` an epoch from our seeded generator (``RandomSampler`` draws
    a second, empty one after each epoch), so both take the same orders."""
    model = build_model(DatasetInfo(10, 1, 28, 28), 1, seed=3)
    dataset = torch.utils.data.TensorDataset(normalise(data.x), data.y)
    generator = torch.Generator().manual_seed(5)

    class Shuffled(torch.utils.data.Sampler):
        def __len__(self) -> int:
            return len(dataset)

        def __iter__(self):
            yield from torch.randperm(len(dataset), generator=generator).tolist()

    sampler = Shuffled()
    loader = torch.utils.data.DataLoader(dataset, 10, sampler=sampler, drop_last=drop_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    return model.state_dict()


@pytest.mark.parametrize("drop_last", [True, False])
def test_drop_last_trains_as_a_torch_loader_does(drop_last: bool) -> None:
    """``drop-last`` (PFLlib's training loader; default since 0.4.0): each epoch leaves out the
    last partial batch, bit for bit as ``DataLoader(drop_last=True)`` over the same
    shuffle; ``false`` trains the short batch as the loader does without it."""
    generator = torch.Generator().manual_seed(0)
    data = TensorData(torch.randint(0, 256, (47, 1, 28, 28), dtype=torch.uint8,
                                    generator=generator),
                      torch.randint(0, 10, (47,), generator=generator))  # fmt: skip
    ours, processed = trained_by_us(data, drop_last)
    theirs = trained_by_a_torch_loader(data, drop_last)
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)
    assert processed == (2 * 40 if drop_last else 2 * 47)
    other, _ = trained_by_us(data, not drop_last)
    assert not all(torch.equal(ours[key], other[key]) for key in ours)


def test_with_drop_last_a_client_smaller_than_a_batch_does_not_move() -> None:
    data = TensorData(torch.zeros(7, 1, 28, 28, dtype=torch.uint8), torch.arange(7))
    initial = build_model(DatasetInfo(10, 1, 28, 28), 1, seed=3).state_dict()
    trained, processed = trained_by_us(data, drop_last=True)
    assert processed == 0
    assert all(torch.equal(trained[key], initial[key]) for key in initial)
    moved, _ = trained_by_us(data, drop_last=False)
    assert not all(torch.equal(moved[key], initial[key]) for key in initial)


# ------------------------------------------------------------------ CUDA graphs
def trained(data: TensorData, graphed: bool, frozen: tuple[str, ...] = ()) -> tuple[dict, int]:
    """Three epochs of momentum SGD (its buffers kept from an earlier call, as a client's
    persistent optimizer) on a seeded FedReG-shaped model, ``frozen`` groups not moving,
    through the eager loop or the graphed one."""
    model = build_model(DatasetInfo(10, 1, 28, 28), 2, seed=3, private_head=True)
    moving = [p for n, p in model.named_parameters() if n.split(".")[0] not in frozen]
    buffers = [torch.full_like(p, 0.01) for p in moving]
    optimizer = MomentumSGD(moving, lr=0.05, momentum=0.9, buffers=buffers)

    def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        features = model.base(x)
        return F.cross_entropy(model.head_g(features) + model.head_p(features), y)

    generator = torch.Generator().manual_seed(5)
    model.train()
    with only_trainable(model, moving):
        if graphed:
            processed = _graphed_epochs(optimizer, loss_fn, data, 3, 10, generator, CPU)
        else:
            processed = train_epochs(model, moving, loss_fn, data, epochs=3, batch_size=10,
                                     lr=0.05, momentum=0.9, generator=generator, device=CPU,
                                     optimizer=optimizer, drop_last=True)  # fmt: skip
    if graphed:  # no gradient left pointing into a capture's memory
        assert all(p.grad is None for p in model.parameters())
    return {k: v.clone() for k, v in model.state_dict().items()}, processed


@pytest.mark.parametrize("frozen", [(), ("head_g",), (BASE, HEAD_P)])
@pytest.mark.parametrize("inputs", ["pixels", "features"])
def test_the_graphed_loop_trains_as_the_eager_one(frozen: tuple, inputs: str) -> None:
    """``cuda-graphs``: the loop that captures a step and replays it gathers each batch
    on the device, where the eager loop gathers it before the copy. Off CUDA its
    "capture" is the step itself, so its order, shuffles, warm-up, momentum and frozen
    groups are checked here against the eager loop, bit for bit (uint8 pixels and
    float features alike); what a real capture changes is checked on a GPU
    (``benchmarks/cuda_graphs.py``)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (47, 1, 28, 28), dtype=torch.uint8, generator=generator)
    if inputs == "features":
        x = normalise(x)  # floats: not normalised again, as FedRep's cached features
    data = TensorData(x, torch.randint(0, 10, (47,), generator=generator))
    eager, processed = trained(data, graphed=False, frozen=frozen)
    graphed, processed_graphed = trained(data, graphed=True, frozen=frozen)
    assert processed == processed_graphed == 3 * 40
    assert all(torch.equal(eager[key], graphed[key]) for key in eager)
    initial = build_model(DatasetInfo(10, 1, 28, 28), 2, seed=3, private_head=True)
    for name, value in initial.state_dict().items():  # a frozen group did not move
        assert torch.equal(graphed[name], value) == (name.split(".")[0] in frozen)


def test_cuda_graphs_on_the_cpu_change_nothing_and_need_drop_last() -> None:
    """The key applies where a client trains on CUDA: on the CPU the eager loop runs
    (the same weights); with ``drop-last = false`` it is refused before any work,
    naming the key (a replayed step has one batch size)."""
    generator = torch.Generator().manual_seed(0)
    data = TensorData(torch.randint(0, 256, (30, 1, 28, 28), dtype=torch.uint8,
                                    generator=generator),
                      torch.randint(0, 10, (30,), generator=generator))  # fmt: skip
    runs = []
    for cuda_graphs in (False, True):
        model = build_model(DatasetInfo(10, 1, 28, 28), 1, seed=3)
        train_epochs(model, list(model.parameters()),
                     lambda x, y, model=model: F.cross_entropy(model(x), y),
                     data, epochs=1, batch_size=10, lr=0.05, momentum=0.9,
                     generator=torch.Generator().manual_seed(1), device=CPU, drop_last=True,
                     cuda_graphs=cuda_graphs)  # fmt: skip
        runs.append(model.state_dict())
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
    with pytest.raises(ConfigError, match=r"cuda-graphs=True is not allowed: expected false "
                                          r"with drop-last = false"):  # fmt: skip
        load_config({"cuda-graphs": True, "drop-last": False})
    assert load_config({"cuda-graphs": True}).cuda_graphs is True


def test_flush_denormals_has_the_thread_that_handles_a_message_read_them_as_zero(
    grey_dataset,
) -> None:
    """``flush-denormals`` (default true) is set by every message's setup, for the thread
    that trains and evaluates; ``false`` keeps full IEEE arithmetic. A denormal doubled
    is 0 with it, and 2e-39 without."""
    from flwr.app import Context, RecordDict

    from fedreg_app import client_app

    try:
        for flush, doubled in ((True, 0.0), (False, 2e-39)):
            run_config = {"algo": "fedavg", "dataset-path": str(grey_dataset),
                          "min-partition-size": 5, "flush-denormals": flush}  # fmt: skip
            context = Context(run_id=1, node_id=1, state=RecordDict(), run_config=run_config,
                              node_config={"partition-id": 0, "num-partitions": 4})  # fmt: skip
            client_app.client_setup(context)
            denormal = torch.tensor([1e-39], dtype=torch.float32)  # made under the flag too
            assert (denormal * 2).item() == pytest.approx(doubled, rel=1e-5, abs=0)
    finally:
        torch.set_flush_denormal(False)  # PyTorch's default, for the tests after this one
