"""The figures of the speed benchmarks: what each ratio divides by what."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str):
    """A benchmark script as a module (they live outside the package)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def bare_pass(train_client_s: float, eval_client_s: float) -> dict[str, float]:
    return {
        "train_wall_s": train_client_s / 2, "train_client_s": train_client_s,
        "train_samples": 50_000, "eval_wall_s": eval_client_s / 2,
        "eval_client_s": eval_client_s, "train_on_cpu_s": train_client_s,
        "train_waiting_s": 0.0, "train_preempted": 0,
    }  # fmt: skip


def test_the_simulated_training_rate_leaves_the_evaluation_out() -> None:
    """A record's client_compute_seconds holds both phases' client work: set against the
    bare training whole, a simulation training exactly as fast as the bare loop would
    read 40 / (40 + 8) = 0.83."""
    round_limit = load_benchmark("round_limit")
    simulated = {
        "round": 2, "train_seconds": 21.0, "eval_seconds": 4.5,
        "client_compute_seconds": 48.0, "eval_compute_seconds": 8.0,
        "client_handler_seconds": 50.0, "client_setup_seconds": 0.5,
        "client_state_seconds": 0.5,
    }  # fmt: skip
    row = round_limit.row(simulated, bare_pass(39.0, 7.5), bare_pass(41.0, 8.5))
    assert row["sim_train_compute_s"] == pytest.approx(40.0)
    assert row["sim_over_bare"] == pytest.approx(1.0)
    assert row["eval_sim_over_bare"] == pytest.approx(1.0)
    assert row["beyond_compute_share"] == pytest.approx(2.0 / 50.0)
    assert row["round_over_limit"] == pytest.approx(25.5 / 24.0)


def test_the_scheduling_figures_are_per_cpu_second_and_per_runnable_second() -> None:
    round_limit = load_benchmark("round_limit")
    bare = [[{**bare_pass(40.0, 8.0), "train_on_cpu_s": 39.0, "train_waiting_s": 1.0,
              "train_preempted": 390}]] * 2  # fmt: skip
    figures = round_limit.scheduling_figures((95.0, 5.0, 19_000), bare)
    assert figures == {
        "actor_preempted_per_cpu_s": "200.0",
        "bare_preempted_per_cpu_s": "10.0",
        "actor_waiting_share": "0.050",
        "bare_waiting_share": "0.025",
    }


def test_the_actor_spread_replays_the_queue_and_largest_first_orders() -> None:
    """Five clients on two actors: in partition order (3, 1, 1, 1, 4 s) the 4 s client
    starts last, at 3 s, and ends at 7; largest first puts it beside the 3 s one and ends
    at 5, which is also the floor (10 s over two actors). Round 1 (start-up) is left out."""
    vs_peers = load_benchmark("vs_peers")
    assert vs_peers.makespan([3, 1, 1, 1, 4], 2) == 7
    assert vs_peers.makespan([4, 3, 1, 1, 1], 2) == 5
    spread = vs_peers.actor_spread([[50.0], [3, 1, 1, 1, 4], [3, 1, 1, 1, 4]], actors=2)
    assert spread == {"queue": 7, "largest_first": 5, "floor": 5, "ratios": [1.4, 1.4]}
    assert vs_peers.actor_spread([[50.0]], actors=2) == {}
