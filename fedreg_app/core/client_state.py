"""A node's private state on disk, versioned by round, so that a resumed run starts every
client from exactly the state the server's checkpoint expects.

Why versions: a client that finishes round t writes its new private parts (FedReG's
head_p, Ditto's v_k, FedDyn's correction, ...) before the server has aggregated round t
and written its checkpoint. If the server is killed in between and resumed, round t runs
again, and the client must start it from its state *before* round t, not from the state
the killed attempt left. So:

* after a round, the client commits its records as version t:
  ``<state-dir>/runs/<state-key>/partition-<id>/round-<t>/`` holding one ``.npz`` per
  record and ``manifest.json`` (sha256 and size of each file), written into a temporary
  folder that is renamed into place last: a version is complete or absent;
* a train message of round t restores the newest complete version before t (evaluation in
  round t: at most t); newer versions are stale leftovers of a killed attempt and are
  deleted, as are versions older than the newest one before t: while round t runs the
  server's checkpoint is round t-1's, so a resume restarts at round t, and the version
  before t is the oldest one it can ask for (evaluation in round t keeps it beside round
  t's own: a kill before round t's checkpoint runs round t again);
* each version's manifest says ``since``: the round its lineage began from no state. When
  every version is newer than the round asked, the client starts afresh; that is exact
  if the state began after that round (a client first sampled in the killed round), else
  the state of that round is lost (a server resumed from an older checkpoint): the
  caller counts it as a reset, and it is logged;
* each manifest names its owner (the partition and the run's state key); a version of
  another owner (folders swapped or copied between partitions) is set aside and the
  state starts afresh, counted;
* a record whose file does not match its manifest is moved aside as
  ``<file>.corrupt-<timestamp>`` and that record starts fresh; the caller reports it;
* once committed, the records are released from memory (:meth:`VersionedState.release`):
  a node's private state is in RAM only while the node handles a message, so a
  simulation of many nodes keeps none of the idle nodes' state.

Nothing is unpickled (``.npz`` without object arrays, JSON).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from flwr.app import ArrayRecord, RecordDict

from fedreg_app.core.persist import (
    READ_ERRORS,
    file_sha256,
    fsync_folder,
    load_arrays,
    quarantine,
    save_arrays,
    write_text_atomic,
)
from fedreg_app.core.records import from_record, to_record

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
PREFIX = "round-"
#: What :attr:`Restored.reset` names when no version is usable and the state was lost.
NO_USABLE_VERSION = "(no usable version)"
#: ... when the version found was written for another partition or run (a swapped folder).
ANOTHER_OWNER = "(another partition's or run's version)"
#: ... when the server knows of a newer version than the disk holds (a wiped state-dir).
MISSING_VERSION = "(a version the server knows of is missing)"


def version_name(server_round: int) -> str:
    return f"{PREFIX}{server_round:06d}"


@dataclass
class Restored:
    """What a restore found: the version's round (0: none), the records loaded and the
    records found corrupt (moved aside; they start fresh)."""

    round: int = 0
    records: list[str] = field(default_factory=list)
    reset: list[str] = field(default_factory=list)


class VersionedState:
    """One partition's private records for one run, one folder per committed round."""

    def __init__(self, folder: Path, owner: Mapping[str, object] | None = None) -> None:
        self.folder = folder
        #: Written into every manifest and required of every version loaded (manifests
        #: of earlier versions name none and are taken as they are).
        self.owner = dict(owner or {})
        #: name -> (the record object restored, its file): a record the procedure did not
        #: replace is the same object (algorithms replace a record when they change it).
        self._loaded: dict[str, tuple[ArrayRecord, Path]] = {}
        #: The round the restored state's lineage began (None: nothing restored).
        self._since: int | None = None

    def versions(self) -> dict[int, Path]:
        """Complete versions on disk by round (a folder without manifest is not one)."""
        found = {}
        if self.folder.is_dir():
            for path in self.folder.glob(f"{PREFIX}*"):
                suffix = path.name.removeprefix(PREFIX)
                if path.is_dir() and suffix.isdigit() and (path / MANIFEST).is_file():
                    found[int(suffix)] = path
        return found

    def restore(
        self, state: RecordDict, upto_round: int, checkpointed: int | None = None,
        held: int | None = None,
    ) -> Restored:  # fmt: skip
        """Replace the ArrayRecords of ``state`` by the newest version of a round
        <= ``upto_round``; delete versions after it (stale) and those a resume can no
        longer ask for: older than the newest version <= ``checkpointed`` (the round of
        the server's last checkpoint, which a resume starts after; ``upto_round`` when not
        given, as for a train message). When none is usable and the state existed by
        ``upto_round``, ``reset`` says so; so it does when the server knows of a version
        of round ``held`` (<= ``upto_round``) and the newest one here is older."""
        for name in [n for n, r in state.items() if isinstance(r, ArrayRecord)]:
            del state[name]  # the disk is the truth: memory may hold a killed attempt's
        self._loaded = {}
        versions = self.versions()
        usable = [r for r in versions if r <= upto_round]
        chosen = max(usable, default=0)
        result = Restored(round=chosen)
        if versions and not usable:
            self._note_lost(versions, upto_round, result)
        self._since = lineage_start(versions[chosen]) if chosen else None
        last_checkpoint = upto_round if checkpointed is None else checkpointed
        resumable = max((r for r in usable if r <= last_checkpoint), default=0)
        for round_, path in versions.items():
            if round_ not in (chosen, resumable):
                shutil.rmtree(path, ignore_errors=True)
        self._remove_partial_folders()
        if chosen:
            self._load_version(versions[chosen], state, result)
        if held is not None and result.round < held <= upto_round and not result.reset:
            logger.warning(
                "client state %s: the server knows of its version of round %d, but the "
                "newest one here is %s (the state-dir was wiped or replaced); the state of "
                "round %d is lost and starts afresh", self.folder, held,
                result.round or "none", held,
            )  # fmt: skip
            result.reset.append(MISSING_VERSION)
        return result

    def _note_lost(self, versions: dict[int, Path], upto_round: int, result: Restored) -> None:
        """Every version is newer than ``upto_round``: the state of that round is gone
        unless the state began after it. Counted in ``result.reset`` and logged, so the
        round's record shows a client that lost its personalization."""
        began = min(lineage_start(path) for path in versions.values())
        if began > upto_round:  # nothing existed at that round: starting afresh is exact
            return
        logger.warning(
            "client state %s: versions of rounds %s are all newer than round %d, the one "
            "asked for; its state of that round is lost and starts afresh",
            self.folder, sorted(versions), upto_round,
        )  # fmt: skip
        result.reset.append(NO_USABLE_VERSION)

    def _load_version(self, folder: Path, state: RecordDict, result: Restored) -> None:
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
            entries: Mapping[str, Mapping[str, object]] = manifest["records"]
        except (OSError, ValueError, KeyError, TypeError):
            self._set_aside(folder / MANIFEST)
            result.reset.append(MANIFEST)
            result.round, self._since = 0, None
            return
        owner = manifest.get("owner") if isinstance(manifest, dict) else None
        if owner is not None and self.owner and owner != self.owner:
            logger.warning(
                "client state %s belongs to %s, not to %s (a folder swapped or copied); set "
                "aside, the state starts afresh", folder, owner, self.owner,
            )  # fmt: skip
            self._set_aside(folder / MANIFEST)  # the folder is then partial: removed next
            result.reset.append(ANOTHER_OWNER)
            result.round, self._since = 0, None
            return
        for name, entry in entries.items():
            path = folder / str(entry.get("file", ""))
            try:
                if path.parent != folder or file_sha256(path) != entry.get("sha256"):
                    raise ValueError("hash mismatch")
                record = to_record(load_arrays(path))
            except READ_ERRORS:
                logger.warning("client state %s is corrupt; moved aside, starts afresh", path)
                self._set_aside(path)
                result.reset.append(name)
                continue
            state[name] = record
            self._loaded[name] = (record, path)
            result.records.append(name)

    def commit(self, state: RecordDict, server_round: int) -> bool:
        """Write the ArrayRecords of ``state`` as version ``server_round`` (complete or
        not at all). Returns False when nothing changed since :meth:`restore`."""
        records = {n: r for n, r in state.items() if isinstance(r, ArrayRecord)}
        unchanged = set(records) == set(self._loaded) and all(
            self._loaded[name][0] is record for name, record in records.items()
        )
        if unchanged:
            return False
        self.folder.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=self.folder, prefix=".staging-"))
        manifest = {}
        for name, record in records.items():
            path = staging / f"{urllib.parse.quote(name, safe='')}.npz"
            previous = self._loaded.get(name)
            if previous is not None and previous[0] is record and previous[1].exists():
                os.link(previous[1], path)  # the same bytes: no second write
            else:
                save_arrays(path, from_record(record))
            manifest[name] = {"file": path.name, "sha256": file_sha256(path)}
        since = server_round if self._since is None else self._since
        body = {"round": server_round, "since": since, "records": manifest,
                **({"owner": self.owner} if self.owner else {})}  # fmt: skip
        write_text_atomic(staging / MANIFEST, json.dumps(body))
        target = self.folder / version_name(server_round)
        if target.exists():  # a stale attempt at this round
            shutil.rmtree(target)
        os.replace(staging, target)
        fsync_folder(self.folder)
        return True

    def release(self, state: RecordDict) -> None:
        """Drop the ArrayRecords from ``state`` once they are committed: the next
        :meth:`restore` reads them from disk (which it does anyway: the disk is the
        truth), so memory holds a node's private state only while it handles a message."""
        for name in [n for n, r in state.items() if isinstance(r, ArrayRecord)]:
            del state[name]
        self._loaded = {}

    def _remove_partial_folders(self) -> None:
        """Staging folders, and round folders without manifest, are leftovers of a
        process killed while writing."""
        if not self.folder.is_dir():
            return
        for path in self.folder.iterdir():
            partial = path.name.startswith(".staging-") or (
                path.name.startswith(PREFIX) and path.is_dir() and not (path / MANIFEST).exists()
            )
            if partial:
                shutil.rmtree(path, ignore_errors=True)

    def _set_aside(self, path: Path) -> None:
        """Keep the bad file for inspection beside the versions (which get deleted)."""
        if path.exists():
            quarantine(path, keep_as=self.folder / f"{path.parent.name}-{path.name}")


def lineage_start(folder: Path) -> int:
    """The round a version's lineage began from no state (its manifest's ``since``); 1
    where the manifest does not say (written before ``since``, or unreadable): the state
    may then have existed from the start, so a loss of it is counted, not assumed away."""
    try:
        since = json.loads((folder / MANIFEST).read_text()).get("since")
    except (OSError, ValueError, AttributeError):
        return 1
    return since if type(since) is int and since >= 1 else 1
