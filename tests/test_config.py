"""Bad input fails before any work, with a message naming the key and what is allowed."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import torch

from clients.fedprox import FedProxOptions
from fedreg_app.core.checkpoint import Checkpoint
from fedreg_app.core.config import MAX_SEED, ONE_LAYER_HEADS, ConfigError
from fedreg_app.core.data import DatasetInfo
from fedreg_app.core.models import initial_model
from fedreg_app.registry import ALGORITHMS, CATALOG, declared_keys, get_algorithm, load_config
from tests.inprocess import results, run_server


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("algo", "fedfoo", "ditto, fedala, fedas, fedavg, fedavg-ft, fedavg2rep, fedbabu"),
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
        load_config({key: value})
    message = str(caught.value)
    assert message.startswith(f"{key}=")
    assert allowed in message


def test_dataset_path_without_parquet_files_is_rejected(tmp_path) -> None:
    (tmp_path / "test.parquet").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"dataset-path=.*train\.parquet not found"):
        load_config({"dataset-path": str(tmp_path)})
    (tmp_path / "train.parquet").write_bytes(b"")  # a train split alone is a dataset
    load_config({"dataset-path": str(tmp_path)})


def test_wrong_type_is_rejected() -> None:
    with pytest.raises(ConfigError, match="num-server-rounds"):
        load_config({"num-server-rounds": "ten"})


def test_defaults_are_the_papers_setup() -> None:
    config = load_config({})
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
    config = load_config({"threshold": 50, "alpha": 1})
    assert config.threshold == "50" and config.alpha == 1.0


def test_algorithm_options_are_typed_and_round_trip() -> None:
    config = load_config({"algo": "fedprox", "prox-mu": 0.01, "num-server-rounds": 3})
    assert config.options == FedProxOptions(mu=0.01)
    assert config.to_run_config()["prox-mu"] == 0.01
    assert config.to_run_config()["num-server-rounds"] == 3
    assert load_config(config.to_run_config()) == config
    assert [config.is_eval_round(r) for r in (1, 2, 3)] == [True, True, True]


def test_eval_every_includes_last_round() -> None:
    config = load_config({"eval-every": 4, "num-server-rounds": 10})
    assert [r for r in range(1, 11) if config.is_eval_round(r)] == [4, 8, 10]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        # keys only client procedures read: before, every client failed and the run was
        # written "completed"
        ("prox-mu", "x", "prox-mu='x' is not allowed: expected a number"),
        ("ditto-lambda", -5, "ditto-lambda=-5.0 is not allowed: expected a number >= 0"),
        ("personal-epochs", 0, "personal-epochs=0 is not allowed: expected an integer >= 1"),
        ("dyn-alpha", 0.0, "dyn-alpha=0.0 is not allowed: expected a number > 0"),
        ("fedreg-private-head", "yes", "fedreg-private-head='yes' is not allowed"),
        ("fedseq-unfreeze-rounds", "1;4", "fedseq-unfreeze-rounds='1;4' is not allowed"),
        (
            "participation-gamma",
            float("nan"),
            "participation-gamma=nan is not allowed: expected a finite",
        ),
        ("lr", float("inf"), "lr=inf is not allowed: expected a finite number"),
        ("seed", -1, "seed=-1 is not allowed: expected an integer from 0 to"),
        ("seed", 2**63, f"seed={2**63} is not allowed: expected an integer from 0 to"),
        ("seed", 1.5, "seed=1.5 is not allowed: expected an integer"),
    ],
)
def test_every_key_is_checked_before_any_work_whatever_the_algorithm(
    key: str, value: object, message: str
) -> None:
    """Each algorithm's keys are checked even when another algorithm runs: a value that
    cannot work is an error, not a silent default."""
    for algo in ("fedavg", "fedreg"):
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config({"algo": algo, key: value})


def test_an_unknown_key_gets_the_closest_declared_keys() -> None:
    with pytest.raises(ConfigError, match="'pxor-mu' is not a key.*did you mean 'prox-mu'"):
        load_config({"pxor-mu": 0.1})
    with pytest.raises(ConfigError, match="'banana' is not a key of the run config \\("):
        load_config({"banana": 1})


def test_options_that_depend_on_other_keys_are_checked_at_load() -> None:
    with pytest.raises(ConfigError, match="fedseq-finetune-rounds=3 is not allowed"):
        load_config({"algo": "fedseq-anti", "num-server-rounds": 3, "fedseq-finetune-rounds": 3})
    with pytest.raises(ConfigError, match="eval-every=2 is not allowed with"):
        load_config({"algo": "fedbabu-deviation", "eval-every": 2})


def test_pyproject_declares_exactly_the_keys_and_defaults_of_the_code() -> None:
    """Each default lives in one place in the code (the options dataclass or RunConfig);
    pyproject.toml, which flwr reads, must say the same."""
    declared = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert declared_keys() == declared["tool"]["flwr"]["app"]["config"]


# --- head-depth = "auto": each algorithm's own split ----------------------------------------

BASELINES = sorted(set(ALGORITHMS) - {"fedreg"})


def test_head_depth_auto_is_fedregs_two_layers_and_every_baselines_one() -> None:
    """FedReG keeps two Linear layers (thesis §5.5); every other algorithm is cut at the
    last Linear, as PFLlib cuts them at ``model.fc``. The resolved int is what
    results.json and a checkpoint see; ``given`` keeps "auto"."""
    assert load_config({}).head_depth == 2
    for variant in ({"fedreg-private-head": False}, {"fedreg-head-weight": "original"}):
        assert load_config({"algo": "fedreg", **variant}).head_depth == 2  # the ablations
    assert {"fedrod", "fedper", "fedavg", "fedrep", "fedbabu", "gpfl"} <= set(BASELINES)
    for algo in BASELINES:
        config = load_config({"algo": algo, "head-depth": "auto"})
        assert config.head_depth == 1, algo
        assert config.to_run_config()["head-depth"] == 1
        assert config.given["head-depth"] == "auto"
        assert load_config(config.to_run_config()) == config


@pytest.mark.parametrize("model", sorted(ONE_LAYER_HEADS))
def test_head_depth_auto_is_one_for_models_with_a_one_layer_head(model: str) -> None:
    assert load_config({"algo": "fedreg", "model": model}).head_depth == 1


@pytest.mark.parametrize("algo", ["fedreg", "fedrod", "fedseq-vanilla"])
@pytest.mark.parametrize("depth", [1, 2, 3, 2.0])
def test_explicit_head_depth_is_kept_whatever_the_algorithm(algo: str, depth: float) -> None:
    config = load_config({"algo": algo, "head-depth": depth, "num-server-rounds": 4})
    assert config.head_depth == int(depth) and isinstance(config.head_depth, int)
    assert config.to_run_config()["head-depth"] == int(depth)


@pytest.mark.parametrize("value", ["x", "2", 0, 4, 2.5, True, float("nan")])
def test_bad_head_depth_names_the_key_and_the_allowed_values(value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config({"algo": "fedrod", "head-depth": value})
    message = str(caught.value)
    assert message.startswith("head-depth=")
    assert "'auto'" in message and "(1, 2, 3)" in message


def test_fedrods_built_model_has_a_one_linear_head_and_fedregs_two() -> None:
    info = DatasetInfo(num_classes=4, channels=1, height=28, width=28)

    def linears(module: torch.nn.Module) -> int:
        return sum(isinstance(m, torch.nn.Linear) for m in module.modules())

    fedrod = initial_model(info, load_config({"algo": "fedrod"}), private_head=True)
    assert linears(fedrod.head_g) == 1 and linears(fedrod.head_p) == 1
    assert linears(fedrod.base) == 2  # the ConvNet's fc1 and fc2 stay in the base
    fedreg = initial_model(info, load_config({"algo": "fedreg"}), private_head=True)
    assert linears(fedreg.head_g) == 2 and linears(fedreg.head_p) == 2


@pytest.mark.parametrize("algo", ["fedseq-vanilla", "fedseq-anti", "fedbabu", "fedbabu-deviation"])
def test_a_resume_keeps_the_rounds_an_algorithm_lays_its_schedule_over(algo: str) -> None:
    """FedSeq stopped at round 3 of 5 and resumed with 10 rounds unfroze its layers at
    rounds [1, 2] then [5, 7]: two schedules in one run, recorded as the 10-round setting.
    Such algorithms keep num-server-rounds on resume; others may still extend a run."""
    extra = {"deviation-finetune-rounds": 1} if algo == "fedbabu-deviation" else {}
    made_with = load_config({"algo": algo, "num-server-rounds": 5, **extra})
    checkpoint = Checkpoint(3, {}, {}, {}, "k", made_with.to_run_config())
    fixed = get_algorithm(algo).resume_fixed
    assert fixed == ("num-server-rounds",)
    checkpoint.check_compatible(made_with, fixed)
    with pytest.raises(ConfigError, match=f"num-server-rounds=10 is not allowed.*{algo} lays"):
        checkpoint.check_compatible(
            load_config({"algo": algo, "num-server-rounds": 10, **extra}), fixed
        )
    fedavg = Checkpoint(3, {}, {}, {}, "k", load_config({"algo": "fedavg"}).to_run_config())
    longer = load_config({"algo": "fedavg", "num-server-rounds": 10})
    fedavg.check_compatible(longer, get_algorithm("fedavg").resume_fixed)


def test_resuming_a_checkpoint_of_another_head_depth_is_refused() -> None:
    """A baseline checkpoint made before "auto" (head-depth 2) is not the same model."""
    made_with = load_config({"algo": "fedrod", "head-depth": 2, "num-server-rounds": 5})
    checkpoint = Checkpoint(3, {}, {}, {}, "k", made_with.to_run_config())
    checkpoint.check_compatible(load_config({"algo": "fedrod", "head-depth": 2,
                                             "num-server-rounds": 8}))  # fmt: skip
    with pytest.raises(ConfigError, match="head-depth=1 is not allowed.*head-depth=2"):
        checkpoint.check_compatible(load_config({"algo": "fedrod", "num-server-rounds": 8}))


def test_a_record_of_an_earlier_version_is_compared_and_replayed_as_it_ran(tmp_path) -> None:
    """A key added since a run was recorded, whose default is not what that run did, must
    not let the old record pass for today's default: before 0.3.0 every Dirichlet
    partition was drawn without balancing, so a record without `dirichlet-balance` is of
    another setting than today's default, and its replay draws as it did."""
    from fedreg_app.core.config import as_ran, setting_differences
    from fedreg_tools.replay import Recording, replay_config

    today = load_config({}).to_run_config()
    earlier = {k: v for k, v in today.items() if k != "dirichlet-balance"}
    differ = ["dirichlet-balance=True, not False"]
    assert setting_differences(today, earlier, CATALOG) == differ
    assert setting_differences({**today, "dirichlet-balance": False}, earlier, CATALOG) == []
    assert as_ran(earlier, CATALOG)["dirichlet-balance"] is False and as_ran(
        today, CATALOG) == {**as_ran(today, CATALOG), "dirichlet-balance": True}  # fmt: skip
    recording = Recording(tmp_path / "results.json", earlier, 4, [], {})
    config, notes = replay_config(recording, {}, tmp_path, declared_keys())
    assert config["dirichlet-balance"] is False
    said = "dirichlet-balance is not recorded: the version that made the run had no such key"
    assert any(n.startswith(said) and "ran as dirichlet-balance=False" in n for n in notes)


def test_an_earlier_meaning_is_read_only_where_the_key_can_matter() -> None:
    """A shard or natural partition's earlier record must not be read as
    `dirichlet-balance = false` (a key that cannot change it): its resume would be refused
    and its finished run taken for another setting; nor may a FedAvg record get FedBABU's
    `finetune-when`. The algorithm keys apply to the algorithms that declare them, and
    the shared config names no algorithm."""
    from fedreg_app.core.config import (
        EARLIER_MEANING,
        RunConfig,
        as_ran,
        earlier_meanings,
        setting_differences,
    )

    assert not set(EARLIER_MEANING) - set(RunConfig.core_keys())
    for key in earlier_meanings(CATALOG).keys() - EARLIER_MEANING.keys():
        declaring = {name for name, a in ALGORITHMS.items() if key in a.options.declared()}
        applying = {name for name in ALGORITHMS if key in as_ran({"algo": name}, CATALOG)}
        assert declaring == applying and declaring, key
    shard = {"algo": "fedavg", "partition": "shard", "seed": 0}
    assert "dirichlet-balance" not in as_ran(shard, CATALOG)
    assert "finetune-when" not in as_ran(shard, CATALOG)
    today = {**shard, "dirichlet-balance": True}
    assert setting_differences(today, shard, CATALOG) == []
    assert as_ran({"algo": "fedbabu"}, CATALOG)["finetune-when"] == "every-eval"
    assert as_ran({"algo": "fedbabu-deviation"}, CATALOG).get("finetune-when") is None
    assert as_ran({}, CATALOG)["fedreg-schedule"] == "sequential"  # fedreg by default
    assert as_ran({"algo": "fedavg"}, CATALOG)["dirichlet-balance"] is False  # dirichlet
    assert as_ran(shard, CATALOG)["drop-last"] is False  # every algorithm, every partition
    assert RunConfig().drop_last is True
    assert as_ran(shard, CATALOG)["flush-denormals"] is False  # full IEEE arithmetic
    assert RunConfig().flush_denormals is True


def test_the_largest_seed_allowed_runs_through_flowers_wire(
    grey_dataset: Path, tmp_path: Path
) -> None:
    """``MAX_SEED`` is where the bound is because the seed must cross Flower's messages
    (signed 64-bit) and reach every draw (the partition, sampling, the model's
    initialisation, augmentation): a FedReG round with it completes; one above is refused
    before any work (its failed record says why)."""
    config = {
        "algo": "fedreg", "dataset-path": str(grey_dataset), "local-epochs": 1,
        "fraction-train": 0.5, "min-partition-size": 5, "num-server-rounds": 1,
        "seed": MAX_SEED, "results-dir": str(tmp_path / "largest"),
    }  # fmt: skip
    _, stopped = run_server(config)
    assert stopped is None
    document = results(tmp_path / "largest")
    assert document["config"]["seed"] == MAX_SEED and document["run"]["status"] == "completed"
    _, stopped = run_server({**config, "seed": MAX_SEED + 1, "results-dir": str(tmp_path / "x")})
    assert isinstance(stopped, ConfigError) and f"seed={MAX_SEED + 1} is not" in str(stopped)
    refused = results(tmp_path / "x")
    assert refused["run"]["status"] == "failed" and refused["rounds"] == []
