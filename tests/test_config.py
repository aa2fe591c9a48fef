"""Bad input fails before any work, with a message naming the key and what is allowed."""

from __future__ import annotations

import pytest

from fedreg_app.config import ConfigError, RunConfig


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("algo", "fedfoo", "ditto, fedavg, fedavg2rep, fedbabu"),
        ("alpha", 0.0, "> 0"),
        ("alpha", -1.0, "> 0"),
        ("fraction-train", 0.0, "(0, 1]"),
        ("fraction-train", 1.5, "(0, 1]"),
        ("head-depth", 4, "(1, 2, 3)"),
        ("head-depth", 0, "(1, 2, 3)"),
        ("threshold", "average", "mean, median, max, secmin"),
        ("threshold", "0", "integer >= 1"),
        ("augment", "heavy", "simple, auto"),
        ("local-epochs", 0, ">= 1"),
        ("batch-size", 0, ">= 1"),
        ("eval-every", 0, ">= 1"),
        ("device", "tpu", "auto, cpu, cuda"),
    ],
)
def test_bad_value_names_key_and_allowed_values(key: str, value: object, allowed: str) -> None:
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_run_config({key: value})
    message = str(caught.value)
    assert message.startswith(f"{key}=")
    assert allowed in message


def test_dataset_path_without_parquet_files_is_rejected(tmp_path) -> None:
    (tmp_path / "test.parquet").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"dataset-path=.*train\.parquet not found"):
        RunConfig.from_run_config({"dataset-path": str(tmp_path)})
    (tmp_path / "train.parquet").write_bytes(b"")  # a train split alone is a dataset
    RunConfig.from_run_config({"dataset-path": str(tmp_path)})


def test_wrong_type_is_rejected() -> None:
    with pytest.raises(ConfigError, match="num-server-rounds"):
        RunConfig.from_run_config({"num-server-rounds": "ten"})


def test_defaults_are_the_papers_setup() -> None:
    config = RunConfig.from_run_config({})
    assert (config.lr, config.momentum, config.batch_size, config.local_epochs) == (
        0.01,
        0.9,
        20,
        5,
    )
    assert (config.algo, config.head_depth, config.threshold, config.augment) == (
        "fedreg",
        2,
        "mean",
        "simple",
    )


def test_integer_threshold_and_int_alpha_are_accepted() -> None:
    config = RunConfig.from_run_config({"threshold": 50, "alpha": 1})
    assert config.threshold == "50" and config.alpha == 1.0


def test_algorithm_options_and_round_trip() -> None:
    config = RunConfig.from_run_config({"prox-mu": 0.01, "num-server-rounds": 3})
    assert config.option("prox-mu", 0.001) == 0.01
    assert config.option("dyn-alpha", 0.01) == 0.01
    assert config.to_run_config()["num-server-rounds"] == 3
    assert [config.is_eval_round(r) for r in (1, 2, 3)] == [True, True, True]


def test_eval_every_includes_last_round() -> None:
    config = RunConfig.from_run_config({"eval-every": 4, "num-server-rounds": 10})
    assert [r for r in range(1, 11) if config.is_eval_round(r)] == [4, 8, 10]
