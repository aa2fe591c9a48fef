"""Experiment runner: a config file (or several) x algorithms x seeds, through ``flwr run``
in Flower's simulation, resumable, with mean ± std over seeds at the end.

A config file is a run config (the keys of ``[tool.flwr.app.config]``) plus an optional
``[experiment]`` table that only the runner reads::

    algo = "fedreg"
    dataset = "zalando-datasets/fashion_mnist"
    num-server-rounds = 100

    [experiment]
    name = "table1"
    clients = 20                      # SuperNodes the runs need
    algos = ["fedreg"]                # default: the run config's algo
    seeds = 5                         # default: 1; seeds 0..seeds-1
    grid = { augment = ["auto", "simple"], threshold = ["max", "median", "mean", "secmin"] }
    # optional named variants, each a set of overrides (crossed with grid and algos):
    variants = { fedreg = {}, a = { fedreg-head-weight = "original" } }

Every cell (grid values x algorithm) runs once per seed into
``<out>/<name>/<cell>/seed<k>/``; a run whose folder already holds a finished
``results.json`` (status ``completed``, or ``degraded``: it ran to its end but some client
replies were missing) is skipped. A run that was interrupted (the runner stopped by
Ctrl-C, SIGTERM or ``--max-minutes``, or killed with the machine) continues from its
last checkpoint (``resume``), in the same run folder, with the same client state dir
(``<seed folder>/state`` for algorithms whose clients keep state): its results equal an
uninterrupted run's. A checkpoint that cannot be trusted is reported by folder and error
and that run is left alone, unless ``--restart-damaged`` asks to start it anew. A
``failed`` run (its own error: a data folder gone, every reply lost) is retried from its
last checkpoint by the next invocation; one that left no checkpoint is run again from
round 1; the runner lists failed runs at the end and exits non-zero. The summary table
marks degraded figures. Exit status: 0 every run finished, 1 some run failed or cannot be
resumed, 2 a bad command line or config, 3 stopped by ``--max-minutes`` (resumable),
130 / 143 stopped by SIGINT / SIGTERM (resumable).

    fedreg-experiment configs/smoke.toml --seeds 3 --algos fedreg,fedavg \\
        --set dataset-path=../shared/data/fashion_mnist

``--seeds 1-2`` (or ``0,3``) runs those seeds only, in the folders ``--seeds 3`` would
give them: seeds spread over machines, each with its own ``--out``, are merged by
``fedreg-report ROOT ROOT...``.

This module is the command line; the runner's parts are modules of their own, each
importing only the ones before it: ``runner_plan`` (config files into runs),
``runner_progress`` (the progress line and the time left), ``runner_decisions`` (resume,
start anew or refuse each run; markers; ``--dry-run``), ``runner_summary`` (the table and
the failures at the end) and ``runner_session`` (the SuperLink, the runs, the stops).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
import tomllib
from pathlib import Path

from fedreg_app.core.config import ConfigError
from fedreg_app.core.persist import FolderInUseError
from fedreg_tools.launcher import SUPERLINK_HOME, add_resource_arguments, resources_of
from fedreg_tools.overrides import declared_overrides, declared_run_config
from fedreg_tools.runner_decisions import _once, dry_run
from fedreg_tools.runner_plan import Experiment, names_list, plan, seed_numbers
from fedreg_tools.runner_session import Limits, Stop, exclusive_out, run_all, stop_on_signals
from fedreg_tools.runner_summary import finish

EXIT_BUSY = 4  # another runner is using the same --out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fedreg-experiment",
        description="Run config files x algorithms x seeds in Flower's simulation; "
        "resumable; prints mean ± std over seeds.",
        epilog="Exit status: 0 every run finished; 1 some run failed or cannot be resumed; "
        "2 bad arguments or config; 3 stopped by --max-minutes; 4 another runner is using "
        "--out; 130/143 stopped by SIGINT/SIGTERM. After 3, 130 or 143 the same command "
        "continues where it stopped.",
    )
    parser.add_argument("configs", nargs="+", type=Path, help="config files (configs/*.toml)")
    parser.add_argument("--seeds", help="seeds per cell: n runs seeds 0..n-1; 1-2 or 0,3 "
                        "runs those seeds (default: the file's number)")  # fmt: skip
    parser.add_argument("--algos", help="comma-separated algorithms (default: the file's)")
    parser.add_argument("--variants", help="comma-separated variant names: run only these "
                        "of each file's [experiment.variants] (default: all)")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a run-config key in every run (repeatable)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("experiments"), help="results root")
    parser.add_argument("--dry-run", action="store_true",
                        help="list the runs, each with what a run of the same command would do "
                        "(finished, resume after round N, start), and stop")  # fmt: skip
    parser.add_argument("--max-minutes", type=float, metavar="N",
                        help="stop at the first round boundary after N minutes (at least one "
                        "round is run); exit status 3; the same command continues")  # fmt: skip
    parser.add_argument("--restart-damaged", action="store_true",
                        help="start runs whose checkpoint cannot be trusted anew, in a fresh "
                        "folder (default: name them and leave them alone)")  # fmt: skip
    add_resource_arguments(parser)
    args = parser.parse_args(argv)
    if args.max_minutes is not None and not args.max_minutes >= 0:
        parser.error(f"--max-minutes={args.max_minutes} is not allowed: expected >= 0")
    resources = resources_of(args, parser)

    declared = declared_run_config()
    _once.cache_clear()  # data read by an earlier invocation in this process may differ now
    try:
        seeds = None if args.seeds is None else seed_numbers(args.seeds)
        overrides = declared_overrides(args.set, declared)
        experiments = [Experiment.load(path, declared) for path in args.configs]
        algos = names_list("--algos", args.algos)
        variants = names_list("--variants", args.variants)
        specs = plan(experiments, args.out, declared, overrides, seeds, algos, variants)
    except (ConfigError, OSError, tomllib.TOMLDecodeError) as err:
        parser.error(str(err))
    except UnicodeDecodeError as err:
        parser.error(f"a config file is not UTF-8 text ({err})")
    if args.dry_run:
        print(dry_run(specs, declared))
        return 0
    deadline = None if args.max_minutes is None else time.monotonic() + 60 * args.max_minutes
    limits = Limits(deadline, args.restart_damaged)
    try:
        with exclusive_out(args.out), stop_on_signals():
            run_all(specs, args.out / SUPERLINK_HOME, limits=limits, declared=declared,
                    resources=resources)  # fmt: skip
    except FolderInUseError as busy:
        print(f"fedreg-experiment: {busy}", file=sys.stderr, flush=True)
        return EXIT_BUSY
    except Stop as stop:
        finished = sum(s.result is not None for s in specs)
        again = shlex.join(["fedreg-experiment", *(sys.argv[1:] if argv is None else argv)])
        print(
            f"{finished} of {len(specs)} runs finished; every other run is resumable. "
            f"Continue with the same command:\n  {again}",
            file=sys.stderr,
            flush=True,
        )
        return stop.exit_code
    return finish(specs, args.out, [e.paper for e in experiments if e.paper])


if __name__ == "__main__":
    sys.exit(main())
