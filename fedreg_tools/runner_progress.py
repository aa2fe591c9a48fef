"""The runner's progress and timing: rounds done over the whole grid, the seconds a
round of each cell (timed in this invocation, or as the records on disk say), the time left
and when that is (:class:`Progress`), and what ``--dry-run`` says the runs still to do will
take. Kept apart from running the runs, so that the estimate can be computed, and tested,
from run specs and a clock alone."""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Sequence

from fedreg_tools.run_records import FINISHED, UNFINISHED, round_seconds, run_status
from fedreg_tools.runner_plan import RunSpec


def expected_time(progress: Progress) -> str:
    """What the runs still to do are expected to take, by their cells' records on disk (the
    median seconds of a round, this machine or another); where some cells have none, which,
    and what the others are expected to take (a lower bound on the whole, not a guess at
    the cells with no record: Ditto's round costs twice FedAvg's)."""
    if not progress.open:
        return "nothing left to run"
    expected = progress.seconds_per_round()
    known: list[RunSpec] = []
    blind: list[RunSpec] = []
    for spec in progress.open:
        (blind if math.isnan(expected[cell_key(spec)]) else known).append(spec)
    if not blind:
        return f"about {_clock(progress.seconds_left())} left at the seconds a round of the records"
    unknown = sorted({s.describe().rsplit(" seed ", 1)[0] for s in blind})
    named = unknown[:3] + ([f"{len(unknown) - 3} more"] if len(unknown) > 3 else [])
    said = f"time left unknown: no record yet of {', '.join(named)}"
    if not known:
        return said
    runs = f"{len(known)} runs, by their" if len(known) > 1 else "run, by its"
    return f"{said}; about {_clock(progress.seconds_left(runs=known))} for the other {runs} records"


def cell_key(spec: RunSpec) -> tuple[str, str]:
    """What makes two runs cost alike: the experiment and the cell (every seed's)."""
    return spec.experiment, json.dumps(spec.cell, sort_keys=True, default=str)


def recorded_seconds(specs: Sequence[RunSpec]) -> dict[tuple[str, str], float]:
    """Per cell, the median wall seconds of a round in the records already in its seed
    folders (finished or partial, any seed): what a cell not yet run in this invocation is
    expected to cost, where the cells of a grid cost very differently (Ditto trains two
    models a round, FedAvg one)."""
    seconds: dict[tuple[str, str], list[float]] = {}
    for spec in specs:
        for _, document in spec._documents():
            # rounds the report's check bore out (not a failed run's, which it does not
            # check), of this setting (not the 50 epochs a round of an earlier one)
            if run_status(document) in (*FINISHED, *UNFINISHED) and not spec.differences(document):
                seconds.setdefault(cell_key(spec), []).extend(round_seconds(document))
    return {key: statistics.median(values) for key, values in seconds.items() if values}


#: per cell (``cell_key``): seconds and rounds summed
Tallies = dict[tuple[str, str], list[float]]

#: A run is timed over its last this many rounds: a stretch on a shared machine (a test
#: suite beside it) should not weigh on the estimate for the rest.
RECENT_ROUNDS = 10


class Progress:
    """Runs and rounds done over the whole grid, seconds per round of the run in progress,
    elapsed time and an estimate of the time left (and when that is).

    A run's first round in an invocation also pays its start-up (Ray, the partitions,
    CUDA: a minute on a GPU whose rounds take 5 s), so the seconds a round are timed from
    the end of each run's first round here on, and the start-ups are counted apart. The
    estimate adds up, over the rounds still to run, each cell's seconds a round: as timed
    in this invocation where the cell has run, else as its records on disk say, scaled by
    how this invocation's cells compare with their own records (the records may come from
    another machine), else this invocation's mean; and a start-up for each run still to
    start, once one has been timed. A run timed here, the one in progress too, counts
    with its last ``RECENT_ROUNDS`` rounds only, so the estimate follows the machine's
    present pace.
    """

    def __init__(
        self,
        specs: list[RunSpec],
        ahead: dict[int, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``specs`` with their finished results found (``result``); ``ahead``: per
        unfinished run (by ``id``), the round its checkpoint lets it resume after."""
        self.clock = clock
        self.total_rounds = sum(s.num_rounds for s in specs)
        self.open = [s for s in specs if s.result is None]  # neither finished nor given up
        self.ahead = ahead or {}
        #: rounds of the runs finished (before or in this invocation) or given up
        self.rounds_closed = sum(s.num_rounds for s in specs if s.result is not None)
        self.current: RunSpec | None = None
        self.run_start = 0  # rounds the current run had when this invocation started it
        self.started = self.run_started = clock()
        #: the clock and the run's rounds when its first round here was seen (None before)
        self.first_seen: tuple[float, int] | None = None
        #: (clock, rounds) of the current run's first round here and of the rounds seen
        #: since, the oldest dropped once the later ones span RECENT_ROUNDS rounds
        self.seen: list[tuple[float, int]] = []
        #: per cell: seconds and rounds timed after each closed run's first round here
        self.measured: Tallies = {}
        #: per cell: seconds and rounds of each closed run's first round here (start-up in)
        self.first: Tallies = {}
        self.starts: dict[tuple[str, str], int] = {}  # per cell: runs started here
        self.recorded = recorded_seconds(specs)

    def start(self, spec: RunSpec, rounds_at_start: int) -> None:
        self.current, self.run_start, self.run_started = spec, rounds_at_start, self.clock()
        self.first_seen, self.seen = None, []
        self.starts[cell_key(spec)] = self.starts.get(cell_key(spec), 0) + 1

    def observe(self, rounds_in_run: int) -> None:
        """The current run has ``rounds_in_run`` rounds checkpointed now."""
        if self.first_seen is None and rounds_in_run > self.run_start:
            self.first_seen = (self.clock(), rounds_in_run)
            self.seen = [self.first_seen]
        elif self.seen and rounds_in_run > self.seen[-1][1]:
            self.seen.append((self.clock(), rounds_in_run))
            while len(self.seen) > 1 and rounds_in_run - self.seen[1][1] >= RECENT_ROUNDS:
                del self.seen[0]  # the window still spans RECENT_ROUNDS rounds without it

    def close(self, spec: RunSpec, rounds_in_run: int) -> None:
        """``spec`` ended here with ``rounds_in_run`` rounds, or was given up unstarted."""
        if spec is self.current:
            self.measured, self.first = self._timed(spec, rounds_in_run)
            self.current, self.run_start, self.first_seen, self.seen = None, 0, None, []
        self.open = [s for s in self.open if s is not spec]
        self.rounds_closed += spec.num_rounds

    def done(self, rounds_in_run: int = 0) -> int:
        """Rounds done over the grid: of closed runs, of the current one (``rounds_in_run``)
        and those the checkpoints of the runs still to come hold."""
        return self.rounds_closed + rounds_in_run + sum(self._ahead(s) for s in self.open)

    def _ahead(self, spec: RunSpec) -> int:
        return 0 if spec is self.current else self.ahead.get(id(spec), 0)

    def _timed(self, spec: RunSpec | None, rounds_in_run: int) -> tuple[Tallies, Tallies]:
        """Per cell, the seconds and rounds of this invocation after each run's first round
        here (of a run longer than ``RECENT_ROUNDS`` rounds here, its last ones), and those
        of the first rounds; the current run's (``spec``) included."""
        measured = {key: list(tally) for key, tally in self.measured.items()}
        first = {key: list(tally) for key, tally in self.first.items()}
        if spec is None:
            return measured, first
        now, seen = self.clock(), self.first_seen
        if seen is None:  # no round seen yet: all of it is the first round
            seen = (now, max(self.run_start, rounds_in_run))
        since = self.seen[0] if self.seen else seen  # the recent rounds' start
        parts = (
            (first, seen[0] - self.run_started, seen[1] - self.run_start),
            (measured, now - since[0], max(0, rounds_in_run - since[1])),
        )
        for tallies, seconds, rounds in parts:
            tally = tallies.setdefault(cell_key(spec), [0.0, 0])
            tally[0], tally[1] = tally[0] + seconds, tally[1] + rounds
        return measured, first

    def measured_per_round(self, spec: RunSpec, rounds_in_run: int) -> float:
        """The seconds a round of the current run's cell, as timed in this invocation: after
        the runs' first rounds here once there is such a round, else with the start-up."""
        measured, first = self._timed(spec, rounds_in_run)
        for seconds, rounds in (measured[cell_key(spec)], first[cell_key(spec)]):
            if rounds:
                return seconds / rounds
        return math.nan

    def seconds_per_round(
        self, spec: RunSpec | None = None, rounds_in_run: int = 0
    ) -> dict[tuple[str, str], float]:
        """Each open cell's expected seconds a round (NaN where nothing tells yet)."""
        measured, first = self._timed(spec, rounds_in_run)
        rates = {key: s / r for key, (s, r) in measured.items() if r > 0}
        with_start = {key: s / r for key, (s, r) in first.items() if r > 0}
        both = [key for key in rates if key in self.recorded and self.recorded[key] > 0]
        scale = (
            sum(measured[k][0] for k in both) / sum(self.recorded[k] * measured[k][1] for k in both)
            if both else 1.0
        )  # fmt: skip
        pooled = measured if rates else first
        spent = sum(s for s, _ in pooled.values())
        computed = sum(r for _, r in pooled.values())
        mean = spent / computed if computed else math.nan
        expected = {}
        for key in {cell_key(s) for s in self.open}:
            if key in rates:
                expected[key] = rates[key]
            elif key in self.recorded:
                expected[key] = self.recorded[key] * scale
            else:
                expected[key] = with_start.get(key, mean)
        return expected

    def start_up_seconds(self, spec: RunSpec | None = None, rounds_in_run: int = 0) -> float:
        """What a run's start costs beyond its first round: over the runs started here in
        cells with a timed rate, the mean of (first rounds' seconds - those rounds at the
        cell's rate); 0 until then."""
        measured, first = self._timed(spec, rounds_in_run)
        extra, starts = 0.0, 0
        for key, (seconds, rounds) in first.items():
            timed = measured.get(key)
            if rounds and timed and timed[1]:
                extra += seconds - rounds * timed[0] / timed[1]
                starts += self.starts[key]
        return max(0.0, extra / starts) if starts else 0.0

    def seconds_left(
        self,
        spec: RunSpec | None = None,
        rounds_in_run: int = 0,
        runs: Sequence[RunSpec] | None = None,
    ) -> float:
        """The estimate of the time the open runs (or those of them in ``runs``) still need
        (NaN while unknown); ``spec``: the run in progress, with ``rounds_in_run`` done."""
        expected = self.seconds_per_round(spec, rounds_in_run)
        runs = self.open if runs is None else runs
        to_start = sum(1 for s in runs if s is not spec)
        return to_start * self.start_up_seconds(spec, rounds_in_run) + sum(
            (s.num_rounds - (rounds_in_run if s is spec else self._ahead(s)))
            * expected[cell_key(s)]
            for s in runs
        )

    def line(self, index: int, total: int, spec: RunSpec, rounds_in_run: int) -> str:
        done = self.done(rounds_in_run)
        elapsed = self.clock() - self.started
        per_round = self.measured_per_round(spec, rounds_in_run)
        left = self.seconds_left(spec, rounds_in_run)
        eta = "" if math.isnan(left) else f", ETA {_wall_clock(left)}"
        return (
            f"[run {index}/{total} | round {rounds_in_run}/{spec.num_rounds}] {spec.describe()}"
            f" | grid {done}/{self.total_rounds} rounds"
            f" | {'?' if math.isnan(per_round) else f'{per_round:.1f}'} s/round"
            f" | elapsed {_clock(elapsed)} | left ~{_clock(left)}{eta}"
        )


def _clock(seconds: float) -> str:
    if math.isnan(seconds):
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _wall_clock(seconds_from_now: float) -> str:
    """The local time that many seconds from now: ``21:35``, with the date past a day."""
    moment = time.localtime(time.time() + seconds_from_now)
    return time.strftime("%H:%M" if seconds_from_now < 20 * 3600 else "%Y-%m-%d %H:%M", moment)
