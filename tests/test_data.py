"""Partition: merged pool, Dirichlet by label, seeded 75/25 split, union test set."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from fedreg_app.core.config import ConfigError
from fedreg_app.core.data import (
    DECODED_CACHE_MIB,
    ClientData,
    DataError,
    DecodedPartitions,
    PartitionKey,
    check_label_range,
    client_splits,
    data_cache_folder,
    decode_client_data,
    digests_and_unions,
    federated_dataset,
    load_client_data,
    load_info,
    load_union_split,
    load_union_test_set,
    node_data,
    split_digests,
    split_sizes,
)
from fedreg_app.registry import load_config
from tests.fake_data import copy_dataset, write_image_dataset
from tests.inprocess import results, run_server


def key_for(path: Path, num_partitions: int = 4, **overrides) -> PartitionKey:
    run_config = {"dataset-path": str(path), "min-partition-size": 5, **overrides}
    return PartitionKey.from_config(load_config(run_config), num_partitions)


def test_info_from_features_grey_and_colour(grey_dataset: Path, colour_dataset: Path) -> None:
    grey, colour = load_info(key_for(grey_dataset)), load_info(key_for(colour_dataset))
    assert (grey.channels, grey.height, grey.width, grey.num_classes) == (1, 28, 28, 10)
    assert (colour.channels, colour.height, colour.width) == (3, 32, 32)


def test_split_is_75_25_and_union_is_all_test_splits(grey_dataset: Path) -> None:
    key = key_for(grey_dataset)
    clients = [load_client_data(key, pid) for pid in range(4)]
    total = sum(len(c.train) + len(c.test) for c in clients)
    assert total == 400  # train and test splits of the dataset are merged, nothing lost
    for c in clients:
        n = len(c.train) + len(c.test)
        assert len(c.train) > 0 and len(c.test) > 0
        assert abs(len(c.test) - 0.25 * n) <= 1
        assert c.train.x.dtype == torch.uint8 and c.train.x.shape[1:] == (1, 28, 28)
    union = load_union_test_set(key)
    assert len(union) == sum(len(c.test) for c in clients)
    assert torch.equal(union.y, torch.cat([c.test.y for c in clients]))


def test_the_digest_pass_keeps_the_unions_a_serverapp_asks_for(grey_dataset: Path) -> None:
    """One decoding gives the digests and the unions, equal to decoding them apart (the
    centralised ServerApp trains on the train union, a server evaluation needs the test's)."""
    key = key_for(grey_dataset)
    digests, unions = digests_and_unions(key, ("train", "test"))
    assert digests == split_digests(key)
    for part in ("train", "test"):
        apart = load_union_split(key, part)
        assert torch.equal(unions[part].x, apart.x) and torch.equal(unions[part].y, apart.y)
    assert digests_and_unions(key)[1] == {}  # nothing kept unless asked
    with pytest.raises(ValueError, match="no such split to keep: \\['valid'\\]"):
        digests_and_unions(key, ("valid",))


def test_dirichlet_skews_labels(grey_dataset: Path) -> None:
    key = key_for(grey_dataset, alpha=0.1)
    counts = torch.stack([load_client_data(key, pid).train.class_counts(10) for pid in range(4)])
    # With alpha 0.1 most classes concentrate on one client.
    assert (counts.max(dim=0).values.float() / counts.sum(dim=0).clamp(min=1)).mean() > 0.6


def test_same_seed_same_partition_other_seed_differs(grey_dataset: Path) -> None:
    first = load_client_data(key_for(grey_dataset, seed=1), 2)
    load_client_data.cache_clear()
    again = load_client_data(key_for(grey_dataset, seed=1), 2)
    other = load_client_data(key_for(grey_dataset, seed=2), 2)
    assert torch.equal(first.train.x, again.train.x) and torch.equal(first.test.y, again.test.y)
    assert len(other.train) != len(first.train) or not torch.equal(other.train.y, first.train.y)


def test_content_digests_follow_the_decoded_samples_not_the_files(
    grey_dataset: Path, tmp_path: Path
) -> None:
    """What clients train on decides: a copy with other row groups, or with every image
    saved again as another PNG (other bytes, the same pixels), keeps every partition's
    digest; one image with one pixel changed, at the same sizes and labels, changes
    exactly the digest of the partition that holds it."""
    digests = split_digests(key_for(grey_dataset))
    assert len(digests) == 4 and all(len(d) == 64 for d in digests.values())
    assert len(set(digests.values())) == 4
    copied = copy_dataset(grey_dataset, tmp_path / "copy", row_group_size=7)
    assert split_digests(key_for(copied)) == digests
    recompressed = copy_dataset(grey_dataset, tmp_path / "recompressed", recompress=True)
    images = [pq.read_table(folder / "train.parquet").column("image").to_pylist()
              for folder in (grey_dataset, recompressed)]  # fmt: skip
    assert all(a["bytes"] != b["bytes"] for a, b in zip(*images, strict=True))
    assert split_digests(key_for(recompressed)) == digests
    repainted = copy_dataset(grey_dataset, tmp_path / "repainted", repaint=5)
    assert split_sizes(key_for(repainted)) == split_sizes(key_for(grey_dataset))
    changed = [p for p, d in split_digests(key_for(repainted)).items() if d != digests[p]]
    assert len(changed) == 1


def test_alternative_column_names_are_found(tmp_path: Path) -> None:
    folder = write_image_dataset(
        tmp_path / "c100", image_column="img", label_column="fine_label", n_train=80, n_test=20
    )
    data = load_client_data(key_for(folder, num_partitions=2, alpha=1.0), 0)
    assert len(data.train) > 0


def test_unrecognisable_label_column_is_a_clear_error(tmp_path: Path) -> None:
    import pandas as pd

    folder = tmp_path / "bad"
    folder.mkdir()
    frame = pd.DataFrame({"pixels": [b"x"] * 4, "target": [0, 1, 0, 1]})
    for split in ("train", "test"):
        frame.to_parquet(folder / f"{split}.parquet")
    with pytest.raises(ConfigError, match="no recognisable image column"):
        load_info(key_for(folder, num_partitions=2))


def test_more_clients_than_the_pool_can_fill_fail_at_once(grey_dataset: Path) -> None:
    """50 clients of at least 50 samples need 2,500; the pool holds 400: arithmetic says
    so before any Dirichlet draw (none is tried), with the keys and what would fit."""
    key = key_for(grey_dataset, num_partitions=50, **{"min-partition-size": 50})
    message = ("min-partition-size=50 for each of 50 clients needs 2,500 samples, but the "
               "pool holds 400 (data-fraction=1): use at most 8 clients, or a "
               "min-partition-size of at most 8")  # fmt: skip
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_client_data(key, 0)
    assert federated_dataset(key).partitioners["train"].redraws == 0


def test_a_skew_no_draw_can_fill_names_alpha_and_min_partition_size(grey_dataset: Path) -> None:
    """Enough samples in all, but Dirichlet(0.01) leaves some client short in every draw."""
    key = key_for(grey_dataset, num_partitions=4, alpha=0.01, **{"min-partition-size": 99})
    with pytest.raises(ConfigError, match="alpha=0.01, min-partition-size=99"):
        load_client_data(key, 0)


def test_splits_that_declare_other_classes_are_named(tmp_path: Path) -> None:
    """A test split whose ClassLabel names more classes than the train split's would be
    merged under the train split's count, its extra labels out of range."""
    write_image_dataset(tmp_path / "a", n_train=40, n_test=20, num_classes=10)
    write_image_dataset(tmp_path / "b", n_train=40, n_test=20, num_classes=13, seed=1)
    shutil.copy(tmp_path / "b" / "test.parquet", tmp_path / "a" / "test.parquet")
    message = "train.parquet: column 'label', 10 classes; test.parquet: column 'label', 13"
    with pytest.raises(DataError, match=message):
        load_client_data(key_for(tmp_path / "a", num_partitions=2), 0)


def test_a_label_outside_the_declared_classes_names_the_column() -> None:
    check_label_range(torch.tensor([0, 9, 3]), 10)  # in range: nothing to say
    with pytest.raises(DataError, match="label 12 in the dataset's 'label' column is outside "
                       "the 10 classes its ClassLabel declares"):  # fmt: skip
        check_label_range(torch.tensor([0, 12, 3]), 10)


def test_data_fraction_keeps_a_seeded_subset_of_the_pool(grey_dataset: Path) -> None:
    def total(key: PartitionKey) -> int:
        return sum(len(client_splits(key, pid)["train"]) + len(client_splits(key, pid)["test"])
                   for pid in range(2))  # fmt: skip

    full = key_for(grey_dataset, num_partitions=2, alpha=100.0)
    quarter = key_for(grey_dataset, num_partitions=2, alpha=100.0, **{"data-fraction": 0.25})
    assert total(full) == 400 and total(quarter) == 100  # 300 train + 100 test pooled
    again = load_client_data(quarter, 0)
    load_client_data.cache_clear()
    client_splits.cache_clear()
    assert torch.equal(load_client_data(quarter, 0).train.y, again.train.y)
    with pytest.raises(ConfigError, match="data-fraction=1.5"):
        load_config({"data-fraction": 1.5})


def test_shard_partition_holds_c_classes_per_client(grey_dataset: Path) -> None:
    key = key_for(grey_dataset, **{"partition": "shard", "shard-classes": 2})
    for pid in range(4):
        labels = client_splits(key, pid)
        classes = set(labels["train"]["label"]) | set(labels["test"]["label"])
        assert len(classes) == 2
    with pytest.raises(ConfigError, match="partition='iid' is not allowed"):
        load_config({"partition": "iid"})


def test_dirichlet_topup_keeps_the_skew_and_gives_everyone_the_minimum() -> None:
    from fedreg_app.core.partitioners import dirichlet_topup

    labels = np.repeat(np.arange(10), 120)  # 1200 samples, 10 classes
    parts = dirichlet_topup(labels, 20, alpha=0.1, min_size=4, seed=3)
    sizes = [len(p) for p in parts]
    assert min(sizes) >= 4 and sum(sizes) == 1200
    assert len(set(np.concatenate(parts).tolist())) == 1200  # a partition of the samples
    dominant = [np.bincount(labels[p], minlength=10).max() / len(p) for p in parts]
    assert np.median(dominant) > 0.5  # still label-skewed (uniform: 0.1)
    again = dirichlet_topup(labels, 20, alpha=0.1, min_size=4, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_dirichlet_topup_through_flwr_datasets(grey_dataset: Path) -> None:
    key = key_for(grey_dataset, num_partitions=40, **{"partition": "dirichlet-topup"})
    sizes = [len(client_splits(key, pid)["train"]) + len(client_splits(key, pid)["test"])
             for pid in range(40)]  # fmt: skip
    assert min(sizes) >= 5 and sum(sizes) == 400


def class_counts_of(key: PartitionKey, clients: int) -> np.ndarray:
    """Per client, its partition's samples of each class (train and test splits)."""
    return np.stack([
        np.bincount(np.concatenate([np.asarray(client_splits(key, pid)[split]["label"])
                                    for split in ("train", "test")]), minlength=10)
        for pid in range(clients)
    ])  # fmt: skip


def shares_given_above_the_mean(counts: np.ndarray) -> int:
    """How often a client got a share of a class while it already held more than the
    mean partition size (classes are split in label order): the PFNM rule forbids it."""
    before = np.cumsum(counts, axis=1) - counts  # its size when each class was split
    return int(((counts > 0) & (before > counts.sum() / len(counts))).sum())


@pytest.mark.parametrize("partition", ["dirichlet", "dirichlet-topup"])
def test_dirichlet_balance_gives_no_class_to_a_client_above_the_mean(
    grey_dataset: Path, partition: str
) -> None:
    """`dirichlet-balance` (default true): the PFNM partition code the thesis cites for
    its Dirichlet split ([38]; PFLlib's alike) stops giving classes to clients already
    above the mean size. Versions before 0.3.0 drew without it."""
    clients = 8
    keys = {balance: key_for(grey_dataset, clients, alpha=0.1, partition=partition,
                             **{"dirichlet-balance": balance, "min-partition-size": 2})
            for balance in (True, False)}  # fmt: skip
    assert load_config({"dataset-path": str(grey_dataset)}).dirichlet_balance is True
    balanced, unbalanced = (class_counts_of(keys[b], clients) for b in (True, False))
    assert balanced.sum() == unbalanced.sum() == 400
    assert shares_given_above_the_mean(balanced) == 0
    assert shares_given_above_the_mean(unbalanced) > 0  # the rule is what tells them apart
    federated_dataset.cache_clear()  # drawn again: the same split from the same seed
    assert class_counts_of(keys[True], clients).tolist() == balanced.tolist()


def test_cifar100_layout_uses_the_fine_labels(cifar100_like: Path) -> None:
    key = key_for(cifar100_like, num_partitions=2, alpha=100.0)
    info = load_info(key)
    assert (info.num_classes, info.channels, info.height) == (20, 3, 32)
    assert int(load_client_data(key, 0).train.y.max()) >= 5  # fine labels, not the 5 coarse


def test_tiny_imagenet_layout_valid_split_and_mixed_grey(tiny_imagenet_like: Path) -> None:
    key = key_for(tiny_imagenet_like, num_partitions=2, alpha=100.0)
    info = load_info(key)
    assert (info.channels, info.height, info.width) == (3, 64, 64)  # grey images -> RGB
    client = load_client_data(key, 1)
    assert client.train.x.shape[1:] == (3, 64, 64) and client.test.x.shape[1:] == (3, 64, 64)
    assert len(load_union_test_set(key)) + sum(len(load_client_data(key, p).train)
                                               for p in range(2)) == 400  # fmt: skip


def test_emnist_letters_layout_has_26_grey_classes(emnist_letters_like: Path) -> None:
    info = load_info(key_for(emnist_letters_like, num_partitions=2, alpha=100.0))
    assert (info.num_classes, info.channels, info.height, info.width) == (26, 1, 28, 28)
    assert info.modality == "image"


def shakespeare_key(path: Path, num_partitions: int = 4, **overrides) -> PartitionKey:
    return key_for(path, num_partitions, partition="natural", **overrides)


def test_shakespeare_is_text_over_leaf_vocabulary(shakespeare_like: Path) -> None:
    info = load_info(shakespeare_key(shakespeare_like))
    assert (info.modality, info.num_classes, info.width) == ("text", 80, 80)
    client = load_client_data(shakespeare_key(shakespeare_like), 0)
    assert client.train.x.dtype == torch.int16 and client.train.x.shape[1] == 80
    assert int(client.train.x.max()) < 80 and int(client.train.y.max()) < 80


def test_natural_partition_is_one_speaker_per_client_seeded(shakespeare_like: Path) -> None:
    import pandas as pd

    frame = pd.read_parquet(shakespeare_like / "train.parquet")
    per_speaker = frame.groupby("character_id").size().to_dict()
    key = shakespeare_key(shakespeare_like, num_partitions=4, seed=3)
    chosen = []
    for pid in range(4):
        split = client_splits(key, pid)
        speakers = set(split["train"]["natural_id"]) | set(split["test"]["natural_id"])
        assert len(speakers) == 1  # every sample of a client is its one speaker's
        (speaker,) = speakers
        assert len(split["train"]) + len(split["test"]) == per_speaker[speaker]  # all of them
        chosen.append(speaker)
    assert len(set(chosen)) == 4  # 4 of the 6 speakers, each once
    again = shakespeare_key(shakespeare_like, num_partitions=4, seed=3)
    client_splits.cache_clear()
    assert set(client_splits(again, 0)["train"]["natural_id"]) == {chosen[0]}


def test_natural_partition_errors_name_the_keys(shakespeare_like: Path) -> None:
    with pytest.raises(ConfigError, match="min-partition-size=55"):
        client_splits(shakespeare_key(shakespeare_like, **{"min-partition-size": 55}), 0)
    with pytest.raises(ConfigError, match="partition='dirichlet' is not allowed"):
        load_info(key_for(shakespeare_like, partition="dirichlet"))


def test_encode_text_reads_unknown_characters_as_space() -> None:
    from fedreg_app.core.data import VOCABULARY, encode_text

    codes = encode_text(["ab\u00e6}", "\n A?"])
    space = VOCABULARY.index(" ")
    assert codes.tolist() == [
        [VOCABULARY.index("a"), VOCABULARY.index("b"), space, VOCABULARY.index("}")],
        [0, space, VOCABULARY.index("A"), VOCABULARY.index("?")],
    ]


def write_idx(path: Path, array: np.ndarray) -> None:
    """NIST's IDX format, gzip-compressed: magic, dimensions, unsigned bytes."""
    import gzip

    header = (0x800 + array.ndim).to_bytes(4, "big")
    header += b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


def test_emnist_idx_files_become_an_upright_hub_layout_dataset(tmp_path: Path) -> None:
    from fedreg_tools.convert import main

    source = tmp_path / "gzip"
    source.mkdir()
    rng = np.random.default_rng(0)
    for part, count in (("train", 60), ("test", 20)):
        images = np.zeros((count, 28, 28), dtype=np.uint8)
        images[:, 2, 20] = 255  # stored transposed: upright, this is row 20, column 2
        write_idx(source / f"emnist-balanced-{part}-images-idx3-ubyte.gz", images)
        labels = rng.integers(0, 5, size=count)
        write_idx(source / f"emnist-balanced-{part}-labels-idx1-ubyte.gz", labels)
    (source / "emnist-balanced-mapping.txt").write_text("0 48\n1 49\n2 65\n3 66\n4 97\n")
    assert main(["emnist", str(source), str(tmp_path / "out"), "--split", "balanced"]) == 0
    key = key_for(tmp_path / "out", num_partitions=2, alpha=100.0)
    info = load_info(key)
    assert (info.num_classes, info.channels, info.height, info.width) == (5, 1, 28, 28)
    image = load_client_data(key, 0).train.x[0, 0]
    assert image[20, 2] == 255 and image[2, 20] == 0
    names = (
        pytest.importorskip("datasets")
        .load_dataset("parquet", data_files=str(tmp_path / "out" / "test.parquet"))["train"]
        .features["label"]
        .names
    )
    assert names == ["0", "1", "A", "B", "a"]


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("one label short", "holds 20 images but"),
        ("a label past the mapping", "labels 0..9 but the mapping names 5 classes"),
        ("a truncated header", "shorter than an IDX header"),
    ],
)
def test_damaged_emnist_files_are_named_and_leave_the_target_as_it_was(
    tmp_path: Path, capsys, damage: str, named: str
) -> None:
    """Each of these damages stops the conversion naming its file (not a raw traceback of
    ArrowInvalid, a ClassLabel error or a negative offset), and both parts are read before
    train.parquet is written, so a damaged test part leaves the old train in place."""
    from fedreg_tools.convert import main

    source, target = tmp_path / "gzip", tmp_path / "out"
    source.mkdir()
    target.mkdir()
    (target / "train.parquet").write_bytes(b"the old one")
    for part, count in (("train", 60), ("test", 20)):
        images = np.zeros((count, 28, 28), dtype=np.uint8)
        labels = np.arange(count) % 5
        if part == "test" and damage == "one label short":
            labels = labels[:-1]
        if part == "test" and damage == "a label past the mapping":
            labels[3] = 9
        write_idx(source / f"emnist-balanced-{part}-images-idx3-ubyte.gz", images)
        write_idx(source / f"emnist-balanced-{part}-labels-idx1-ubyte.gz", labels)
    (source / "emnist-balanced-mapping.txt").write_text("0 48\n1 49\n2 65\n3 66\n4 97\n")
    if damage == "a truncated header":
        import gzip

        (source / "emnist-balanced-test-images-idx3-ubyte.gz").write_bytes(
            gzip.compress(b"\x00\x00\x08\x03\x00")
        )
    with pytest.raises(SystemExit) as stopped:
        main(["emnist", str(source), str(target), "--split", "balanced"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert named in error and "emnist-balanced-test-" in error
    assert sorted(p.name for p in target.iterdir()) == ["train.parquet"]
    assert (target / "train.parquet").read_bytes() == b"the old one"


def test_decoded_partitions_stay_within_their_budget_and_decode_identically(
    grey_dataset: Path,
) -> None:
    """A simulation process serves many nodes: it keeps the most recently used decoded
    partitions up to a byte budget, and a partition decoded again is the same data."""
    key = key_for(grey_dataset, seed=3)
    first = [decode_client_data(key, pid) for pid in range(4)]
    sizes = [sum(t.x.nbytes + t.y.nbytes for t in (d.train, d.test)) for d in first]
    cache = DecodedPartitions(budget_mib=max(sizes) / 2**20)
    assert sum(sizes) > cache.budget_bytes
    for pid in (0, 1, 2, 3, 0):
        cache(key, pid)
    assert 1 <= len(cache) < 4 and cache.nbytes <= cache.budget_bytes
    assert cache(key, 0) is cache(key, 0)  # the newest is kept
    for pid, data in enumerate(first):
        again = cache(key, pid)
        for a, b in ((data.train, again.train), (data.test, again.test)):
            assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    tiny = DecodedPartitions(budget_mib=0)  # never less than the partition in use
    assert tiny(key, 1) is tiny(key, 1) and len(tiny) == 1


def test_the_decoded_cache_budget_changes_costs_not_results(
    grey_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FedReG with every partition kept decoded, and with none kept (each message decodes
    its partition again and rebuilds the rebalanced set from its seed): the same run."""
    config = {
        "algo": "fedreg", "dataset-path": str(grey_dataset), "local-epochs": 1,
        "fraction-train": 0.5, "min-partition-size": 5, "seed": 11, "num-server-rounds": 2,
    }  # fmt: skip
    runs = []
    for budget in ("1024", "0"):
        monkeypatch.setenv(DECODED_CACHE_MIB, budget)
        load_client_data.cache_clear()
        folder = tmp_path / f"budget-{budget}"
        _, stopped = run_server({**config, "results-dir": str(folder)})
        assert stopped is None
        rounds = results(folder)["rounds"]
        runs.append([(r["global_accuracy"], r["personal_accuracy"], r["client_accuracies"])
                     for r in rounds])  # fmt: skip
    assert runs[0] == runs[1]


def test_the_cache_of_a_replaced_dataset_is_deleted_and_no_other(tmp_path: Path) -> None:
    """A replaced dataset is decoded again into a new cache folder; the old folder, which
    would otherwise stay for ever (on a device, a decoded copy of the node's share each
    time), is deleted once the new one is made; another partitioning's folder (another seed) and a
    folder with no key file (an older version's) stay."""
    dataset, state_dir = tmp_path / "dataset", tmp_path / "state"
    write_image_dataset(dataset, seed=0)
    old_key, other_seed = key_for(dataset), key_for(dataset, seed=5)
    for key in (old_key, other_seed):
        node_data(key, 0, data_cache_folder(state_dir, key))
    old, kept = data_cache_folder(state_dir, old_key), data_cache_folder(state_dir, other_seed)
    unknown = state_dir / "data" / "from-an-older-version"
    unknown.mkdir()
    assert (old / "partition-0.npz").exists()
    shutil.rmtree(dataset)
    write_image_dataset(dataset, seed=1, n_train=280)
    new_key = key_for(dataset)
    node_data(new_key, 0, data_cache_folder(state_dir, new_key))
    folders = {p.name for p in (state_dir / "data").iterdir()}
    assert folders == {data_cache_folder(state_dir, new_key).name, kept.name, unknown.name}
    assert (kept / "partition-0.npz").exists()  # seed 5 of the old files: not this key's
    # the other seed's folder is of the replaced files too: it goes when that key is next read
    other_now = key_for(dataset, seed=5)
    node_data(other_now, 1, data_cache_folder(state_dir, other_now))
    assert not kept.exists()


def as_clients_read(path: Path, state_dir: Path, partition: int = 0) -> list[ClientData]:
    """A partition's data as a client gets it: from the process's cache and from the
    node's disk cache (state-dir); a client builds its key per message."""
    key = key_for(path)
    return [node_data(key, partition, None)[1],
            node_data(key, partition, data_cache_folder(state_dir, key))[1]]  # fmt: skip


def same_data(got: ClientData, want: ClientData) -> bool:
    return all(torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
               for a, b in ((got.train, want.train), (got.test, want.test)))  # fmt: skip


def test_a_dataset_replaced_at_the_same_path_is_decoded_again(tmp_path: Path) -> None:
    """Decoded partitions are cached in the process and on a node's disk (state-dir):
    a dataset re-downloaded or re-converted at the same path must not leave clients on
    the old images while the server reads the new ones."""
    dataset, state_dir = tmp_path / "dataset", tmp_path / "state"
    write_image_dataset(dataset, seed=0)
    old = as_clients_read(dataset, state_dir)
    shutil.rmtree(dataset)
    write_image_dataset(dataset, seed=1, n_train=280)
    expected = decode_client_data(
        key_for(write_image_dataset(tmp_path / "fresh", seed=1, n_train=280)), 0
    )
    for before, now in zip(old, as_clients_read(dataset, state_dir), strict=True):
        assert not torch.equal(now.train.y, before.train.y) or len(now.train) != len(before.train)
        assert same_data(now, expected)


def test_a_dataset_changed_in_place_at_the_same_size_is_decoded_again(tmp_path: Path) -> None:
    """Two training labels swapped in place (a relabelled copy, say): every file keeps
    its size, so only its modification time tells the caches the data changed."""
    from datasets import Dataset

    dataset, state_dir, fresh = tmp_path / "dataset", tmp_path / "state", tmp_path / "fresh"
    write_image_dataset(dataset, seed=0)
    old = [as_clients_read(dataset, state_dir, p) for p in range(4)]
    train = dataset / "train.parquet"
    rows = Dataset.from_parquet(str(train))
    labels = list(rows["label"])
    other = next(i for i, label in enumerate(labels) if label != labels[0])
    labels[0], labels[other] = labels[other], labels[0]
    shutil.copytree(dataset, fresh)
    relabelled = rows.remove_columns("label").add_column(
        "label", labels, feature=rows.features["label"]
    )
    relabelled.to_parquet(str(fresh / "train.parquet"))
    size, mtime = train.stat().st_size, train.stat().st_mtime_ns
    shutil.copyfile(fresh / "train.parquet", train)
    os.utime(train, ns=(mtime + 10**9, mtime + 10**9))  # a coarse clock still tells it apart
    assert train.stat().st_size == size
    changed = 0
    for partition in range(4):
        expected = decode_client_data(key_for(fresh), partition)
        now = as_clients_read(dataset, state_dir, partition)
        for before, got in zip(old[partition], now, strict=True):
            assert same_data(got, expected)
            changed += not same_data(before, expected)
    assert changed  # the swap reached some client's data


def test_a_conversion_failing_while_writing_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure while the second part is written leaves neither part's staged file in
    the target."""
    from fedreg_tools import convert

    source, target = tmp_path / "gzip", tmp_path / "out"
    source.mkdir()
    for part, count in (("train", 30), ("test", 10)):
        write_idx(source / f"emnist-digits-{part}-images-idx3-ubyte.gz",
                  np.zeros((count, 28, 28), dtype=np.uint8))  # fmt: skip
        write_idx(source / f"emnist-digits-{part}-labels-idx1-ubyte.gz", np.arange(count) % 10)
    write_part = convert.write_part

    def disk_full(images, labels, names, folder, part):  # noqa: ANN001, ANN202
        if part == "test":
            raise OSError(28, "No space left on device")
        return write_part(images, labels, names, folder, part)

    monkeypatch.setattr(convert, "write_part", disk_full)
    with pytest.raises(OSError, match="No space left"):
        convert.convert_emnist(source, target, "digits")
    assert list(target.iterdir()) == []
