"""The figures beyond the best: per-client spread, final and last-rounds means, in every
round record and results.json, checked against the rounds where a file states them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedreg_app.core.figures import client_figures, final_and_last, summarised_figures
from fedreg_app.core.metrics import ResultsWriter, RoundRecord, record_problem


def test_client_figures_are_the_unweighted_mean_the_lowest_and_the_lowest_tenth() -> None:
    figures = client_figures([(k + 1) / 20 for k in reversed(range(20))])
    assert figures["personal_accuracy_client_mean"] == pytest.approx(0.525)
    assert figures["personal_accuracy_worst"] == 0.05
    assert figures["personal_accuracy_bottom_decile"] == pytest.approx(0.075)  # 2 of 20
    # fewer than ten clients: the tenth is the lowest one
    assert client_figures([0.9, 0.3, 0.6])["personal_accuracy_bottom_decile"] == 0.3
    assert set(client_figures([]).values()) == {None}


def test_final_and_last_skip_rounds_not_evaluated() -> None:
    values = [0.1, None, *[k / 100 for k in range(20, 32)], None]
    assert final_and_last(values) == (0.31, pytest.approx(sum(range(22, 32)) / 1000))
    assert final_and_last([None, None]) == (None, None)


def record(number: int, personal: float, clients: dict[str, float]) -> RoundRecord:
    spread = client_figures(clients.values())
    covered = {"clients": len(clients), "of_clients": len(clients), "test_samples": 10,
               "of_test_samples": 10}  # fmt: skip
    return RoundRecord(number, 0.5, personal, 0.1, 1.0, 1.0, 10, client_accuracies=clients,
                       personal_coverage=covered, **spread)  # fmt: skip


def test_results_json_states_the_final_and_last_figures_beside_the_best(tmp_path: Path) -> None:
    writer = ResultsWriter(
        tmp_path / "run",
        {"algo": "fedreg", "num-server-rounds": 12},
        {"run_id": 1, "num_clients": 2},
    )
    for number in range(1, 13):
        writer.add(record(number, number / 100, {"0": number / 100, "1": 0.9}))
    writer.finish()
    document = json.loads(writer.json_path.read_text())
    assert document["best_personal_accuracy"] == 0.12
    assert document["final_personal_accuracy"] == 0.12
    assert document["last10_mean_personal_accuracy"] == pytest.approx(0.075)  # 3..12 %
    assert document["final_personal_accuracy_worst"] == 0.12
    assert document["last10_mean_personal_accuracy_client_mean"] == pytest.approx(0.4875)
    assert document["rounds"][0]["personal_accuracy_bottom_decile"] == 0.01
    assert record_problem(document) is None
    # a stated figure the rounds do not give is refused, naming it
    document["last10_mean_personal_accuracy_worst"] = 0.5
    assert "last10_mean_personal_accuracy_worst is 0.5" in record_problem(document)
    # a file of an earlier version, which stated none of them, is read as it is
    earlier = {k: v for k, v in document.items() if k not in summarised_figures([])}
    assert record_problem(earlier) is None


def test_a_per_client_figure_of_a_round_not_all_clients_answered_is_refused() -> None:
    partial = record(1, 0.5, {"0": 0.5})
    document = {
        "config": {"algo": "fedreg", "num-server-rounds": 1},
        "run": {"status": "completed", "num_clients": 2},
        "rounds": [{**vars(partial), "personal_accuracy": None, "personal_accuracy_std": None,
                    "personal_coverage": {"clients": 1, "of_clients": 2, "test_samples": 5,
                                          "of_test_samples": 10}}],
    }  # fmt: skip
    assert "personal_accuracy_client_mean is 0.5" in record_problem(document)


def test_a_report_shows_the_worst_client_of_records_written_before_the_field(
    tmp_path: Path,
) -> None:
    """``--personal worst``: the lowest client per round, from ``client_accuracies`` where
    a record of an earlier version does not state it."""
    from fedreg_tools.report_tables import paper_table
    from fedreg_tools.run_records import collect
    from tests.test_reports import fake_run

    fake_run(tmp_path, "e", "fedreg", 0, clients=4, personals=(0.8, 0.85, 0.9))
    path = tmp_path / "e/fedreg/seed0/run-1/results.json"
    document = json.loads(path.read_text())
    for number, record in enumerate(document["rounds"], start=1):
        record["client_accuracies"] = {"0": 0.9, "1": number / 10, "2": 0.7, "3": 1.0}
    path.write_text(json.dumps(document))
    [run] = collect(tmp_path)
    assert run.series("personal_accuracy_worst") == ([1, 2, 3], [0.1, 0.2, 0.3])
    table = paper_table([run], personal="worst")
    assert "| e G | e P worst |" in table.splitlines()[0] or "P worst" in table
    assert "30.00" in table and "lowest client" in table
