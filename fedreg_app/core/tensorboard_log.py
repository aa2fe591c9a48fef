"""Each round's scalars as TensorBoard event files beside ``results.json`` (key
``tensorboard = true``), so a long run is watched while it runs:
``tensorboard --logdir experiments/`` shows every run below it, named by the runner's
folders (experiment / algorithm[__variant] / seed / run folder), so algorithms and seeds
compare on one chart.

The event files always say what ``results.json`` says: a run started or resumed writes
them afresh from the rounds it keeps (a round run again after a resume replaces the
interrupted attempt's), then appends each round as it is written.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from fedreg_app.core.config import ConfigError


class RoundRecord(Protocol):
    """What is read of ``fedreg_app.core.metrics.RoundRecord`` (which imports this module):
    its round and the fields named in ``SCALARS``."""

    round: int


#: How TensorBoard names its event files (they lie in the run folder itself, so a run
#: shows in TensorBoard under its folder's path).
EVENT_FILES = "events.out.tfevents.*"

#: TensorBoard tag -> RoundRecord field; a None value (a round not evaluated) is skipped.
SCALARS = {
    "accuracy/global": "global_accuracy",
    "accuracy/personal": "personal_accuracy",
    "accuracy/personal_std": "personal_accuracy_std",
    "accuracy/personal_client_mean": "personal_accuracy_client_mean",
    "accuracy/personal_worst": "personal_accuracy_worst",
    "accuracy/personal_bottom_decile": "personal_accuracy_bottom_decile",
    "accuracy/personal_sampled": "personal_accuracy_sampled",
    "accuracy/personal_answered": "personal_accuracy_answered",
    "accuracy/personal_honest": "personal_accuracy_honest",
    "time/train_seconds": "train_seconds",
    "time/eval_seconds": "eval_seconds",
    "time/client_compute_seconds": "client_compute_seconds",
    "traffic/bytes_to_clients": "bytes_to_clients",
    "traffic/bytes_from_clients": "bytes_from_clients",
    "clients/train_failures": "train_failures",
    "clients/eval_failures": "eval_failures",
    "clients/trained": "clients_trained",
    "privacy/epsilon": "dp_epsilon",
}


def require_tensorboard() -> None:
    """Fail before any work when ``tensorboard = true`` cannot be honoured."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError as err:
        raise ConfigError(
            "tensorboard=true needs the tensorboard package: "
            "pip install -e '.[tensorboard]' (or set tensorboard=false)"
        ) from err


class TensorBoardLog:
    """The event files of one run folder."""

    def __init__(self, run_folder: Path, rounds: Iterable[RoundRecord]) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        for earlier in run_folder.glob(EVENT_FILES):  # an earlier attempt's rounds
            earlier.unlink()
        self.writer = SummaryWriter(log_dir=str(run_folder))
        for record in rounds:
            self._write(record)
        self.writer.flush()

    def add(self, record: RoundRecord) -> None:
        self._write(record)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def _write(self, record: RoundRecord) -> None:
        for tag, field_name in SCALARS.items():
            value = getattr(record, field_name)
            if value is not None:
                self.writer.add_scalar(tag, float(value), global_step=record.round)
