"""The ServerApp's checkpoint: everything needed to continue a run from the next round.

Written after every round into ``<run folder>/checkpoint/`` as one unit:

* ``round-000005/model.npz``    - the global arrays the next round starts from;
* ``round-000005/strategy.npz`` - the strategy's arrays (e.g. FedDyn's h);
* ``state.json`` - the commit record, written atomically after both: the round, the
  folder holding its arrays with the sha256 and size of each file, the sampling
  generator's state, the strategy's scalar state, the client-state key, the run config it
  was made with, the clients it was made with (their number and every partition's split
  sizes), the seal of ``results.json`` as it stood (the run id and a sha256 of its
  rounds, so that a resume keeps only the rounds this checkpoint continues), and a sha256
  of all that.

A kill at any moment leaves ``state.json`` naming a complete earlier round (its folder is
deleted only after the new ``state.json`` is in place), so a checkpoint is never a mix of
two rounds. Nothing on disk is trusted when loading: each array file must match the size
and hash ``state.json`` gives, ``state.json`` must match its own hash, nothing is
unpickled (``.npz`` without object arrays, JSON), and anything wrong is a
:class:`ConfigError` naming the file. The flat layout of earlier versions
(``checkpoint/model.npz``, ``strategy.npz``, ``state.json`` without hashes) still loads.

``results.json`` is written before the checkpoint, so after a crash between the two the
results may hold one round more than the checkpoint; resuming drops it and runs it again.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedreg_app.core.config import (
    PLACE_KEYS,
    ConfigError,
    RunConfig,
    as_ran,
    is_count,
    is_whole,
)
from fedreg_app.core.persist import (
    READ_ERRORS,
    file_sha256,
    fsync_folder,
    json_text,
    load_checked_arrays,
    save_json,
    write_atomic,
)

FOLDER = "checkpoint"
STATE = "state.json"
MODEL, STRATEGY = "model.npz", "strategy.npz"
#: ``state.json``'s layout; absent in the flat checkpoints of earlier versions.
FORMAT = 2
#: Round folders: ``round-000005``, or ``round-000005-2`` when that name is taken.
ROUND_FOLDER = re.compile(r"round-\d{6,}(-\d+)?")
#: A content digest as :func:`~fedreg_app.core.data.tensors_digest` writes it.
SHA256 = re.compile(r"[0-9a-f]{64}")
#: How the digests are computed; a checkpoint's digests of another scheme are not
#: compared (bump it when :func:`~fedreg_app.core.data.tensors_digest` changes).
DIGEST_SCHEME = 1
#: Run-config keys a resumed run may change; every other key must match the checkpoint.
RESUMABLE_CHANGES = PLACE_KEYS | {"num-server-rounds", "eval-every"}
#: What the user can do about a checkpoint that cannot be trusted.
REMEDY = "resume from another run folder, or start the run anew without resume"


@dataclass
class Checkpoint:
    round: int
    model: dict[str, np.ndarray]
    strategy_arrays: dict[str, np.ndarray]
    strategy_state: dict[str, Any]
    state_key: str
    run_config: dict[str, Any]
    #: The federation it was made with (:func:`clients_record`); None in earlier versions.
    clients: dict[str, Any] | None = None
    #: ``results.json``'s seal when this round committed (``ResultsWriter.seal``): the
    #: run id and the sha256 of rounds 1 to this one; None in earlier versions.
    results: dict[str, Any] | None = None

    def save(self, run_folder: Path) -> None:
        """Arrays into a fresh round folder, then ``state.json`` naming it (the commit),
        then the older rounds go: a kill at any point leaves one whole checkpoint."""
        folder = run_folder / FOLDER
        rounds = folder / _fresh_round_name(folder, self.round)
        if rounds.exists():  # left by a save that was killed before its commit
            shutil.rmtree(rounds)
        files = {
            MODEL: _write_npz(rounds / MODEL, self.model),
            STRATEGY: _write_npz(rounds / STRATEGY, self.strategy_arrays),
        }
        fsync_folder(folder)  # the round folder exists on disk before anything names it
        body = {
            "format": FORMAT,
            "round": self.round,
            "folder": rounds.name,
            "files": files,
            "strategy_state": self.strategy_state,
            "state_key": self.state_key,
            "run_config": self.run_config,
            "clients": self.clients,
            "results": self.results,
        }
        save_json(folder / STATE, {**body, "sha256": _body_hash(body)})
        _remove_all_but(folder, rounds.name)

    @classmethod
    def load(cls, path: Path) -> tuple[Checkpoint, Path]:
        """From a run folder (or its ``checkpoint`` folder); returns it and the run folder."""
        path = path.expanduser().resolve()
        folder = path if path.name == FOLDER else path / FOLDER
        state_path = folder / STATE
        if not state_path.is_file():
            if _round_folders(folder):
                raise ConfigError(
                    f"resume={str(path)!r}: no complete checkpoint there: {state_path} is "
                    "missing although round folders exist (the run was stopped while writing "
                    f"its first checkpoint, or the file was deleted); {REMEDY}"
                )
            raise ConfigError(
                f"resume={str(path)!r}: no checkpoint there; expected a run folder holding "
                f"{FOLDER}/{STATE} (the folder a run prints as its results folder)"
            )
        state = _read_state(state_path)
        if "format" in state:
            arrays_folder = _checked_round_folder(folder, state, state_path)
            for name in (MODEL, STRATEGY):
                _verify(arrays_folder / name, state["files"][name])
        else:  # the flat layout of earlier versions: no hashes, the zip CRCs must do
            arrays_folder = folder
        checkpoint = cls(
            round=_field(state, "round", int, state_path),
            model=_read_npz(arrays_folder / MODEL),
            strategy_arrays=_read_npz(arrays_folder / STRATEGY),
            strategy_state=_field(state, "strategy_state", dict, state_path),
            state_key=_field(state, "state_key", str, state_path),
            run_config=_field(state, "run_config", dict, state_path),
            clients=_clients_field(state, state_path),
            results=_results_field(state, state_path),
        )
        return checkpoint, folder.parent

    def check_compatible(self, config: RunConfig, fixed: Collection[str] = ()) -> None:
        """A resumed run must be the same experiment: same algorithm, data, seed, ...;
        ``fixed``: keys of :data:`RESUMABLE_CHANGES` the algorithm needs kept too."""
        now = config.to_run_config()
        catalog = {config.algo: type(config.options)}  # the algorithm's own keys' meanings
        for key, then in sorted(as_ran(self.run_config, catalog).items()):  # earlier's too
            if (key in RESUMABLE_CHANGES and key not in fixed) or now.get(key, then) == then:
                continue
            why = (
                f"{config.algo} lays its schedule out over it" if key in fixed
                else f"only {', '.join(sorted(RESUMABLE_CHANGES))} may change"
            )  # fmt: skip
            raise ConfigError(
                f"resume: {key}={now.get(key)!r} is not allowed: the checkpoint was made with "
                f"{key}={then!r} ({why})"
            )
        # As many rounds as the checkpoint holds: killed after its last round, the resume
        # only completes the run (writes its final status); fewer cannot be meant.
        if config.num_server_rounds < self.round:
            raise ConfigError(
                f"num-server-rounds={config.num_server_rounds} is not allowed: the checkpoint "
                f"has already finished round {self.round}; expected at least that many"
            )

    @property
    def compares_digests(self) -> bool:
        """Whether a resume compares the partitions' content digests: recorded, by the
        scheme this version computes."""
        then = self.clients or {}
        return bool(then.get("split_digests")) and then.get("digest_scheme") == DIGEST_SCHEME

    def check_clients(
        self,
        num_clients: int,
        sizes: Mapping[int, tuple[int, int]] | None = None,
        digests: Mapping[int, str] | None = None,
    ) -> None:
        """The resumed run must have the same clients with the same data: another number of
        partitions (another ``num-supernodes``, or nodes started with another
        ``num-partitions``), another partitioning or other samples (a dataset changed at
        its path) would continue the checkpoint's model and client state on other data.
        ``sizes``: every partition's (train, test) split sizes, ``digests`` their content
        digests, where known (the count alone is checked first, right after the clients
        are discovered)."""
        then = self.clients
        if then is None:  # a checkpoint of an earlier version: nothing to compare
            return
        if num_clients != then["num_clients"]:
            raise ConfigError(
                f"resume: {num_clients} clients (partitions) is not allowed: the "
                f"checkpoint was made with {then['num_clients']}; start the federation with "
                f"{then['num_clients']} (num-supernodes, or the nodes' num-partitions)"
            )
        now = clients_record(num_clients, sizes or {}, digests or {})
        changed = _first_change(then.get("split_sizes"), now["split_sizes"])
        if changed is not None:
            raise ConfigError(
                f"resume: partition {changed} now has (train, test) sizes "
                f"{tuple(now['split_sizes'][changed])}, the checkpoint's run had "
                f"{tuple(then['split_sizes'][changed])}: {OTHER_DATA}"
            )
        recorded = then["split_digests"] if self.compares_digests else None
        changed = _first_change(recorded, now["split_digests"])
        if changed is not None:
            raise ConfigError(
                f"resume: partition {changed} now holds other samples than the checkpoint's "
                f"run (same sizes, content digest {now['split_digests'][changed][:12]} "
                f"instead of {then['split_digests'][changed][:12]}): {OTHER_DATA}"
            )


#: Why a resume on changed data is refused, and what to do.
OTHER_DATA = (
    "the data are not the ones the run was trained on (the dataset at dataset-path was "
    "replaced or re-encoded, the partitioning changed, or another Pillow decodes its "
    "images otherwise); resume with the original data and libraries, or start anew"
)


def _first_change(then: list | None, now: list | None) -> int | None:
    """The first partition whose recorded entry differs (None: equal, or either unknown)."""
    if then is None or now is None:
        return None
    return next((p for p, (a, b) in enumerate(zip(then, now, strict=True)) if a != b), None)


def clients_record(
    num_clients: int,
    sizes: Mapping[int, tuple[int, int]],
    digests: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """What a checkpoint keeps of its federation: the number of partitions, and each
    partition's (train, test) split sizes and content digest where the ServerApp knows
    them (every algorithm's since 0.3.0; in earlier versions, not the references')."""
    split_sizes = [list(sizes[p]) for p in range(num_clients)] if sizes else None
    split_digests = [digests[p] for p in range(num_clients)] if digests else None
    return {
        "num_clients": num_clients,
        "split_sizes": split_sizes,
        "split_digests": split_digests,
        **({"digest_scheme": DIGEST_SCHEME} if digests else {}),
    }


def state_path(run_folder: Path) -> Path:
    """Where a run folder's checkpoint commit record lies (present once a round is
    committed, whatever state it is in)."""
    return run_folder / FOLDER / STATE


def committed_round(run_folder: Path) -> int:
    """The round of a run folder's committed checkpoint from its commit record alone
    (cheap enough to poll while the run goes on); 0 when there is none or it is unreadable
    (:meth:`Checkpoint.load` says why)."""
    try:
        return int(json.loads(state_path(run_folder).read_text())["round"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _fail(path: Path, problem: str) -> ConfigError:
    """The error for a checkpoint file that cannot be trusted: which file, why, what to do."""
    return ConfigError(f"checkpoint file {path} {problem}; {REMEDY}")


def _write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Write named arrays atomically; returns the size and sha256 of the bytes written."""
    buffer = io.BytesIO()
    np.savez(buffer, **{key: np.asarray(value) for key, value in arrays.items()})
    data = buffer.getvalue()
    write_atomic(path, lambda handle: handle.write(data))
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _body_hash(body: Mapping[str, Any]) -> str:
    """Hash of ``state.json``'s content, independent of its formatting. Taken of the
    content as read back (integer dict keys become strings), so saving and loading agree."""
    as_read = json.loads(json_text(body))  # as save_json writes it (non-finite as null)
    return hashlib.sha256(json.dumps(as_read, sort_keys=True).encode()).hexdigest()


def _read_state(path: Path) -> dict[str, Any]:
    """``state.json`` as a dict, checked against its own hash when it has one."""
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as err:  # unreadable, not UTF-8, not JSON
        raise _fail(path, f"is unreadable or not valid JSON ({err})") from None
    if not isinstance(state, dict):
        raise _fail(path, "is not a JSON object")
    if "format" not in state:
        return state  # flat layout of earlier versions
    if state.get("format") != FORMAT:
        raise _fail(path, f"has format {state.get('format')!r}; expected {FORMAT}")
    body = {key: value for key, value in state.items() if key != "sha256"}
    if state.get("sha256") != _body_hash(body):
        raise _fail(path, "does not match its sha256 (it was changed or damaged on disk)")
    return state


def _checked_round_folder(folder: Path, state: dict[str, Any], state_path: Path) -> Path:
    """The round folder ``state.json`` names, which must be a plain name in ``folder``."""
    name, files = state.get("folder"), state.get("files")
    if not isinstance(name, str) or not ROUND_FOLDER.fullmatch(name):
        raise _fail(state_path, f"names no valid round folder ({name!r})")
    if not isinstance(files, dict) or not all(
        isinstance(files.get(f), dict) for f in (MODEL, STRATEGY)
    ):
        raise _fail(state_path, f"lacks the size and sha256 of {MODEL} and {STRATEGY}")
    return folder / name


def _verify(path: Path, expected: Mapping[str, Any]) -> None:
    """The file must be exactly the one the commit record describes."""
    if not path.is_file():
        raise _fail(path, "is missing (state.json names it)")
    size = path.stat().st_size
    if size != expected.get("size"):
        raise _fail(path, f"has {size} bytes, expected {expected.get('size')} (truncated?)")
    if file_sha256(path) != expected.get("sha256"):
        raise _fail(path, "does not match the sha256 in state.json (damaged on disk)")


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """Arrays of a checkpoint file; every zip member's CRC is checked first."""
    if not path.is_file():
        raise _fail(path, "is missing")
    try:
        return load_checked_arrays(path)
    except READ_ERRORS as err:
        raise _fail(path, f"is not a readable .npz file ({type(err).__name__}: {err})") from None


def _field(state: Mapping[str, Any], key: str, kind: type, path: Path) -> Any:
    value = state.get(key)
    if kind is int and is_count(value):
        return value  # the only int field is the round: a checkpoint is of round 1 or later
    if kind is not int and isinstance(value, kind):
        return value
    wanted = "an integer >= 1" if kind is int else kind.__name__
    raise _fail(path, f"has no valid {key!r} (expected {wanted}, got {value!r:.60})")


def _clients_field(state: Mapping[str, Any], path: Path) -> dict[str, Any] | None:
    """The ``clients`` record, checked for shape (older checkpoints have none)."""
    clients = state.get("clients")
    if clients is None:
        return None
    number = clients.get("num_clients") if isinstance(clients, dict) else None
    sizes = clients.get("split_sizes") if isinstance(clients, dict) else None
    sizes_ok = sizes is None or (
        isinstance(sizes, list) and len(sizes) == number
        and all(isinstance(pair, list) and len(pair) == 2
                and all(is_whole(n) for n in pair) for pair in sizes)
    )  # fmt: skip
    digests = clients.get("split_digests") if isinstance(clients, dict) else None
    digests_ok = digests is None or (
        isinstance(digests, list) and len(digests) == number
        and all(isinstance(d, str) and SHA256.fullmatch(d) for d in digests)
    )  # fmt: skip
    if not is_count(number) or not sizes_ok or not digests_ok:
        raise _fail(path, f"has no valid 'clients' record (got {clients!r:.80})")
    return clients


@dataclass(frozen=True)
class Seal:
    """What a run folder's checkpoint says of its ``results.json``, read from
    ``state.json`` alone (no arrays): the round it holds, the rounds' seal and the run
    config it was made with."""

    round: int
    results: dict[str, Any] | None
    run_config: dict[str, Any]


def read_seal(run_folder: Path) -> Seal | None:
    """The seal of a run folder's checkpoint; None where it has none, or one that cannot
    be read (nothing to hold the record to: a committed record, an earlier version's)."""
    state_path = run_folder / FOLDER / STATE
    if not state_path.is_file():
        return None
    try:
        state = _read_state(state_path)
        return Seal(_field(state, "round", int, state_path), _results_field(state, state_path),
                    _field(state, "run_config", dict, state_path))  # fmt: skip
    except ConfigError:
        return None


def _results_field(state: Mapping[str, Any], path: Path) -> dict[str, Any] | None:
    """The seal of ``results.json``, checked for shape (older checkpoints have none)."""
    results = state.get("results")
    if results is None:
        return None
    if not (
        isinstance(results, dict) and is_whole(results.get("run_id"))
        and isinstance(results.get("rounds_sha256"), str)
        and SHA256.fullmatch(results["rounds_sha256"])
        and (results.get("fields") is None or (isinstance(results["fields"], list)
             and all(isinstance(name, str) for name in results["fields"])))
    ):  # fmt: skip
        raise _fail(path, f"has no valid 'results' seal (got {results!r:.80})")
    return results


def _round_folders(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return [p for p in folder.iterdir() if p.is_dir() and ROUND_FOLDER.fullmatch(p.name)]


def _committed_folder(folder: Path) -> str | None:
    """The round folder the current ``state.json`` names (None if none can be read)."""
    try:
        name = json.loads((folder / STATE).read_text()).get("folder")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) else None


def _fresh_round_name(folder: Path, server_round: int) -> str:
    """``round-<n>``, unless the committed checkpoint already lives there: never write
    into the folder that ``state.json`` names."""
    committed = _committed_folder(folder)
    name, suffix = f"round-{server_round:06d}", 1
    candidate = name
    while candidate == committed:
        suffix += 1
        candidate = f"{name}-{suffix}"
    return candidate


def _remove_all_but(folder: Path, keep: str) -> None:
    """After the commit: older round folders, the flat files of an earlier version and
    temporary files of killed writes are no longer named by anything."""
    for entry in folder.iterdir():
        if entry.is_dir() and ROUND_FOLDER.fullmatch(entry.name) and entry.name != keep:
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.is_file() and (
            entry.name in (MODEL, STRATEGY)
            or (entry.name.startswith(".") and entry.name.endswith(".tmp"))
        ):
            entry.unlink(missing_ok=True)
    fsync_folder(folder)
