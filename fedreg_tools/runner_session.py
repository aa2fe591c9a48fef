"""Running the grid: one SuperLink for the invocation, each pending run started or
resumed through ``flwr run`` in turn and followed round by round (:class:`Session`,
:func:`run_all`), the ``--out`` lock that keeps a second runner out, and the stops
(SIGINT, SIGTERM, ``--max-minutes``) that leave every run resumable (:class:`Stop`). The
only part of the runner that starts processes; it stands on the plan, the decisions, the
progress and the summary's run line."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedreg_app.core.metrics import mark_stopped
from fedreg_app.core.persist import (
    FolderInUseError,
    UnsafeLockError,
    hold_folder,
    release_folder,
)
from fedreg_tools.launcher import ONE_CPU, ClientResources, LocalSuperLink
from fedreg_tools.overrides import declared_run_config
from fedreg_tools.runner_decisions import MARKER, decide, tidy, write_marker
from fedreg_tools.runner_plan import FLWR_LOG, RunSpec, checkpoint_round, write_run_config
from fedreg_tools.runner_progress import Progress
from fedreg_tools.runner_summary import done_line

EXIT_TIME_UP = 3  # stopped by --max-minutes; the same command continues
#: In ``--out``: held (``flock``) by the runner using that folder, with its PID inside.
RUNNER_LOCK = ".fedreg-experiment.lock"


class Stop(BaseException):
    """The runner stops before the grid is done, leaving every run resumable: on a signal
    (exit status 128 + its number) or when ``--max-minutes`` is up (3)."""

    def __init__(self, reason: str, exit_code: int) -> None:
        super().__init__(reason)
        self.reason, self.exit_code = reason, exit_code


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT (Ctrl-C) and SIGTERM raise :class:`Stop` in the main thread; the runner then
    stops the SuperLink and the simulation by PID. Further signals while it does so are
    ignored, so that nothing it started is left behind."""

    def handler(signum: int, _frame: object) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        name = signal.Signals(signum).name
        raise Stop(f"stopped by {name}", 128 + signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def exclusive_out(out: Path) -> Iterator[None]:
    """Hold ``out`` for this runner: two runners on one ``--out`` would resume the same
    run folders and share one SuperLink database (``.flwr_home``), writing over each
    other's results. Raises :class:`FolderInUseError` naming the other's PID."""
    try:
        handle = hold_folder(out, RUNNER_LOCK, f"another fedreg-experiment (PID {os.getpid()})")
    except UnsafeLockError:
        raise  # a planted link, not another runner: its own message says so
    except FolderInUseError as busy:
        raise FolderInUseError(
            f"{busy}: two runners on one --out would resume the same runs and write over "
            "each other. Wait for it to end, stop that PID, or give this grid another --out"
        ) from None
    try:
        yield
    finally:
        release_folder(handle)


@dataclass
class Limits:
    """When to stop: ``deadline`` (a time.monotonic() value; None = never) is honoured at
    a round boundary, once this invocation has done at least one round."""

    deadline: float | None = None
    restart_damaged: bool = False

    def time_up(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


def run_all(
    specs: list[RunSpec],
    home: Path,
    poll_seconds: float = 5.0,
    limits: Limits | None = None,
    declared: dict[str, Any] | None = None,
    resources: ClientResources = ONE_CPU,
) -> list[RunSpec]:
    """Run what is not finished yet, one run at a time, through one SuperLink (each client
    actor reserving ``resources``), resuming interrupted runs from their checkpoints;
    returns the runs that are still not finished (failed, not resumable, or no
    results.json). No SuperLink is started when every pending run is surely refused (a
    damaged checkpoint, changed or unreadable data; not a folder in use, which its holder
    may release while the SuperLink starts: decided again then). Raises :class:`Stop` when
    stopped early, after the SuperLink and everything it started are stopped."""
    limits = limits or Limits()
    declared = declared if declared is not None else declared_run_config()
    attempts = {}  # each pending run's prospect, nothing changed on disk yet
    for spec in specs:
        tidy(spec)
        spec.result = spec.finished_results()
        if spec.result is None:
            attempts[id(spec)] = decide(spec, declared, restart_damaged=False)
    progress = Progress(specs, {key: a.after_round for key, a in attempts.items()})
    pending = [spec for spec in specs if spec.result is None]
    print(
        f"{len(specs) - len(pending)} of {len(specs)} runs already finished; {len(pending)} to run"
    )
    if not pending:
        return []
    session = Session(progress, limits, len(specs), poll_seconds, declared)
    first = len(specs) - len(pending) + 1
    if all(attempts[id(spec)].refused(limits.restart_damaged) for spec in pending):
        for spec in pending:  # named as below, with no SuperLink started for nothing
            session.refuse(spec, attempts[id(spec)].problem or "", attempts[id(spec)].damaged)
        return pending
    try:
        with LocalSuperLink(home, resources=resources) as superlink:
            try:
                for index, spec in enumerate(pending, start=first):
                    session.run(superlink, index, spec)
            except Stop as stop:
                session.mark_stopped(stop)  # before the SuperLink goes
                raise
    except Stop as stop:
        session.write_stopped(stop)  # the SuperLink and the ServerApp are gone now
        session.report_stop(stop)
        raise
    return [s for s in specs if s.result is None]


def submitted_run_id(log_path: Path) -> int | None:
    """The run id ``flwr run`` printed on submitting the run (None before it did)."""
    try:
        with log_path.open(errors="replace") as log:
            head = log.read(1 << 16)
    except OSError:
        return None
    found = re.search(r"Successfully started run (\d+)", head)
    return int(found[1]) if found else None


class Session:
    """The runs of one invocation: starts or resumes each, reports progress, and stops
    at a round boundary when the time is up."""

    def __init__(
        self, progress: Progress, limits: Limits, total: int, poll_seconds: float,
        declared: dict[str, Any],
    ) -> None:  # fmt: skip
        self.progress, self.limits, self.total = progress, limits, total
        self.poll_seconds = min(poll_seconds, 0.5) if limits.deadline is not None else poll_seconds
        self.declared = declared
        self.rounds_run = 0  # rounds this invocation completed (a slice does at least one)
        self.current: Path | None = None  # the run folder in progress
        self.confirmed = False  # whether it is known to be this run's (resumed, or by run id)
        self.spec: RunSpec | None = None
        self.before: set[Path] = set()  # the seed's run folders before the run started

    def find_run_folder(self) -> None:
        """A new run's folder, once the ServerApp has made it: the one named by the run id
        ``flwr run`` printed, where it printed one, so that a folder another run makes in
        the seed's folder meanwhile (a run an earlier SuperLink left pending, before
        :func:`~fedreg_tools.launcher.forget_earlier_runs`) is never taken for this run's."""
        if self.spec is None or self.confirmed:
            return
        new = [f for f in self.spec.run_folders() if f not in self.before]
        run_id = submitted_run_id(self.spec.folder / FLWR_LOG)
        if run_id is not None:
            new = [f for f in new if f.name.endswith(f"_run{run_id}")]
            self.confirmed = bool(new)  # the run's own folder: looked for no more
        self.current = new[-1] if new else self.current

    def run(self, superlink: LocalSuperLink, index: int, spec: RunSpec) -> None:
        if self.rounds_run and self.limits.time_up():
            raise Stop("stopped by --max-minutes", EXIT_TIME_UP)
        attempt = decide(spec, self.declared, self.limits.restart_damaged)
        if attempt.problem:
            self.refuse(spec, attempt.problem, attempt.damaged)
            return
        if attempt.note:
            print(f"{spec.describe()}: {attempt.note}", flush=True)
        elif attempt.resume is None and (other := spec.other_setting()):
            print(f"{spec.describe()}: {other}; running this setting", flush=True)
        spec.folder.mkdir(parents=True, exist_ok=True)
        run_config = dict(spec.run_config)
        if attempt.resume is not None:
            run_config["resume"] = str(attempt.resume)
            (attempt.resume / MARKER).unlink(missing_ok=True)  # running again
        elif spec.own_state_dir and spec.state_dir is not None:
            shutil.rmtree(spec.state_dir / "runs", ignore_errors=True)  # nothing resumes it
        self.before = set(spec.run_folders())
        self.spec, self.current = spec, attempt.resume
        self.confirmed = attempt.resume is not None
        self.progress.start(spec, attempt.after_round)
        config_file = write_run_config(run_config, spec.folder)
        log_path = spec.folder / FLWR_LOG
        last, boundary = -1, None
        polling = superlink.run_polling(str(config_file), spec.clients, log_path,
                                        self.poll_seconds)  # fmt: skip
        try:
            for _ in polling:
                self.find_run_folder()
                rounds = checkpoint_round(self.current)
                if rounds != last:
                    self.progress.observe(rounds)
                    print(self.progress.line(index, self.total, spec, rounds), flush=True)
                    self.rounds_run += max(0, rounds - max(last, attempt.after_round))
                    last = rounds
                if boundary is None and self.limits.time_up():
                    boundary = rounds  # stop once the round in progress is checkpointed
                if boundary is not None and boundary < rounds < spec.num_rounds:
                    raise Stop("stopped by --max-minutes", EXIT_TIME_UP)
                # After the last round the run is ending: let it write ``completed``.
        finally:
            polling.close()  # ends `flwr run` at once, also when stopped mid-run
            config_file.unlink(missing_ok=True)
        rounds = checkpoint_round(self.current)
        self.rounds_run += max(0, rounds - max(last, attempt.after_round))
        self.progress.close(spec, rounds)
        run_folder = self.current
        self.spec, self.current, self.confirmed = None, None, False
        spec.result = spec.finished_results()
        if spec.result is None:
            print(f"run failed: {spec.describe()}: {spec.failure()}", file=sys.stderr)
            return
        if spec.own_state_dir and spec.state_dir is not None:
            if run_folder is not None:
                keep_set_aside(spec.state_dir, run_folder)
            shutil.rmtree(spec.state_dir, ignore_errors=True)  # only a resume would need it
        print(f"done: {done_line(spec)}", flush=True)

    def refuse(self, spec: RunSpec, problem: str, damaged: bool = False) -> None:
        """Name a run that cannot go on, and why; it stays unfinished. ``damaged``: its
        folder cannot be trusted, which a plain rerun does not change."""
        spec.problem, spec.damaged = problem, damaged
        print(f"not run: {spec.describe()}: {problem}", file=sys.stderr, flush=True)
        self.progress.close(spec, 0)

    def mark_stopped(self, stop: Stop) -> None:
        """Note in the run folder in progress that the runner stopped it, so that the
        ``failed`` status the ServerApp may write on its way out reads as resumable."""
        self.find_run_folder()
        if self.spec is not None and self.current is not None:
            write_marker(self.current, stopped=stop.reason)

    def write_stopped(self, stop: Stop) -> None:
        """Say in the results.json of the run in progress that the runner stopped it
        (status ``stopped``), so that a report does not take it for a run still going."""
        if self.spec is not None and self.current is not None:
            mark_stopped(self.current, stop.reason, checkpoint_round(self.current))

    def report_stop(self, stop: Stop) -> None:
        """Where the grid stands, once the SuperLink and the simulation are stopped."""
        where = ""
        rounds = checkpoint_round(self.current) if self.current is not None else 0
        if self.spec is not None and rounds > 0:
            where = (
                f"; {self.spec.describe()} stopped after round {rounds}/{self.spec.num_rounds}"
                f" (checkpoint in {self.current})"
            )
        elif self.spec is not None:  # its folder holds no checkpoint: it starts anew
            where = (f"; {self.spec.describe()} stopped before its first checkpoint (the "
                     "next run of this command starts it anew)")  # fmt: skip
        done = self.progress.done(checkpoint_round(self.current) if self.spec else 0)
        print(
            f"{stop.reason}{where}; grid {done}/{self.progress.total_rounds} rounds done",
            file=sys.stderr,
            flush=True,
        )


#: Where a finished run keeps the client-state files its clients set aside.
SET_ASIDE = "set-aside-state"


def keep_set_aside(state_dir: Path, run_folder: Path) -> list[Path]:
    """Move the client-state files set aside as corrupt (``*.corrupt-*``) out of the
    state folder the runner deletes, into the run folder, keeping their paths: they are
    what someone looks at to learn what went wrong."""
    kept = []
    for path in sorted(state_dir.rglob("*.corrupt-*")):
        target = run_folder / SET_ASIDE / path.relative_to(state_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), target)
        kept.append(target)
    return kept
