"""Files that outlive a process: a node's private state, its decoded data, the server's
checkpoint. Arrays go to ``.npz`` and metadata to JSON, both written atomically (a
temporary file, then a rename) and read without unpickling anything
(``np.load(allow_pickle=False)``), so a file can be trusted as far as its bytes go and a
crash mid-write leaves the previous version in place.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from fedreg_app.records import from_record, to_record


def write_atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write a file so that a reader sees the old version or the new one, never a mix:
    a unique temporary file in the same folder, flushed and fsynced, renamed over the
    target, then the folder fsynced so the rename itself survives a power cut."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


def fsync_folder(folder: Path) -> None:
    """Make renames and new entries in ``folder`` durable (a no-op where unsupported)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    write_atomic(path, lambda handle: handle.write(text.encode()))


def save_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Named arrays to one ``.npz`` file, atomically."""
    write_atomic(
        path, lambda handle: np.savez(handle, **{k: np.asarray(v) for k, v in arrays.items()})
    )


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """Named arrays from an ``.npz`` file; object arrays (pickles) are refused."""
    with np.load(path, allow_pickle=False) as archive:
        return {key: archive[key] for key in archive.files}


def save_json(path: Path, document: Any) -> None:
    write_text_atomic(path, json.dumps(document, indent=2))


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())


def digest(*parts: Any) -> str:
    """A short stable name for a tuple of settings (folder names of caches)."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


class DiskState:
    """A node's ``context.state`` mirrored in a folder, one ``.npz`` per record.

    In deployment every message runs in a fresh process and a restarted SuperNode starts
    with empty state; with a ``state-dir`` the private parts (FedReG's head_p, Ditto's
    personal model, FedDyn's correction, ...) come back from here. Only ArrayRecords are
    kept on disk; they are all the algorithms store.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _path(self, name: str) -> Path:
        return self.folder / f"{urllib.parse.quote(name, safe='')}.npz"

    def restore(self, state: RecordDict) -> list[str]:
        """Load the records the in-memory state lacks (memory is newer when present)."""
        restored = []
        for path in sorted(self.folder.glob("*.npz")):
            name = urllib.parse.unquote(path.stem)
            if name not in state:
                state[name] = to_record(load_arrays(path))
                restored.append(name)
        return restored

    def persist(self, state: RecordDict, before: Mapping[str, int]) -> list[str]:
        """Write the ArrayRecords that are new or replaced since ``before`` (record ids)."""
        written = []
        for name, record in state.items():
            if isinstance(record, ArrayRecord) and before.get(name) != id(record):
                save_arrays(self._path(name), from_record(record))
                written.append(name)
        return written


def record_ids(state: RecordDict) -> dict[str, int]:
    """Identity of each record now: algorithms replace a record when they change it."""
    return {name: id(record) for name, record in state.items()}
