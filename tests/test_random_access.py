"""Random access (read/random_access.py through StructuredDataset): every key form against
pyarrow's own read of the files, the loader's batch form, errors, the units read, the cache,
and map-style use inside DataLoader workers."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest
import torch
from datagen import write_dataset
from servers import s3, store_registry  # noqa: F401 - fixtures
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler, SubsetRandomSampler

from torch_dataloader_utils import Ragged, StructuredDataset
from torch_dataloader_utils.formats import _parquet_range as parquet_range
from torch_dataloader_utils.formats import parquet
from torch_dataloader_utils.read import random_access

LAYOUT = [[120, 80], [150], [60, 90, 70], [110, 40]]
ROWS = sum(map(sum, LAYOUT))


@pytest.fixture(scope="module", params=["parquet", "parquet_paged", "orc"])
def data(request, tmp_path_factory):
    fmt = request.param
    root = tmp_path_factory.mktemp(fmt)
    write_dataset(root, LAYOUT, fmt.split("_")[0], paged=fmt.endswith("paged"))
    return str(root), fmt.split("_")[0]


def reference(dataset: StructuredDataset, fmt: str) -> pa.Table:
    """Every file read whole by pyarrow, in ``dataset.files`` order."""
    read = pq.read_table if fmt == "parquet" else orc.read_table
    return pa.concat_tables([read(path) for path in dataset.files])


def as_python(value) -> list:
    """A batch column as Python values per row."""
    if isinstance(value, Ragged):
        offsets = value.offsets.tolist()
        return [value.values[a:b].tolist() for a, b in zip(offsets, offsets[1:])]
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return list(value)


def assert_batch_is(batch: dict, expected: pa.Table) -> None:
    assert list(batch) == expected.column_names
    for name in expected.column_names:
        assert as_python(batch[name]) == expected.column(name).to_pylist(), name


def assert_same_batch(left: dict, right: dict) -> None:
    """Equal values and the same types, dtypes and shapes."""
    assert list(left) == list(right)
    for name in left:
        a, b = left[name], right[name]
        assert type(a) is type(b), name
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), name
        elif isinstance(a, Ragged):
            assert torch.equal(a.values, b.values) and torch.equal(a.offsets, b.offsets), name
        else:
            assert a == b, name


def test_every_key_form_matches_pyarrows_own_read(data):
    path, fmt = data
    dataset = StructuredDataset(path, fmt, num_workers=0)
    ref = reference(dataset, fmt)
    assert dataset.num_rows == ROWS == ref.num_rows
    rng = np.random.default_rng(5)
    gathered = rng.integers(-ROWS, ROWS, 300)
    keys = [
        slice(None),
        slice(100, 130),
        slice(115, 125),  # across two units of one file
        slice(190, 210),  # across two files
        slice(-5, None),
        slice(None, None, -7),
        slice(3, 10**9, 50),  # clipped, as numpy clips
        slice(400, 10),  # empty
        [5, 3, 3, -1, 0],
        [],
        range(10, 20),
        gathered,
        gathered.astype(np.int32),
        torch.from_numpy(gathered),
        torch.tensor([ROWS - 1, 0], dtype=torch.int16),
    ]
    for key in keys:
        rows = np.arange(ROWS)[key] if isinstance(key, slice) else np.asarray(key, dtype=np.int64) % ROWS
        assert_batch_is(dataset[key], ref.take(rows))
    for index in [0, 119, 120, 199, 200, ROWS - 1, -1, -ROWS, np.int64(7), torch.tensor(8), np.array(9)]:
        row = dataset[index]
        expected = ref.slice(int(index) % ROWS, 1).to_pylist()[0]
        assert set(row) == set(expected)
        assert row["text"] == expected["text"] and isinstance(row["text"], str)
        assert row["id"].ndim == 0 and row["id"].item() == expected["id"]
        assert row["x"].ndim == 0 and row["x"].item() == expected["x"]
        assert row["vec"].ndim == 1 and row["vec"].tolist() == expected["vec"]


def test_a_slice_is_the_batch_the_loader_yields(data):
    """Same conversion path: dtypes, shapes and containers equal the unshuffled loader's batches."""
    path, fmt = data
    dataset = StructuredDataset(path, fmt, num_workers=0, batch_size=40, columns=["text", "vec", "id"])
    for number, batch in enumerate(dataset):
        assert_same_batch(dataset[number * 40 : (number + 1) * 40], batch)
    assert number == (ROWS - 1) // 40


def test_locate_names_the_file_and_the_row_in_it(data):
    path, fmt = data
    dataset = StructuredDataset(path, fmt, num_workers=0)
    assert dataset.locate(0) == (dataset.files[0], 0)
    assert dataset.locate(200) == (dataset.files[1], 0)
    assert dataset.locate(-1) == (dataset.files[3], 149)
    assert dataset.locate(np.int32(355)) == (dataset.files[2], 5)
    with pytest.raises(IndexError, match=f"row index {ROWS} is out of range for a dataset of {ROWS} rows"):
        dataset.locate(ROWS)
    with pytest.raises(TypeError, match="one row index"):
        dataset.locate([1, 2])


def test_bad_indices_name_the_index_and_the_row_count(tmp_path):
    write_dataset(tmp_path, LAYOUT)
    dataset = StructuredDataset(str(tmp_path), num_workers=0)
    for key in [ROWS, -ROWS - 1, [0, ROWS + 5], np.array([3, -ROWS - 2]), torch.tensor([10**9])]:
        with pytest.raises(IndexError, match=rf"row index -?\d+ is out of range for a dataset of {ROWS} rows"):
            dataset[key]
    bools_among_ints = [[True, 2], [5, np.False_]]  # numpy reads them as rows 1 and 0
    for key in [1.0, "3", (1, 2), None, True, [1.5], np.array([1.0]), torch.tensor([True]), np.zeros((2, 2), np.int64), {1}, *bools_among_ints]:
        with pytest.raises(TypeError, match="indices"):
            dataset[key]


def test_the_rank_and_the_shuffle_do_not_change_row_numbers(data):
    """Random access covers every file, whatever this rank's share of the epoch."""
    path, fmt = data
    whole = StructuredDataset(path, fmt, num_workers=0)
    rank = StructuredDataset(path, fmt, num_workers=2, rank=1, world_size=2, shuffle=True, shuffle_seed=9, split_bytes=3000)
    assert rank.num_rows == ROWS and len(rank) < ROWS
    assert_same_batch(rank[::-3], whole[::-3])


def test_strings_and_lists_with_nulls(tmp_path):
    """Null strings come back as None, variable-length lists as Ragged or a tensor per row."""
    texts = pa.array([None if i % 4 == 0 else f"t{i}" * (i % 5) for i in range(300)])
    blobs = pa.array([bytes([i % 256]) * (i % 3) for i in range(300)], pa.binary())
    lists = pa.array([list(range(i % 6)) for i in range(300)], pa.list_(pa.int32()))
    table = pa.table({"id": np.arange(300), "text": texts, "blob": blobs, "seq": lists})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=70)
    dataset = StructuredDataset(str(tmp_path), num_workers=0)
    rows = np.array([4, 5, 299, 0, 140, 141, 7])
    batch = dataset[rows]
    assert_batch_is(batch, table.take(rows))
    assert isinstance(batch["seq"], Ragged)
    assert dataset[4]["text"] is None and dataset[7]["text"] == "t7t7" and dataset[5]["blob"] == b"\x05\x05"
    assert dataset[5]["seq"].tolist() == [0, 1, 2, 3, 4] and dataset[0]["seq"].tolist() == []
    same_length = dataset[[6, 12, 18]]["seq"]
    assert isinstance(same_length, torch.Tensor) and same_length.shape == (3, 0)


def test_a_numeric_null_raises_as_the_loader_does(tmp_path):
    pq.write_table(pa.table({"x": pa.array([1.0, None, 3.0])}), tmp_path / "a.parquet", write_statistics=False)
    dataset = StructuredDataset(str(tmp_path), num_workers=0)  # no null counts: found when read
    assert dataset[0]["x"].item() == 1.0
    with pytest.raises(ValueError, match=r"column 'x' has 1 null value\(s\) in rows 0..2 read from .*a.parquet"):
        dataset[0:3]


def test_nulls_and_structs_follow_the_datasets_column_policy(tmp_path):
    table = pa.table({"x": pa.array([1, None, 3]), "st": pa.array([{"a": 1, "b": "u"}, {"a": 2, "b": "v"}, {"a": 3, "b": "w"}])})
    pq.write_table(table, tmp_path / "a.parquet")
    dataset = StructuredDataset(str(tmp_path), num_workers=0, nulls="fill", fill_values={"x": -1})
    batch = dataset[[2, 1]]
    assert batch["x"].tolist() == [3, -1]
    assert batch["st.a"].tolist() == [3, 2] and batch["st.b"] == ["w", "v"]
    assert batch.keys() == next(iter(dataset)).keys()


def test_only_the_units_holding_requested_rows_are_read_and_then_cached(tmp_path, monkeypatch):
    write_dataset(tmp_path, LAYOUT)
    reads = []
    whole, partial = random_access.read_conformed, random_access.iter_conformed

    def read_conformed(reader, unit, columns, catalog, file):
        reads.append(("whole", file, unit, columns))
        return whole(reader, unit, columns, catalog, file)

    def iter_conformed(reader, unit, columns, catalog, file, batch_rows, first_row=0):
        reads.append(("run", file, unit, first_row))
        return partial(reader, unit, columns, catalog, file, batch_rows, first_row)

    monkeypatch.setattr(random_access, "read_conformed", read_conformed)
    monkeypatch.setattr(random_access, "iter_conformed", iter_conformed)
    monkeypatch.setattr(random_access, "PARTIAL_MIN_ROWS", 8)
    dataset = StructuredDataset(str(tmp_path), num_workers=0, columns=["id", "text"])
    dataset[[0, 100, 119, 355]]  # file 0 unit 0 (spread: whole), file 2 unit 0 (one row: a run)
    assert reads == [("whole", 0, 0, ["id", "text"]), ("run", 2, 0, 5)]
    reads.clear()
    dataset[[3, 50, 356, 358]]  # all cached (the run decoded at least 8 rows)
    assert reads == []
    dataset[420:425]  # file 2 unit 1 rows 10..14: a run
    assert reads == [("run", 2, 1, 10)]
    reads.clear()
    dataset[440:445]  # the same unit again, rows the run did not decode: now the whole unit
    assert reads == [("whole", 2, 1, ["id", "text"])]


def test_a_short_run_decodes_only_the_pages_that_hold_it(tmp_path, monkeypatch, seek_tiny_files):
    write_dataset(tmp_path, [[400]], paged=True)
    reads = []

    def counted(*args):
        decoded = parquet_range.read_range(*args)
        reads.append((args[6], args[7], decoded.first, decoded.table.num_rows))
        return decoded

    monkeypatch.setattr(parquet, "read_range", counted)
    monkeypatch.setattr(random_access, "PARTIAL_MIN_ROWS", 10)
    dataset = StructuredDataset(str(tmp_path), num_workers=0)
    assert dataset[300:310]["id"].tolist() == list(range(300, 310))
    [(start, stop, first, rows)] = reads
    assert (start, stop) == (300, 310) and 280 < first <= 300 and 310 <= first + rows < 330  # pages of about 5 rows
    assert dataset[first]["id"].item() == first  # the rows decoded before the run are cached too
    assert len(reads) == 1
    assert dataset[333]["id"].item() == 333


def test_the_cache_is_bounded_and_batches_do_not_alias_it(tmp_path):
    write_dataset(tmp_path, LAYOUT)
    unit_bytes = StructuredDataset(str(tmp_path), num_workers=0)._rows.table(np.arange(120)).get_total_buffer_size()
    dataset = StructuredDataset(str(tmp_path), num_workers=0, row_cache_bytes=2 * unit_bytes + 100)
    for start in range(0, ROWS, 7):
        dataset[start : start + 3]
        assert dataset._rows.cache.nbytes <= 2 * unit_bytes + 100
    batch = dataset[0:10]
    batch["id"].add_(1000)
    assert dataset[0:10]["id"].tolist() == list(range(10))
    assert StructuredDataset(str(tmp_path), num_workers=0, row_cache_bytes=0)[[1, 500]]["id"].tolist() == [1, 500]
    with pytest.raises(ValueError, match="row_cache_bytes"):
        StructuredDataset(str(tmp_path), num_workers=0, row_cache_bytes=-5)


def test_a_pickled_copy_reads_on_its_own(tmp_path):
    write_dataset(tmp_path, LAYOUT)
    dataset = StructuredDataset(str(tmp_path), num_workers=0)
    dataset[0:50]
    copy = pickle.loads(pickle.dumps(dataset.rows))
    assert len(copy.access.cache) == 0
    assert copy[[7, -1]]["id"].tolist() == [7, ROWS - 1]


@pytest.mark.parametrize("fmt", ["parquet", "orc"])
def test_rows_in_dataloader_workers_with_a_random_sampler_cover_every_row_once(tmp_path, fmt):
    write_dataset(tmp_path, LAYOUT, fmt)
    dataset = StructuredDataset(str(tmp_path), fmt, num_workers=2)
    rows = dataset.rows
    assert len(rows) == ROWS
    order = list(RandomSampler(rows, generator=torch.Generator().manual_seed(1)))
    sampler = RandomSampler(rows, generator=torch.Generator().manual_seed(1))
    loader = DataLoader(rows, batch_size=32, sampler=sampler, num_workers=2)
    seen = []
    for batch in loader:
        assert batch["vec"].shape == (len(batch["id"]), 3) and isinstance(batch["text"], list)
        seen += batch["id"].tolist()
    assert sorted(seen) == list(range(ROWS))
    assert seen == [int(dataset[i]["id"]) for i in order]


def test_a_batch_sampler_gets_batches_in_the_loaders_form(tmp_path):
    write_dataset(tmp_path, LAYOUT)
    dataset = StructuredDataset(str(tmp_path), num_workers=0)
    rows = dataset.rows
    order = list(BatchSampler(RandomSampler(rows, generator=torch.Generator().manual_seed(2)), 64, drop_last=False))
    sampler = BatchSampler(RandomSampler(rows, generator=torch.Generator().manual_seed(2)), 64, drop_last=False)
    loader = DataLoader(rows, sampler=sampler, batch_size=None, num_workers=2)
    seen = []
    for indices, batch in zip(order, loader, strict=True):
        assert_same_batch(batch, dataset[indices])
        seen += batch["id"].tolist()
    assert sorted(seen) == list(range(ROWS))
    sequential = DataLoader(rows, sampler=BatchSampler(SequentialSampler(rows), 100, False), batch_size=None)
    assert_same_batch(next(iter(sequential)), dataset[:100])


def test_a_changed_file_is_named(tmp_path):
    write_dataset(tmp_path, LAYOUT)
    dataset = StructuredDataset(str(tmp_path), num_workers=0)
    write_dataset(tmp_path, [[10]])  # part-00000 rewritten
    with pytest.raises(Exception, match="part-00000"):
        dataset[0]


@pytest.mark.parametrize("fmt", ["parquet_paged", "orc"])
def test_remote_files_on_an_object_store(s3, tmp_path, fmt, seek_tiny_files):
    """Every key form on S3 (moto), in this process and in DataLoader workers."""
    local = tmp_path / "src"
    write_dataset(local, LAYOUT, fmt.split("_")[0], paged=fmt.endswith("paged"))
    url = s3.url(f"random-access-{fmt}")
    s3.upload(str(local), f"random-access-{fmt}")
    dataset = StructuredDataset(url, fmt.split("_")[0], num_workers=2, storage_options=s3.options, columns=["id", "text", "vec"])
    mirror = StructuredDataset(str(local), fmt.split("_")[0], num_workers=0, columns=["id", "text", "vec"])
    assert dataset.num_rows == ROWS and dataset.locate(-1) == (dataset.files[-1], 149)
    gathered = np.random.default_rng(3).integers(-ROWS, ROWS, 200)
    for key in [slice(None), slice(121, 131), slice(None, None, -9), [3, 3, -1], gathered, torch.from_numpy(gathered)]:
        assert_same_batch(dataset[key], mirror[key])
    assert dataset[333]["text"] == "row-333"
    loader = DataLoader(dataset.rows, sampler=BatchSampler(SequentialSampler(dataset.rows), 70, False), batch_size=None, num_workers=2)
    assert torch.cat([batch["id"] for batch in loader]).tolist() == list(range(ROWS))


def test_files_without_rows_take_no_row_numbers(tmp_path):
    write_dataset(tmp_path, [[10], [0], [5, 5]])
    dataset = StructuredDataset(str(tmp_path), num_workers=0)
    assert dataset.num_rows == 20 and len(dataset.files) == 3
    assert dataset.locate(10) == (dataset.files[2], 0)
    assert dataset[8:12]["id"].tolist() == [8, 9, 10, 11]


def test_a_subset_sampler_of_tensor_indices(tmp_path):
    """SubsetRandomSampler over a tensor hands 0-d tensors to ``__getitems__``."""
    write_dataset(tmp_path, LAYOUT)
    rows = StructuredDataset(str(tmp_path), num_workers=0).rows
    subset = torch.arange(0, ROWS, 3)
    loader = DataLoader(rows, batch_size=16, sampler=SubsetRandomSampler(subset))
    assert sorted(torch.cat([batch["id"] for batch in loader]).tolist()) == subset.tolist()


def test_random_access_numbers_every_stored_row_whatever_the_filter(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from torch_dataloader_utils import StructuredDataset

    pq.write_table(pa.table({"id": list(range(100))}), tmp_path / "a.parquet", row_group_size=30)
    dataset = StructuredDataset(str(tmp_path), num_workers=0, batch_size=10, filters=[("id", ">=", 90)])
    assert len(dataset) == 10 and dataset.num_rows == 100  # len: rows this rank delivers
    assert int(dataset[5]["id"]) == 5 and dataset[95:97]["id"].tolist() == [95, 96]


def test_a_file_rewritten_after_its_reader_was_opened_is_refused(tmp_path):
    """Random access keeps a file's reader open between calls; a rewrite of the file since is an
    error naming it, not rows of another version."""
    from torch_dataloader_utils import DataReadError

    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": pa.array(range(100), pa.int64())}), path, row_group_size=25)
    dataset = StructuredDataset(str(tmp_path), num_workers=0, batch_size=10)
    assert dataset[5]["id"].item() == 5
    stat = path.stat()
    pq.write_table(pa.table({"id": pa.array(range(1000, 1100), pa.int64())}), path, row_group_size=25)
    os.utime(path, ns=(stat.st_mtime_ns + 10**9, stat.st_mtime_ns + 10**9))
    with pytest.raises(DataReadError, match=r"a\.parquet.*changed after planning"):
        dataset[60]
