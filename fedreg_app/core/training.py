"""The one training and evaluation core every algorithm's client procedure uses.

An algorithm says *what* to train (which parameters, with which loss on which data);
this module does the loop: seeded shuffling, per-batch normalisation, freezing of the
parameters that must not move, SGD with momentum.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from fedreg_app.core.config import ConfigError
from fedreg_app.core.data import TensorData, normalise

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: Evaluation batch size, overriding the default (an integer >= ``MIN_EVAL_BATCH``).
EVAL_BATCH_ENV = "FEDREG_EVAL_BATCH"
#: The smallest evaluation batch. On the CPU a matrix product of only a few rows takes
#: another kernel, whose results differ from a larger batch's in the last bits: up to 3
#: rows on one machine of this workplace, up to 15 on another (AVX-512). 64 leaves a margin.
MIN_EVAL_BATCH = 64
#: Samples per CPU thread in an evaluation batch: on one thread the forward pass of the
#: convolutional models here ran 1.07-1.41x faster at 128 samples than at 512, where a
#: layer's activations no longer fit in the caches, and the char-LSTM 1.08-1.14x; the
#: MLP, one matrix product per layer, at 0.87-0.88x (two runs of
#: ``benchmarks/eval_batch.py``; docs/performance.md).
CPU_EVAL_BATCH_PER_THREAD = 128
#: A GPU's evaluation batch.
GPU_EVAL_BATCH = 512


def eval_batch_size(device: torch.device) -> int:
    """Samples per evaluation batch on ``device``: ``FEDREG_EVAL_BATCH`` if set, else 128
    per CPU thread, else 512 on a GPU. On one CPU thread (a simulation's client actor) a
    sample's outputs do not depend on it (``tests/test_training.py``). With several threads
    the kernels share a batch's work among them by its size, so a logit can move in its
    last bits (at most 4.2e-7 over six models on two threads, no prediction changed:
    ``benchmarks/eval_batch.py --threads 2``), which changes a correct count only where
    two classes tie that closely."""
    override = os.environ.get(EVAL_BATCH_ENV)
    if override is not None:
        if not override.strip().isdigit() or int(override) < MIN_EVAL_BATCH:
            raise ConfigError(
                f"{EVAL_BATCH_ENV}={override!r} is not allowed: expected an integer >= "
                f"{MIN_EVAL_BATCH} (samples per evaluation batch), or unset for the default"
            )
        return int(override)
    if device.type == "cpu":
        return CPU_EVAL_BATCH_PER_THREAD * torch.get_num_threads()
    return GPU_EVAL_BATCH


#: cuBLAS's setting for the same results run after run (a fixed workspace per stream),
#: which torch's deterministic mode asks for on CUDA; a value already set is kept.
CUBLAS_WORKSPACE_CONFIG = ":4096:8"


def select_device(name: str) -> torch.device:
    """The torch device the ``device`` key names (``auto``: CUDA where torch sees a GPU).
    Choosing CUDA also switches this process to deterministic GPU kernels
    (:func:`use_deterministic_cuda`)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        use_deterministic_cuda()
    return device


def set_denormals(flush: bool) -> None:
    """Have this thread's CPU arithmetic read and write denormals as zero, or not (the
    ``flush-denormals`` key). The flag is the calling thread's, and threads it starts
    afterwards (torch's intra-op pool) inherit it: set before the first torch operation
    of the thread that trains or evaluates."""
    torch.set_flush_denormal(flush)


@functools.cache
def use_deterministic_cuda() -> None:
    """So that the same seed can give the same numbers on a GPU too (not yet checked on
    one: see README, "Check that a recorded run reproduces"). By default cuDNN may pick convolution
    algorithms that add with atomics (the order, and so the rounding, changes from run
    to run) and may pick them by timing; here it takes deterministic ones without
    timing, and torch's deterministic variants replace its other such kernels (a warning,
    not a failure, where an op has none). Called before the process's first CUDA
    kernel, so cuBLAS starts with the fixed workspace. Memory is not filled on
    allocation: every tensor here is written before it is read, and the fill would add
    a kernel per allocation to GPU steps made of a few small kernels each. The CPU
    path is untouched: only a process that trains on CUDA calls this."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False


def batches(
    data: TensorData,
    batch_size: int,
    generator: torch.Generator | None,
    device: torch.device,
    drop_last: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Normalised mini-batches; shuffled when a generator is given. ``drop_last`` leaves
    out a last batch smaller than ``batch_size`` (the shuffle is drawn the same)."""
    n = len(data)
    order = torch.randperm(n, generator=generator) if generator is not None else None
    stop = n - n % batch_size if drop_last else n
    for start in range(0, stop, batch_size):
        idx = (
            order[start : start + batch_size]
            if order is not None
            else slice(start, start + batch_size)
        )
        yield _on_device(data, idx, device)


def eval_batches(
    data: TensorData, device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Normalised batches in order, of ``eval_batch_size`` samples, where a remainder of
    fewer than ``MIN_EVAL_BATCH`` samples joins the batch before it: then, on one CPU
    thread, each sample's outputs are the same at any batch size (on every CPU seen here:
    see ``MIN_EVAL_BATCH``)."""
    n = len(data)
    starts = list(range(0, n, eval_batch_size(device)))
    if len(starts) > 1 and n - starts[-1] < MIN_EVAL_BATCH:
        starts.pop()
    for start, stop in zip(starts, [*starts[1:], n], strict=True):
        yield _on_device(data, slice(start, stop), device)


def _on_device(
    data: TensorData, idx: slice | torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    x = data.x[idx].to(device)
    # uint8 images are normalised per batch; float inputs (cached features) are not
    return (normalise(x) if x.dtype == torch.uint8 else x), data.y[idx].to(device)


class MomentumSGD:
    """SGD with momentum computed exactly as ``torch.optim.SGD`` does it (no dampening,
    Nesterov or weight decay): the same tensor operations in the same order, so the
    weights are bit-identical (``tests/test_training.py``).

    Why not ``torch.optim.SGD`` itself: the first torch optimizer a process builds imports
    ``torch._dynamo`` (its methods are wrapped to disable the compiler), about 2 s and
    100 MB. A deployed SuperNode starts a fresh ClientApp process for every message, so
    every training message paid it (``benchmarks/device_client.py``)."""

    def __init__(
        self,
        params: Sequence[nn.Parameter],
        lr: float,
        momentum: float,
        buffers: Sequence[torch.Tensor | None] | None = None,
    ) -> None:
        """``buffers``: momentum buffers to continue from (one per parameter, None where
        a parameter has none yet), e.g. a client's optimizer kept across rounds."""
        self.params = list(params)
        self.lr, self.momentum = float(lr), float(momentum)
        self.buffers: list[torch.Tensor | None] = (
            list(buffers) if buffers is not None else [None] * len(self.params)
        )
        if len(self.buffers) != len(self.params):
            raise ValueError(f"{len(self.buffers)} momentum buffers for {len(self.params)} "
                             "parameters")  # fmt: skip

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for index, param in enumerate(self.params):
            grad = param.grad
            if grad is None:  # frozen in this step: it does not move, nor its momentum
                continue
            if self.momentum != 0:
                buffer = self.buffers[index]
                if buffer is None:
                    buffer = self.buffers[index] = grad.detach().clone()
                else:
                    buffer.mul_(self.momentum).add_(grad, alpha=1)
                grad = buffer
            param.add_(grad, alpha=-self.lr)


@contextmanager
def only_trainable(model: nn.Module, trainable: Sequence[nn.Parameter]) -> Iterator[None]:
    """Switch off gradients of every other parameter: they neither move nor pay for
    their own gradient, while gradients still flow *through* them to earlier layers."""
    keep = {id(p) for p in trainable}
    previous = [(p, p.requires_grad) for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)
    try:
        yield
    finally:
        for p, flag in previous:
            p.requires_grad_(flag)


def train_epochs(
    model: nn.Module,
    trainable: Sequence[nn.Parameter],
    loss_fn: LossFn,
    data: TensorData,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    momentum: float,
    generator: torch.Generator,
    device: torch.device,
    optimizer: MomentumSGD | None = None,
    drop_last: bool = False,
    cuda_graphs: bool = False,
) -> int:
    """Train ``trainable`` for ``epochs`` passes over ``data``; returns samples processed.

    ``loss_fn(x, y)`` runs the forward pass the algorithm needs (and any regulariser).
    ``optimizer`` over exactly ``trainable`` continues its momentum (a client's optimizer
    kept across rounds); without one a fresh optimizer is made for this call.
    ``drop_last`` leaves out each epoch's last partial batch (the run's ``drop-last``).
    ``cuda_graphs``: on CUDA with ``drop_last``, the steps are replayed as one captured
    graph (:func:`_graphed_epochs`); elsewhere it changes nothing.
    """
    if not trainable or len(data) == 0 or epochs == 0:
        return 0
    model.train()
    if optimizer is None:
        optimizer = MomentumSGD(trainable, lr=lr, momentum=momentum)
    processed = 0
    with only_trainable(model, trainable):
        if cuda_graphs and drop_last and device.type == "cuda":
            return _graphed_epochs(optimizer, loss_fn, data, epochs, batch_size, generator,
                                   device)  # fmt: skip
        for _ in range(epochs):
            for x, y in batches(data, batch_size, generator, device, drop_last):
                optimizer.zero_grad()
                loss_fn(x, y).backward()
                optimizer.step()
                processed += int(y.shape[0])
    return processed


#: Steps run eagerly, on a side stream, before a step is captured: they make the momentum
#: buffers a first step creates, and let cuDNN and cuBLAS pick their kernels (the capture
#: must record the kernels a step keeps using). They are real steps, on the real batches.
GRAPH_WARMUP_STEPS = 3


def _graphed_epochs(
    optimizer: MomentumSGD,
    loss_fn: LossFn,
    data: TensorData,
    epochs: int,
    batch_size: int,
    generator: torch.Generator,
    device: torch.device,
) -> int:
    """The eager loop's steps, in its order, with its shuffles (``drop_last``): after
    ``GRAPH_WARMUP_STEPS`` eager steps, one step (gather the batch on the device,
    normalise, loss, backward, momentum update) is captured (:func:`capture_step`) and
    replayed for every other batch, its batch's indices copied into the capture's input
    first. Off CUDA the "capture" is the step itself, so the loop can be checked against
    the eager one anywhere.

    Why: a step of the small models here is a few dozen kernels of a few microseconds,
    so an eager step is mostly their launches from Python. On an H200 one process ran
    299 eager steps a second at batch 20 and 2,758 replayed ones
    (``benchmarks/gpu_processes.py --graphs``, docs/performance.md), and a round
    waits for its largest client's steps, one after another."""
    steps = len(data) // batch_size
    if steps == 0:
        return 0
    inputs, labels = data.x.to(device), data.y.to(device)  # the client's data, once a call
    batch = torch.empty(batch_size, dtype=torch.long, device=device)  # the capture's input

    def step() -> None:
        optimizer.zero_grad()  # captured: the backward writes the gradients, not adds
        x, y = inputs.index_select(0, batch), labels.index_select(0, batch)
        loss_fn(normalise(x) if x.dtype == torch.uint8 else x, y).backward()
        optimizer.step()

    replay: Callable[[], None] | None = None
    done = 0
    for _ in range(epochs):
        order = torch.randperm(len(data), generator=generator)  # the eager loop's draw
        for indices in order[: steps * batch_size].to(device).view(steps, batch_size):
            batch.copy_(indices)
            if replay is not None:
                replay()
            elif done < GRAPH_WARMUP_STEPS:
                warm_up(step, device)
            else:
                replay = capture_step(step, device)
                replay()
            done += 1
    optimizer.zero_grad()  # no gradient left pointing into the capture's memory
    return done * batch_size


def warm_up(step: Callable[[], None], device: torch.device) -> None:
    """One eager step; on CUDA on a side stream, as a capture wants its kernels chosen and
    its first allocations made away from the stream it records."""
    if device.type != "cuda":
        step()
        return
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream(device).wait_stream(side)


def capture_step(step: Callable[[], None], device: torch.device) -> Callable[[], None]:
    """``step`` recorded as a CUDA graph (recorded, not run) and its replay; off CUDA,
    ``step`` itself."""
    if device.type != "cuda":
        return step
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


Forward = Callable[[torch.Tensor], torch.Tensor]


def count_correct(predict: Forward, data: TensorData, device: torch.device) -> int:
    """Number of samples whose arg-max prediction equals the label."""
    return count_correct_each({"only": (predict, _identity)}, data, device)["only"]


def _identity(features: torch.Tensor) -> torch.Tensor:
    return features


@torch.inference_mode()
def count_correct_each(
    models: Mapping[str, tuple[Forward, Forward]], data: TensorData, device: torch.device
) -> dict[str, int]:
    """Correct counts of several models, each given as (features, head), in one pass over
    the data: each batch is moved and normalised once, models that name the same
    features function (the same base, e.g. a client's personal and global model) compute
    the features once, and models that also name the same head predict once."""
    correct = dict.fromkeys(models, 0)
    for x, y in eval_batches(data, device):
        features: dict[int, torch.Tensor] = {}
        predicted: dict[tuple[int, int], torch.Tensor] = {}
        for name, (extract, head) in models.items():
            if id(extract) not in features:
                features[id(extract)] = extract(x)
            key = (id(extract), id(head))
            if key not in predicted:
                predicted[key] = head(features[id(extract)]).argmax(dim=1)
            correct[name] += int((predicted[key] == y).sum())
    return correct
