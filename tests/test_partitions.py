"""Hive partitions (catalog/partitions.py): key=value directories as typed columns, in batches
and columns=, exactly once and resume; files outside the layout are named."""

from __future__ import annotations

import datetime
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from servers import BUCKET, s3, store_registry  # noqa: F401 - fixtures

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.catalog.partitions import NULL_VALUE, directory_guarantee, parse_partitions
from torch_dataloader_utils.read import filtering
from torch_dataloader_utils.storage.versions import FileEntry
from torch_dataloader_utils.testing import assert_resumes_exactly

PARTS = [(2023, "a b", 1.5), (2023, NULL_VALUE, 2.0), (2024, "x", 1.5), (2024, "x", 3.25)]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("hive")
    first = 0
    for index, (year, cat, rate) in enumerate(PARTS):
        directory = root / f"year={year}" / f"cat={cat.replace(' ', '%20')}" / f"rate={rate}"
        os.makedirs(directory, exist_ok=True)
        rows = 60 + 10 * index
        table = pa.table({"id": np.arange(first, first + rows), "x": np.arange(rows) * 1.0})
        pq.write_table(table, directory / f"part-{index}.parquet", row_group_size=25)
        first += rows
    return str(root)


def ids(batch: dict) -> tuple[int, ...]:
    return tuple(batch["id"].tolist())


def test_partition_columns_are_typed_and_in_batches(root):
    dataset = StructuredDataset(root, num_workers=0, partitioning="hive", batch_size=1000)
    schema = dataset._catalog.schema
    assert [(f.name, f.type) for f in schema][2:] == [("year", pa.int64()), ("cat", pa.string()), ("rate", pa.float64())]
    (batch,) = list(dataset)
    by_id = {i: (y, c, r) for i, y, c, r in zip(batch["id"].tolist(), batch["year"].tolist(), batch["cat"], batch["rate"].tolist())}
    assert by_id[0] == (2023, "a b", 1.5) and by_id[60] == (2023, None, 2.0) and by_id[len(by_id) - 1] == (2024, "x", 3.25)


def test_partition_columns_alone_and_with_others_in_columns(root):
    dataset = StructuredDataset(root, num_workers=0, partitioning="hive", batch_size=1000, columns=["year"])
    (batch,) = list(dataset)
    assert list(batch) == ["year"] and sorted(set(batch["year"].tolist())) == [2023, 2024] and len(batch["year"]) == 300
    (batch,) = list(StructuredDataset(root, num_workers=0, partitioning="hive", batch_size=1000, columns=["rate", "id"]))
    assert list(batch) == ["rate", "id"]


def test_without_partitioning_the_directories_are_not_columns(root):
    assert "year" not in StructuredDataset(root, num_workers=0)._catalog.schema.names


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_exactly_once_and_resume_at_every_point(root, workers, shuffle):
    def make():
        return StructuredDataset.create_dataloader(
            root, partitioning="hive", num_workers=workers, shuffle=shuffle, batch_size=40, chunk_rows=80, split_bytes=600, shuffle_buffer_rows=100,
            columns=["id", "year", "cat"],
        )  # fmt: skip

    assert len(make()[1].splits) >= 8

    def key(batch: dict) -> tuple:
        return ids(batch), tuple(batch["year"].tolist()), tuple(batch["cat"])

    reference = assert_resumes_exactly(make, epochs=1, batch_key=key)
    assert sorted(i for batch in reference.batches[0] for i in batch[0]) == list(range(300))


def _entries(*paths: str) -> list[FileEntry]:
    return [FileEntry(p, p, 1, None) for p in paths]


def test_values_are_typed_over_all_files():
    parts = parse_partitions(_entries("/r/d=2024-01-31/n=7/f", "/r/d=2024-02-01/n=-3/f", "/r/d=__HIVE_DEFAULT_PARTITION__/n=x/f"), ["/r"])
    assert parts.types == (pa.date32(), pa.string())
    assert parts.values["/r/d=2024-01-31/n=7/f"] == (datetime.date(2024, 1, 31), "7")
    assert parts.values["/r/d=__HIVE_DEFAULT_PARTITION__/n=x/f"] == (None, "x")
    guarantee = directory_guarantee(parts, "/r/d=__HIVE_DEFAULT_PARTITION__/n=x/f")
    assert guarantee.equals(pc.field("d").is_null() & (pc.field("n") == pa.scalar("x")))


def test_filters_on_partition_keys_prune_directories_unread(root, monkeypatch):
    """Files whose directories rule the filter out are neither counted nor read; where the
    directories alone decide, no file is opened to count; the rows are pyarrow's."""
    opened: list[str] = []
    count_file = filtering._count_file

    def recording(catalog, file, units, *args):
        if filtering.SOME in units:
            opened.append(catalog.files[file].url)
        return count_file(catalog, file, units, *args)

    monkeypatch.setattr(filtering, "_count_file", recording)
    everything = pq.read_table(root, partitioning="hive").to_pylist()
    cases = [
        ([("year", "=", 2024)], lambda row: row["year"] == 2024, 0),
        ([("year", "=", 2023), ("id", ">=", 100)], lambda row: row["year"] == 2023 and row["id"] >= 100, 1),
    ]  # (part-0 ends below id 100)
    for filters, keep, files_counted in cases:
        opened.clear()
        dataset = StructuredDataset(root, partitioning="hive", filters=filters, batch_size=16)
        got = sorted(i for batch in dataset for i in ids(batch))
        assert got == sorted(row["id"] for row in everything if keep(row)), filters
        assert len(opened) == files_counted and all("year=2023" in url for url in opened), opened


@pytest.mark.parametrize("paths", [("/r/a=1/f", "/r/f"), ("/r/a=1/f", "/r/b=1/f"), ("/r/a=1/f", "/r/a=1/loose/f")])
def test_a_file_outside_the_layout_is_named(paths):
    with pytest.raises(ValueError, match=f"{paths[1]} is outside the hive layout"):
        parse_partitions(_entries(*paths), ["/r"])


def test_a_stray_file_that_sorts_first_is_the_one_named():
    """The first file set the layout: a root file sorting first made the good file the culprit ('has .')."""
    with pytest.raises(ValueError, match=r"/r/b\.parquet is outside the hive layout .*no key=value directories, but /r/p=1/a\.parquet has p=\.\.\."):
        parse_partitions(_entries("/r/b.parquet", "/r/p=1/a.parquet"), ["/r"])


def test_a_partition_key_that_is_also_a_column_is_refused(tmp_path):
    os.makedirs(tmp_path / "id=1")
    pq.write_table(pa.table({"id": [1]}), tmp_path / "id=1" / "f.parquet")
    with pytest.raises(ValueError, match="'id' is both a column of the file and a partition") as error:
        StructuredDataset(str(tmp_path), num_workers=0, partitioning="hive")
    assert "f.parquet" in str(error.value) and "_options" not in str(error.value) and "damaged" not in str(error.value)


def test_partitioning_must_be_hive_or_none(root):
    with pytest.raises(ValueError, match="partitioning must be None or 'hive'"):
        StructuredDataset(root, num_workers=0, partitioning="directory")


def test_remote_hive_directories_on_s3(s3, root):
    for directory, _, names in os.walk(root):
        for name in names:
            relative = os.path.relpath(os.path.join(directory, name), root)
            with open(os.path.join(directory, name), "rb") as handle:
                s3.fs.pipe_file(f"{BUCKET}/hive/{relative}", handle.read())
    s3.fs.invalidate_cache()
    loader, _ = StructuredDataset.create_dataloader(
        s3.url("hive"), partitioning="hive", num_workers=2, batch_size=50, storage_options=s3.options, columns=["id", "year"]
    )
    batches = list(loader)
    assert sorted(i for batch in batches for i in ids(batch)) == list(range(300))
    assert {year for batch in batches for year in batch["year"].tolist()} == {2023, 2024}


def test_partition_integers_past_int64_stay_exact_as_strings(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from torch_dataloader_utils import StructuredDataset

    for key in ("1", "12345678901234567891"):
        (tmp_path / f"account={key}").mkdir()
        pq.write_table(pa.table({"id": [0]}), tmp_path / f"account={key}" / "p.parquet")
    dataset = StructuredDataset(str(tmp_path), partitioning="hive", num_workers=0, batch_size=2, output_format="dict")
    assert dataset.schema.field("account").type == pa.string()
    assert sorted(value for batch in dataset for value in batch["account"]) == ["1", "12345678901234567891"]


def test_an_integer_beyond_int64_keeps_its_key_a_string_also_beside_floats():
    """A float would round 12345678901234567891 (and make 1 read 1.0): the key is a string, exact."""
    big = "12345678901234567891"
    parts = parse_partitions(_entries(f"/r/a=1/b=1.5/c={2**63 - 1}/f", f"/r/a={big}/b=-{big}/c=-{2**63}/f"), ["/r"])
    assert parts.types == (pa.string(), pa.string(), pa.int64())
    assert parts.values[f"/r/a={big}/b=-{big}/c=-{2**63}/f"] == (big, f"-{big}", -(2**63))
    assert parts.values[f"/r/a=1/b=1.5/c={2**63 - 1}/f"] == ("1", "1.5", 2**63 - 1)


def test_digits_other_than_ascii_keep_a_key_a_string():
    """Python's int() takes '٣' and '１２'; pyarrow keeps them strings, so does this loader."""
    parts = parse_partitions(_entries("/r/k=3/f", "/r/k=٣/f", "/r/k=１２/f"), ["/r"])
    assert parts.types == (pa.string(),)
    assert sorted(v for (v,) in parts.values.values()) == sorted(["3", "٣", "１２"])


def test_a_null_partition_value_is_found_at_planning_naming_its_file(tmp_path):
    import pyarrow.parquet as pq

    from torch_dataloader_utils import StructuredDataset

    for key in ("1", "2", "__HIVE_DEFAULT_PARTITION__"):
        (tmp_path / f"k={key}").mkdir()
        pq.write_table(pa.table({"id": [0, 1]}), tmp_path / f"k={key}" / "a.parquet")
    for cache in (None, str(tmp_path / "cache"), str(tmp_path / "cache")):  # cold, then from the plan cache
        with pytest.raises(ValueError, match=r"column 'k' has 2 null value\(s\) in \S*k=__HIVE_DEFAULT_PARTITION__\S*a.parquet\n"):
            StructuredDataset(str(tmp_path), partitioning="hive", num_workers=0, cache_dir=cache)
    assert len(StructuredDataset(str(tmp_path), partitioning="hive", num_workers=0, nulls="fill")) == 6


def test_local_hive_footers_are_not_kept_and_the_plan_cache_types_new_directories(tmp_path):
    """Local hive files keep no footer in the plan (their reader reads it again), and the plan
    cache keeps each file's own schema: a directory added later that makes a key a string types
    the cached files' column as a string too."""
    data, cache = tmp_path / "data", str(tmp_path / "cache")
    for key in ("1", "2"):
        (data / f"k={key}").mkdir(parents=True)
        pq.write_table(pa.table({"id": [int(key) * 10, int(key) * 10 + 1]}), data / f"k={key}" / "a.parquet")
    first = StructuredDataset(str(data), partitioning="hive", num_workers=0, cache_dir=cache, batch_size=10)
    assert all(footer is None for footer in first._catalog.footers) and first._catalog.schema.field("k").type == pa.int64()
    assert os.listdir(os.path.join(cache, "plans"))
    (data / "k=x").mkdir()
    pq.write_table(pa.table({"id": [99]}), data / "k=x" / "a.parquet")
    loader, again = StructuredDataset.create_dataloader(str(data), partitioning="hive", num_workers=2, cache_dir=cache, batch_size=10)
    assert again._catalog.schema.field("k").type == pa.string()
    rows = sorted(pair for batch in loader for pair in zip(batch["id"].tolist(), batch["k"]))
    assert rows == [(10, "1"), (11, "1"), (20, "2"), (21, "2"), (99, "x")]
    plain = StructuredDataset(str(data), num_workers=0, cache_dir=cache)  # the same files without partitioning: no k
    assert plain._catalog.schema.names == ["id"]
