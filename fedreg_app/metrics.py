"""Per-round results, written after every round so an interrupted run keeps them.

``results.json`` holds the run config, one record per round and the best accuracies;
``rounds.csv`` holds the scalar columns of the same records. Both are replaced
atomically (write to a temporary file, then rename).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CSV_COLUMNS = (
    "round",
    "global_accuracy",
    "personal_accuracy",
    "personal_accuracy_std",
    "train_seconds",
    "eval_seconds",
    "num_train_examples",
    "trained_parameters",
    "bytes_to_clients",
    "bytes_from_clients",
    "client_compute_seconds",
    "client_handler_seconds",
    "server_eval_seconds",
)


@dataclass
class RoundRecord:
    """One round. Accuracies are fractions in [0, 1]; None where not evaluated.

    Costs: ``train_seconds`` / ``eval_seconds`` are the server's wall time of each phase;
    ``client_compute_seconds`` sums the clients' own work (training, evaluation) and
    ``client_handler_seconds`` their whole message handling; ``bytes_*`` count the model
    arrays in the messages of both phases, ``train_bytes_*`` those of the training phase
    alone (what a FedSeq-style comparison needs: evaluation sends every client the model);
    ``trained_parameters`` sums, over the clients that trained, the distinct parameters
    each updated."""

    round: int
    global_accuracy: float | None
    personal_accuracy: float | None
    personal_accuracy_std: float | None
    train_seconds: float
    eval_seconds: float
    num_train_examples: int
    trained_parameters: int = 0
    bytes_to_clients: int = 0
    bytes_from_clients: int = 0
    train_bytes_to_clients: int = 0
    train_bytes_from_clients: int = 0
    client_compute_seconds: float = 0.0
    client_handler_seconds: float = 0.0
    server_eval_seconds: float = 0.0
    sampled_clients: list[int] = field(default_factory=list)
    client_accuracies: dict[str, float] | None = None


def _best(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class ResultsWriter:
    """Owns one run folder; ``add`` appends a round and rewrites both files."""

    def __init__(
        self,
        folder: Path,
        config: dict[str, Any],
        run: dict[str, Any],
        rounds: list[RoundRecord] | None = None,
    ) -> None:
        """A new run (no ``rounds``), or one continued with the rounds it keeps; ``run``
        keeps its ``started`` time if it has one."""
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.run = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), **run, "status": "running"}
        self.rounds: list[RoundRecord] = list(rounds or [])
        self._write()

    @classmethod
    def resume(
        cls, folder: Path, config: dict[str, Any], run: dict[str, Any], after_round: int
    ) -> ResultsWriter:
        """Continue a run folder: its rounds up to the checkpoint's are kept (a round
        written after the last checkpoint is dropped, to be run again)."""
        document = json.loads((folder / "results.json").read_text())
        resumes = [*document["run"].get("resumed", []), {
            "run_id": run["run_id"], "after_round": after_round,
            "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }]  # fmt: skip
        continued = {
            **document["run"], **run, "resumed": resumes,
            "run_id": document["run"]["run_id"],  # the first run's id names the folder
        }  # fmt: skip
        kept = [RoundRecord(**r) for r in document["rounds"][:after_round]]
        return cls(folder, config, continued, kept)

    @property
    def json_path(self) -> Path:
        return self.folder / "results.json"

    def add(self, record: RoundRecord) -> None:
        self.rounds.append(record)
        self._write()

    def finish(self, status: str = "completed") -> None:
        self.run["status"] = status
        self.run["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        self._write()

    def summary(self) -> dict[str, Any]:
        best_global = _best([r.global_accuracy for r in self.rounds])
        best_personal = _best([r.personal_accuracy for r in self.rounds])
        score = math.log10(best_global / best_personal) if best_global and best_personal else None
        return {
            "total_bytes_to_clients": sum(r.bytes_to_clients for r in self.rounds),
            "total_bytes_from_clients": sum(r.bytes_from_clients for r in self.rounds),
            "total_train_bytes_to_clients": sum(r.train_bytes_to_clients for r in self.rounds),
            "total_train_bytes_from_clients": sum(r.train_bytes_from_clients for r in self.rounds),
            "total_trained_parameters": sum(r.trained_parameters for r in self.rounds),
            "best_global_accuracy": best_global,
            "best_personal_accuracy": best_personal,
            # FedReG paper, Figure 7: log10(g / p) of the best global and best personal
            # accuracy; 0 means the global model is as good as the personal ones.
            "log10_global_over_personal": score,
        }

    def _write(self) -> None:
        document = {
            "config": self.config,
            "run": self.run,
            "rounds": [asdict(r) for r in self.rounds],
            **self.summary(),
        }
        _atomic_write(self.json_path, json.dumps(document, indent=2))
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(CSV_COLUMNS)
        for r in self.rounds:
            writer.writerow(["" if getattr(r, c) is None else getattr(r, c) for c in CSV_COLUMNS])
        _atomic_write(self.folder / "rounds.csv", buffer.getvalue())
