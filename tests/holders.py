"""Another process holding a folder's lock: what a live ServerApp or runner does, made
by a real process (a lock this process held would not show another's behaviour)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from fedreg_app.core.persist import RUN_FOLDER_LOCK

ROOT = Path(__file__).resolve().parent.parent
#: What the holder writes in a run folder's lock unless told otherwise.
SERVERAPP = "a ServerApp (PID 4242, run 7)"
_HOLD = """
import os, sys, time
from pathlib import Path
from fedreg_app.core.persist import hold_folder
held = hold_folder(Path(sys.argv[1]), sys.argv[2], sys.argv[3].format(pid=os.getpid()))
print("held", flush=True)
time.sleep(300)
"""


@contextlib.contextmanager
def held_elsewhere(
    folder: Path, lock_name: str = RUN_FOLDER_LOCK, holder: str = SERVERAPP
) -> Iterator[int]:
    """A process that holds ``folder`` (``holder`` may name its ``{pid}``) until the block
    ends, then is SIGKILLed, with no chance to clean up; yields its PID."""
    process = subprocess.Popen([sys.executable, "-c", _HOLD, str(folder), lock_name, holder],
                               stdout=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "held"
        yield process.pid
    finally:
        process.kill()
        process.wait(timeout=30)
