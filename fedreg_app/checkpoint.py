"""The ServerApp's checkpoint: everything needed to continue a run from the next round.

Written after every round into ``<run folder>/checkpoint/``:

* ``model.npz``     - the global arrays the next round starts from;
* ``strategy.npz``  - the strategy's arrays (e.g. FedDyn's h);
* ``state.json``    - the round, the sampling generator's state, the strategy's scalar
  state, the client-state key and the run config it was made with.

``results.json`` is written before the checkpoint, so after a crash between the two the
results may hold one round more than the checkpoint; resuming drops it and runs it again.
Nothing is unpickled when loading (``.npz`` without object arrays, JSON).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedreg_app.config import ConfigError, RunConfig
from fedreg_app.persist import load_arrays, load_json, save_arrays, save_json

FOLDER = "checkpoint"
#: Run-config keys a resumed run may change; every other key must match the checkpoint.
RESUMABLE_CHANGES = frozenset(
    {"num-server-rounds", "resume", "results-dir", "eval-every", "reply-timeout",
     "min-train-replies", "device", "dataset-path", "state-dir"}
)  # fmt: skip


@dataclass
class Checkpoint:
    round: int
    model: dict[str, np.ndarray]
    strategy_arrays: dict[str, np.ndarray]
    strategy_state: dict[str, Any]
    state_key: str
    run_config: dict[str, Any]

    def save(self, run_folder: Path) -> None:
        folder = run_folder / FOLDER
        save_arrays(folder / "model.npz", self.model)
        save_arrays(folder / "strategy.npz", self.strategy_arrays)
        save_json(
            folder / "state.json",
            {
                "round": self.round,
                "strategy_state": self.strategy_state,
                "state_key": self.state_key,
                "run_config": self.run_config,
            },
        )  # last: a state.json always names arrays that are complete

    @classmethod
    def load(cls, path: Path) -> tuple[Checkpoint, Path]:
        """From a run folder (or its ``checkpoint`` folder); returns it and the run folder."""
        path = path.expanduser().resolve()
        folder = path if path.name == FOLDER else path / FOLDER
        if not (folder / "state.json").is_file():
            raise ConfigError(
                f"resume={str(path)!r}: no checkpoint there; expected a run folder holding "
                f"{FOLDER}/state.json (the folder a run prints as its results folder)"
            )
        state = load_json(folder / "state.json")
        checkpoint = cls(
            round=int(state["round"]),
            model=load_arrays(folder / "model.npz"),
            strategy_arrays=load_arrays(folder / "strategy.npz"),
            strategy_state=state["strategy_state"],
            state_key=str(state["state_key"]),
            run_config=state["run_config"],
        )
        return checkpoint, folder.parent

    def check_compatible(self, config: RunConfig) -> None:
        """A resumed run must be the same experiment: same algorithm, data, seed, ..."""
        now = config.to_run_config()
        for key, then in sorted(self.run_config.items()):
            if key in RESUMABLE_CHANGES or now.get(key, then) == then:
                continue
            raise ConfigError(
                f"resume: {key}={now.get(key)!r} is not allowed: the checkpoint was made with "
                f"{key}={then!r} (only {', '.join(sorted(RESUMABLE_CHANGES))} may change)"
            )
        if config.num_server_rounds <= self.round:
            raise ConfigError(
                f"num-server-rounds={config.num_server_rounds} is not allowed: the checkpoint "
                f"has already finished round {self.round}; expected more rounds than that"
            )
