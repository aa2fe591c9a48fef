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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np


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
