"""The training core's own SGD: bit-identical to ``torch.optim.SGD``, and a fresh process
that trains never imports ``torch._dynamo`` (what made every deployed training message
about 2 s slower)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch.nn import functional as F  # noqa: N812

from fedreg_app.data import DatasetInfo
from fedreg_app.models import BASE, HEAD_P, build_model
from fedreg_app.training import MomentumSGD


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
    from fedreg_app.data import ClientData, DatasetInfo, TensorData
    from fedreg_app.models import BASE, HEAD_G, build_model
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
