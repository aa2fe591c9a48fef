"""New clients: partitions held out of training, evaluated apart after a local round."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clients.fedper import FedPerClient
from fedreg_app.core.config import ConfigError
from fedreg_app.core.metrics import record_problem
from fedreg_app.core.models import HEAD_G
from fedreg_app.core.new_clients import held_out, held_out_count
from fedreg_app.core.protocol import NUM_TEST, PERSONAL_CORRECT
from fedreg_app.registry import load_config
from tests.inprocess import results, run_server
from tests.test_clients import global_arrays, make_setup


@pytest.mark.parametrize(("fraction", "clients", "count"), [
    (0.0, 50, 0), (0.1, 50, 5), (0.25, 4, 1), (0.01, 10, 1), (0.99, 4, 3), (0.5, 1, 0),
])  # fmt: skip
def test_the_held_out_share_is_floored_at_one_and_never_takes_every_client(
    fraction: float, clients: int, count: int
) -> None:
    assert held_out_count(fraction, clients) == count


def test_the_held_out_clients_are_a_seeded_draw_of_the_seed_and_n() -> None:
    config = load_config({"new-client-fraction": 0.2, "seed": 3})
    assert held_out(config, 50) == held_out(load_config({"new-client-fraction": 0.2,
                                                         "seed": 3}), 50)  # fmt: skip
    assert len(held_out(config, 50)) == 10
    assert held_out(config, 50) != held_out(load_config({"new-client-fraction": 0.2}), 50)


@pytest.mark.parametrize(("keys", "message"), [
    ({"new-client-fraction": 1.0}, r"new-client-fraction=1.0 is not allowed.*\[0, 1\)"),
    ({"new-client-fraction": -0.1}, "new-client-fraction=-0.1"),
    ({"new-client-epochs": -1}, "new-client-epochs=-1.*an integer >= 0"),
    ({"new-client-fraction": 0.1, "dp-mode": "central", "dp-noise-multiplier": 1.0,
      "dp-clip": 1.0, "dp-delta": 1e-5}, "new-client-fraction=0.1.*dp-mode='central'"),
])  # fmt: skip
def test_impossible_new_client_settings_are_refused_naming_the_key(keys, message) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(keys)


@pytest.mark.parametrize("algo", ["local", "centralised"])
def test_references_without_new_clients_refuse_the_key(algo: str) -> None:
    from fedreg_app.registry import get_algorithm

    config = load_config({"algo": algo, "new-client-fraction": 0.1})
    with pytest.raises(ConfigError, match=f"new-client-fraction=0.1.*algo='{algo}'"):
        get_algorithm(algo).strategy.check_config(config)


def test_a_new_client_is_evaluated_after_its_own_local_round_and_keeps_nothing() -> None:
    """FedPer: the head a new client trains in its round is its personal head; with 0
    epochs it is the initial head an untrained client has."""
    untrained = FedPerClient(make_setup(algo="fedper", **{"new-client-epochs": 0}))
    arrays = global_arrays(seed=4)
    as_untrained = untrained.evaluate_as_new_client(arrays, 3)
    assert as_untrained == FedPerClient(make_setup(algo="fedper")).evaluate(arrays, 3)
    setup = make_setup(algo="fedper", **{"new-client-epochs": 2})
    adapted = FedPerClient(setup)
    counts = adapted.evaluate_as_new_client(arrays, 3)
    assert counts[NUM_TEST] == 15 and 0 <= counts[PERSONAL_CORRECT] <= 15
    assert not np.array_equal(adapted.model.group_state(HEAD_G)["head_g.2.weight"],
                              arrays["head_g.2.weight"])  # fmt: skip
    assert adapted.config.local_epochs == 2 and len(setup.state) == 0  # nothing kept


@pytest.fixture
def federation(grey_dataset: Path, tmp_path: Path) -> dict[str, Any]:
    """Four clients, one of them new, every other trained every round."""
    return {
        "algo": "fedper", "dataset-path": str(grey_dataset), "local-epochs": 1,
        "fraction-train": 1.0, "min-partition-size": 5, "num-server-rounds": 2, "seed": 5,
        "results-dir": str(tmp_path / "results"), "new-client-fraction": 0.25,
    }  # fmt: skip


def test_a_new_client_never_trains_and_is_reported_apart(
    federation: dict[str, Any], tmp_path: Path
) -> None:
    [newcomer] = held_out(load_config(federation), 4)
    run_server(federation)
    document = results(tmp_path / "results")
    for record in document["rounds"]:
        assert newcomer not in record["sampled_clients"] and len(record["sampled_clients"]) == 3
        assert record["train_replies"] == 3
        assert str(newcomer) not in record["client_accuracies"]
        assert len(record["client_accuracies"]) == 3
        assert record["personal_coverage"]["of_clients"] == 3
        assert record["personal_accuracy"] is not None  # the three that take part
        assert record["new_clients"] == 1
        assert 0 <= record["new_client_personal_accuracy"] <= 1
        assert 0 <= record["new_client_global_accuracy"] <= 1
    last = document["rounds"][-1]
    assert document["final_new_client_personal_accuracy"] == last["new_client_personal_accuracy"]
    assert document["run"]["status"] == "completed"
    # the record is one a report and a replay read: its coverage is of the three
    assert record_problem(document) is None
    document["rounds"][0]["personal_coverage"]["of_clients"] = 4
    assert "expected clients <= of_clients = 3" in record_problem(document)
