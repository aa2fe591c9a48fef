"""Files that outlive a process (a node's private state and decoded data, the server's
checkpoint, results): the primitives every writer and reader of them shares. Arrays go
to ``.npz`` and metadata to JSON, both written atomically (a unique temporary file,
fsynced, then a rename) and read without unpickling anything
(``np.load(allow_pickle=False)``); a damaged file is detected (CRCs, hashes) and moved
aside rather than trusted.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import math
import os
import stat
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping
from logging import WARNING
from pathlib import Path
from typing import IO, Any, BinaryIO, TypeVar

import numpy as np

from fedreg_app.core.keys import ConfigError

#: What reading a damaged file can raise (numpy, zipfile, json, the file system).
READ_ERRORS = (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile)
T = TypeVar("T")


def write_atomic(path: Path, write: Callable[[BinaryIO], object], shared: bool = False) -> None:
    """Write a file so that a reader sees the old version or the new one, never a mix:
    a unique temporary file in the same folder, flushed and fsynced, renamed over the
    target, then the folder fsynced so the rename itself survives a power cut.

    The file is its owner's alone (``mkstemp``'s 0600: clients' private state, decoded
    data, checkpoints); ``shared`` gives it the mode ``open()`` would (the umask's), for
    the records a colleague reads. A file system that keeps no modes keeps its own."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            if shared:
                with contextlib.suppress(OSError):  # vfat, some network mounts
                    os.fchmod(handle.fileno(), 0o666 & ~file_creation_mask())
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


def file_creation_mask() -> int:
    """The process's umask, read without setting it (``os.umask`` can only be read by
    setting it, which would change it for every thread meanwhile); Linux names it in
    ``/proc/self/status``, elsewhere the common 0o022."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def remove_leftover_temporaries(folder: Path) -> list[Path]:
    """Delete the temporary files :func:`write_atomic` left under ``folder`` when its
    process was killed mid-write (``.<name>.<random>.tmp``; what they held was never
    renamed into place, so nothing reads them). Only for a folder this process holds
    (a run folder under its lock): another writer's file in progress would look alike."""
    removed = []
    for path in sorted(folder.rglob(".*.tmp")):
        if path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


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


def write_text_atomic(path: Path, text: str, shared: bool = False) -> None:
    write_atomic(path, lambda handle: handle.write(text.encode()), shared)


def save_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Named arrays to one ``.npz`` file, atomically."""
    write_atomic(
        path, lambda handle: np.savez(handle, **{k: np.asarray(v) for k, v in arrays.items()})
    )


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """Named arrays from an ``.npz`` file; object arrays (pickles) are refused."""
    with np.load(path, allow_pickle=False) as archive:
        return {key: archive[key] for key in archive.files}


def finite_only(value: Any, where: str = "") -> Any:
    """``value`` with every NaN or infinite float replaced by None (JSON null), each
    named in a warning: JSON has no such numbers, and a file holding Python's ``NaN``
    token is refused by strict readers (browsers, jq, most languages' parsers)."""
    if isinstance(value, float) and not math.isfinite(value):
        logging.getLogger(__name__).warning("%s is %r; written as null", where or "value", value)
        return None
    if isinstance(value, dict):
        return {k: finite_only(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_only(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def json_text(document: Any, rows: str | None = None) -> str:
    """Strict JSON (no NaN or Infinity tokens), indented, as every file here is written.
    ``rows``: the key of a top-level list whose items are written one to a line, compact
    (results.json's rounds: a full-scale record is a third smaller than fully indented,
    and a diff shows which rounds changed). The parsed value is the same either way."""
    document = finite_only(document)
    if rows is None or not isinstance(document, dict) or not document.get(rows):
        return json.dumps(document, indent=2, allow_nan=False)
    fields = []
    for key, value in document.items():
        if key == rows and isinstance(value, list):
            items = ",\n".join(f"    {compact_json(item)}" for item in value)
            body = f"[\n{items}\n  ]"
        else:
            body = json.dumps(value, indent=2, allow_nan=False).replace("\n", "\n  ")
        fields.append(f"  {json.dumps(key)}: {body}")
    return "{\n" + ",\n".join(fields) + "\n}"


def compact_json(value: Any) -> str:
    """One line of strict JSON, without spaces."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def save_json(path: Path, document: Any) -> None:
    write_text_atomic(path, json_text(document))


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())


def digest(*parts: Any) -> str:
    """A short stable name for a tuple of settings (folder names of caches)."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in chunks."""
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            sha.update(chunk)
    return sha.hexdigest()


def file_sha256_cached(path: Path) -> str:
    """:func:`file_sha256`, computed again only when the file's size or modification time
    changed (a client names its init-model's digest in every reply)."""
    status = path.stat()
    return _sha256_of_version(path.resolve(), status.st_size, status.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _sha256_of_version(path: Path, size: int, mtime_ns: int) -> str:
    return file_sha256(path)


def load_checked_arrays(path: Path) -> dict[str, np.ndarray]:
    """``load_arrays`` after checking every zip member's CRC, so that damage anywhere in
    the file (numpy's headers included) is an error rather than wrong numbers."""
    with zipfile.ZipFile(path) as archive:
        bad = archive.testzip()
    if bad is not None:
        raise zipfile.BadZipFile(f"member {bad!r} fails its CRC check")
    return load_arrays(path)


def quarantine(path: Path, keep_as: Path | None = None) -> Path | None:
    """Move a damaged file aside as ``<name>.corrupt-<timestamp>`` (beside it, or named
    after ``keep_as``), kept for a look and never read again. Returns where it went (None
    if another process moved it first)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = keep_as or path
    aside, n = base.with_name(f"{base.name}.corrupt-{stamp}"), 1
    while aside.exists():
        n += 1
        aside = base.with_name(f"{base.name}.corrupt-{stamp}-{n}")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return None
    return aside


def read_cache(path: Path, read: Callable[[Path], T]) -> T | None:
    """A derived file of a node's cache, or None if it is missing or damaged (a damaged
    one is moved aside): the cache is rebuilt from the source data, which is always
    correct, rather than trusted or fatal."""
    if not path.exists():
        return None
    try:
        return read(path)
    except READ_ERRORS as err:
        aside = quarantine(path)
        if aside is not None:
            from flwr.common import log  # Flower's logger; a late import keeps CLIs light

            log(WARNING, "cache file %s is damaged (%s: %s): moved aside as %s, rebuilding it "
                "from the source data", path, type(err).__name__, err, aside.name)  # fmt: skip
        return None


#: In a run folder: held (``flock``) by the ServerApp writing it, named inside.
RUN_FOLDER_LOCK = ".serverapp.lock"


class FolderInUseError(RuntimeError):
    """Another process holds a folder that only one may write at a time."""


class UnsafeLockError(FolderInUseError):
    """A folder's lock file is a symlink or not a regular file: holding it would write
    through to whatever it points at, so the folder is not held (a FolderInUseError:
    whoever refuses a busy folder refuses this one the same way)."""


def open_lock_file(path: Path, flags: int) -> IO[str]:
    """``path`` opened without following a symlink (``O_NOFOLLOW``), refused
    (:class:`UnsafeLockError` naming it) unless it is a regular file: the holder's name
    is written into it, and a link planted there would overwrite the file it names."""
    try:
        # O_NONBLOCK: a FIFO planted there must not hang the open (no effect on a file)
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except OSError as err:
        if path.is_symlink():
            raise UnsafeLockError(
                f"lock file {path} is a symlink: expected a regular file (remove the link)"
            ) from None
        raise err
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeLockError(f"lock file {path} is not a regular file: expected one")
    return os.fdopen(fd, "r+" if flags & os.O_RDWR else "r")


def hold_folder(folder: Path, lock_name: str, holder: str) -> IO[str]:
    """Hold ``folder`` for this process: an exclusive ``flock`` on ``folder/lock_name``,
    which the kernel releases when the file is closed or the process ends, however it
    ends (no stale lock after a SIGKILL or a lost machine); ``holder`` (who and since
    when) is written inside for the next one's message. Returns the open file: the lock
    lasts until :func:`release_folder` or the process's end. Raises
    :class:`FolderInUseError` naming the holder when another process (or another open
    of the file in this one) holds it, :class:`UnsafeLockError` when the lock file is a
    symlink or not a regular file."""
    folder.mkdir(parents=True, exist_ok=True)
    handle = open_lock_file(folder / lock_name, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        other = handle.read().strip() or "a process that has not written its name yet"
        handle.close()
        raise FolderInUseError(f"{folder} is in use by {other}") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{holder} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    handle.flush()
    return handle


def release_folder(handle: IO[str]) -> None:
    """Let the folder go: empty the holder's name, then close (which drops the lock)."""
    if not handle.closed:
        handle.truncate(0)
        handle.close()


def folder_holder(folder: Path, lock_name: str) -> str | None:
    """Who holds ``folder`` now (the name it wrote), or None when no process does. A
    probe with a shared lock, dropped at once: it never waits, and it does not create
    the lock file."""
    try:
        handle = open_lock_file(folder / lock_name, os.O_RDONLY)
    except (OSError, UnsafeLockError):
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().strip() or "a process that has not written its name yet"
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def check_results_dir(results_dir: str) -> None:
    """``results-dir`` must be a folder, or a path whose first existing part is one (it
    is created): a regular file there would fail only once the first round is written."""
    path = Path(results_dir or "results").expanduser()
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        where = "is" if existing == path else f"lies under {existing}, which is"
        raise ConfigError(f"results-dir={results_dir!r} {where} a file, not a folder: "
                          "expected a folder (created if missing)")  # fmt: skip
