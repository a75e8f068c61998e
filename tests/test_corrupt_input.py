"""Corrupt and surprising input files, and files whose schemas differ.

Each bad file gives a prompt error naming the file (and the split, for read errors), never a
hang or a crash of the interpreter; good data around it stays exactly-once and resumable.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest
import torch
from datagen import make_table, write_dataset
from resume_helpers import assert_exactly_once, batch_key, make, resume, run_epoch

from torch_dataloader_utils import DataReadError, StructuredDataset
from torch_dataloader_utils.catalog.schema import merge_types, unify
from torch_dataloader_utils.read.conform import _check_columns_read, conform
from torch_dataloader_utils.testing import assert_resumes_exactly

pytestmark = pytest.mark.timeout(120)

LAYOUT = [[30, 25], [40], [20, 35]]
ROWS = sum(map(sum, LAYOUT))


def _dataset(tmp_path, fmt: str = "parquet") -> str:
    root = str(tmp_path / f"data-{fmt}")
    write_dataset(root, LAYOUT, fmt)
    return root


def _victim(root: str, fmt: str = "parquet") -> str:
    return os.path.join(root, f"part-00001.{fmt}")


# ------------------------------------------------------------------ footer failures at planning
def _truncate(path: str) -> None:
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])


def _garbage(path: str) -> None:
    with open(path, "wb") as f:
        f.write(np.random.default_rng(0).bytes(3000))


def _empty(path: str) -> None:
    open(path, "wb").close()


@pytest.mark.parametrize("fmt", ["parquet", "orc"])
@pytest.mark.parametrize("damage", [_truncate, _garbage, _empty], ids=["truncated", "garbage", "zero-bytes"])
def test_unreadable_footer_names_the_file_at_planning(tmp_path, fmt, damage):
    root = _dataset(tmp_path, fmt)
    damage(_victim(root, fmt))
    with pytest.raises(ValueError, match=rf"cannot read the {fmt} footer of .*part-00001\.{fmt}"):
        StructuredDataset(root, format=fmt, num_workers=0)


# ------------------------------------------------------------------ read failures in workers
def _corrupt_pages(path: str) -> None:
    """Overwrite bytes inside the first row group's data; the footer stays intact. The modification
    time moves on by a second, as a later rewrite's would: kernels before 6.13 advance it once per
    clock tick (4 ms), and a rewrite within the same tick as the planning cannot be told apart."""
    before = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(200)
        f.write(b"\xff" * 64)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))


@pytest.mark.parametrize("workers", [0, 2])
def test_corrupt_data_pages_raise_data_read_error_naming_file_and_split(tmp_path, workers):
    root = _dataset(tmp_path)
    loader, dataset = make(root, batch_size=10, num_workers=workers, split_bytes=1 << 30)
    _corrupt_pages(_victim(root))
    with pytest.raises(DataReadError, match=r"cannot read .*part-00001\.parquet \(split .*part-00001\.parquet +full file, unit 0\)") as error:
        run_epoch(loader, dataset)
    assert str(error.value).rstrip().endswith("create the loader again")  # changed after planning: no advice about damage


@pytest.mark.parametrize("workers", [0, 2])
def test_data_pages_corrupt_before_planning_say_what_to_do(tmp_path, workers):
    root = _dataset(tmp_path)
    _corrupt_pages(_victim(root))
    loader, dataset = make(root, batch_size=10, num_workers=workers, split_bytes=1 << 30)
    with pytest.raises(DataReadError, match=r"cannot read .*part-00001\.parquet \(split .*unit 0\): ") as error:
        run_epoch(loader, dataset)
    assert "If the file is damaged, replace or remove it, or pass on_error='skip'" in str(error.value)


@pytest.mark.parametrize("fmt", ["parquet", "orc"])
def test_file_deleted_after_planning(tmp_path, fmt):
    """Deleted between create_dataloader and iterating (read by a worker): a DataReadError naming
    file and split; the state counts what was received, and once the file is back, the resumed run
    completes the epoch exactly once."""
    root = _dataset(tmp_path, fmt)
    config = dict(format=fmt, batch_size=10, num_workers=2, split_bytes=1 << 30)
    full = run_epoch(*make(root, **config))
    loader, dataset = make(root, **config)
    victim = _victim(root, fmt)
    shutil.move(victim, str(tmp_path / "aside"))
    received = []
    with pytest.raises(DataReadError, match=rf"cannot read .*part-00001\.{fmt} \(split .*part-00001\.{fmt} +full file, unit 0\)"):
        for batch in loader:
            received.append(batch_key(batch))
    assert sum(map(len, received)) == sum(dataset.state_dict()["rows_delivered"])
    state = json.loads(json.dumps(dataset.state_dict()))
    shutil.move(str(tmp_path / "aside"), victim)
    rest = resume(root, state, **config)
    assert received + rest == full
    assert_exactly_once(received + rest, ROWS)


@pytest.mark.parametrize("fmt", ["parquet", "orc"])
def test_zero_row_files_are_planned_around(tmp_path, fmt):
    """Files with no rows (no row groups, or only empty ones) deliver nothing and break nothing."""
    root = _dataset(tmp_path, fmt)
    empty = make_table(0, 1, fixed_list=fmt == "parquet").slice(0, 0)
    if fmt == "parquet":
        pq.write_table(empty, os.path.join(root, "part-00000a.parquet"))
        with pq.ParquetWriter(os.path.join(root, "part-00003.parquet"), empty.schema) as writer:
            writer.write_table(empty)
    else:
        orc.write_table(empty, os.path.join(root, "part-00000a.orc"))
    config = dict(format=fmt, batch_size=7, num_workers=1, shuffle=True, split_bytes=2000)
    loader, dataset = make(root, **config)
    assert len(dataset.files) == (5 if fmt == "parquet" else 4)
    batches = assert_resumes_exactly(lambda: make(root, **config), epochs=1, points=[(0, 3)], batch_key=batch_key).batches[0]
    assert_exactly_once(batches, ROWS)


def test_file_rewritten_after_planning_with_other_content_is_not_read_silently(tmp_path):
    """A file replaced after planning (other rows, other size) fails to read; no wrong rows."""
    root = _dataset(tmp_path)
    loader, dataset = make(root, batch_size=10, num_workers=0, split_bytes=1 << 30)
    write_dataset(tmp_path / "other", [[50, 50]], first_id=1000)
    shutil.copy(tmp_path / "other" / "part-00000.parquet", _victim(root))
    received = []
    with pytest.raises(DataReadError, match=r"part-00001\.parquet"):
        for batch in loader:
            received.append(batch_key(batch))
    assert all(i < ROWS for b in received for i in b)


# ------------------------------------------------------------------ schemas that differ
def _write(path: str, table: pa.Table) -> None:
    pq.write_table(table, path) if path.endswith(".parquet") else orc.write_table(table, path)


@pytest.mark.parametrize("fmt", ["parquet", "orc"])
def test_compatible_schemas_are_unified(tmp_path, fmt):
    """A missing column is read as nulls, an int32 id widens to int64, a float32 x to float64."""
    root = str(tmp_path / "mixed")
    os.makedirs(root)
    fixed = fmt == "parquet"
    _write(os.path.join(root, f"a.{fmt}"), make_table(0, 40, fixed))
    second = make_table(40, 30, fixed).drop_columns(["label", "text"])
    second = second.set_column(0, "id", second.column("id").cast(pa.int32()))
    second = second.set_column(second.schema.get_field_index("x"), "x", second.column("x").cast(pa.float32()))
    _write(os.path.join(root, f"b.{fmt}"), second)
    # one worker and one shuffle window: both files' rows are read and mixed together
    config = dict(format=fmt, batch_size=8, num_workers=1, columns=["id", "x"], shuffle=True, shuffle_buffer_rows=100)
    loader, dataset = make(root, **config)
    ids = []
    for batch in loader:
        assert batch["id"].dtype == torch.int64 and batch["x"].dtype == torch.float64
        assert torch.equal(batch["x"], batch["id"].double() * 0.5)
        ids += batch["id"].tolist()
    assert sorted(ids) == list(range(70)) and ids != sorted(ids)
    # a projection to a column one file lacks still yields all of that file's rows (as nulls)
    loader, dataset = make(root, format=fmt, batch_size=100, num_workers=0, columns=["text"])
    (batch,) = list(loader)
    assert batch["text"] == [f"row-{i}" for i in range(40)] + [None] * 30
    # a numeric column missing from a file cannot become a tensor: refused when the dataset is built
    with pytest.raises(ValueError, match=rf"column 'label' \(int32\) is missing from .*b\.{fmt}: it would be read as nulls"):
        make(root, format=fmt, batch_size=100, num_workers=0)
    with pytest.raises(ValueError, match="column 'label'"):
        make(root, format=fmt, columns=["id", "label"], num_workers=0)


def test_a_column_of_the_null_type_counts_as_missing(tmp_path):
    """A file whose column holds only nulls may store it as Arrow's null type: for a numeric column
    that is refused when the dataset is built, as a missing one is; a string column reads None."""
    pq.write_table(pa.table({"id": [0, 1], "x": pa.nulls(2), "s": pa.nulls(2)}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [2, 3], "x": [1.5, 2.5], "s": ["c", "d"]}), tmp_path / "b.parquet")
    with pytest.raises(ValueError, match=r"column 'x' \(double\) is missing from .*a\.parquet.*a column a file stores with only nulls"):
        make(str(tmp_path), num_workers=0)
    loader, _ = make(str(tmp_path), num_workers=0, columns=["id", "s"], batch_size=4)
    (batch,) = list(loader)
    assert batch["s"] == [None, None, "c", "d"]


@pytest.mark.parametrize("workers", [0, 2])
def test_small_dictionary_indices_of_different_files_mix_in_a_shuffle_window(tmp_path, workers):
    """pandas writes a categorical of under 128 categories with int8 indices; a window holding
    rows of two files merges their dictionaries (200 categories here)."""
    root = tmp_path / "categories"
    os.makedirs(root)
    for day in range(2):
        ids = np.arange(day * 1000, (day + 1) * 1000)
        city = pa.array([f"city{day}-{i % 100}" for i in ids]).dictionary_encode().cast(pa.dictionary(pa.int8(), pa.string()))
        pq.write_table(pa.table({"id": ids, "city": city}), root / f"day{day}.parquet")
    loader, dataset = make(str(root), batch_size=100, num_workers=workers, shuffle=True, shuffle_buffer_rows=4000)
    rows = {}
    for batch in loader:
        rows.update(zip(batch["id"].tolist(), batch["city"]))
    assert sorted(rows) == list(range(2000))
    assert all(city == f"city{i // 1000}-{i % 100}" for i, city in rows.items())


@pytest.mark.parametrize("workers", [0, 2])
def test_a_file_without_rows_types_no_column(tmp_path, workers):
    """pandas writes an empty frame's columns as float64 (its object columns too): beside int64 and
    string files it neither widens ids to double (which rounds ids past 2**53) nor clashes with a
    string column; a dataset of empty files alone keeps their types."""
    import pandas as pd

    pd.DataFrame({"id": [], "name": []}).astype("float64").to_parquet(tmp_path / "a_empty.parquet")
    big = [2**53 + 1, 2**53 + 3]
    pq.write_table(pa.table({"id": pa.array(big, pa.int64()), "name": ["x", "y"]}), tmp_path / "b.parquet")
    loader, dataset = make(str(tmp_path), num_workers=workers, batch_size=4)
    assert dataset.schema.field("id").type == pa.int64() and dataset.schema.field("name").type == pa.string()
    (batch,) = list(loader)
    assert batch["id"].dtype == torch.int64 and batch["id"].tolist() == big and batch["name"] == ["x", "y"]
    empty = StructuredDataset(str(tmp_path / "a_empty.parquet"), num_workers=0)
    assert len(empty) == 0 and empty.schema.field("id").type == pa.float64()


def test_incompatible_schemas_name_the_files_at_planning(tmp_path):
    root = str(tmp_path / "clash")
    os.makedirs(root)
    _write(os.path.join(root, "a.parquet"), make_table(0, 10))
    _write(os.path.join(root, "b.parquet"), make_table(10, 10))
    odd = make_table(20, 10)
    odd = odd.set_column(0, "id", pa.array([str(i) for i in range(20, 30)]))
    _write(os.path.join(root, "c.parquet"), odd)
    with pytest.raises(ValueError) as error:
        StructuredDataset(root, num_workers=0)
    message = str(error.value)
    assert "column 'id' is int64 in" in message and "a.parquet (and 1 more file)" in message
    assert "but string in" in message and "c.parquet" in message


@pytest.mark.parametrize("alone", [True, False])
def test_a_column_name_twice_in_a_file_is_refused_naming_file_and_column(tmp_path, alone):
    """Next to a file of another schema, each piece is conformed by name, and such a column was
    delivered as nulls; alone, reading it failed with a KeyError about another column."""
    root = str(tmp_path / "twice")
    os.makedirs(root)
    names = ["id", "s", "s", "x"]
    twice = pa.Table.from_arrays([pa.array(range(4), pa.int64()), pa.array(list("abcd")), pa.array(list("ABCD")), pa.array([0.5] * 4)], names=names)
    _write(os.path.join(root, "a.parquet"), twice)
    if not alone:
        _write(os.path.join(root, "b.parquet"), pa.table({"id": pa.array(range(4, 8), pa.int32()), "s": list("efgh"), "x": [1.5] * 4}))
    with pytest.raises(ValueError, match=r"a\.parquet has 2 columns named 's': .*Leave it out with columns=\[\.\.\.\], or rename"):
        StructuredDataset(root, num_workers=0)
    loader, _ = StructuredDataset.create_dataloader(root, num_workers=0, batch_size=8, columns=["id", "x"])  # the others read
    assert sorted(i for batch in loader for i in batch["id"].tolist()) == list(range(4 if alone else 8))


@pytest.mark.parametrize(
    "a, b, unified",
    [
        (pa.int32(), pa.int64(), pa.int64()),
        (pa.uint16(), pa.int16(), pa.int32()),
        (pa.uint8(), pa.uint32(), pa.uint32()),
        (pa.uint64(), pa.int64(), None),
        (pa.float32(), pa.float64(), pa.float64()),
        (pa.int64(), pa.float32(), pa.float64()),
        (pa.string(), pa.large_string(), pa.large_string()),
        (pa.dictionary(pa.int32(), pa.string()), pa.string(), pa.string()),
        (pa.null(), pa.string(), pa.string()),
        (pa.int64(), pa.string(), None),
        (pa.bool_(), pa.int8(), None),
        (pa.list_(pa.float32(), 3), pa.list_(pa.float32()), pa.list_(pa.float32(), 3)),  # a row of another length raises when read
        (pa.list_(pa.float32(), 3), pa.list_(pa.float32(), 2), None),
        (pa.timestamp("s"), pa.timestamp("ms"), pa.timestamp("ms")),
        (pa.timestamp("us", tz="UTC"), pa.timestamp("ns"), None),  # another time zone (or none)
        (pa.struct([("a", pa.int32())]), pa.struct([("a", pa.int64()), ("b", pa.string())]), pa.struct([("a", pa.int64()), ("b", pa.string())])),
        (pa.struct([("a", pa.int32())]), pa.struct([("a", pa.string())]), None),
    ],
)
def test_type_rule(a, b, unified):
    assert merge_types(a, b) == unified
    assert merge_types(b, a) == unified


def test_a_struct_that_gained_a_field_reads_it_as_null_in_older_files(tmp_path):
    """As a column added later: the field is null in the files written before it."""
    old = pa.table({"id": [0, 1], "st": pa.array([{"a": 1}, {"a": 2}], pa.struct([("a", pa.int32())]))})
    new = pa.table({"id": [2], "st": pa.array([{"a": 3, "b": "x"}], pa.struct([("a", pa.int32()), ("b", pa.string())]))})
    pq.write_table(old, tmp_path / "a.parquet")
    pq.write_table(new, tmp_path / "b.parquet")
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path), num_workers=0, batch_size=8, nulls="mask")
    (batch,) = list(loader)
    assert batch["st.a"].tolist() == [1, 2, 3] and batch["st.b"] == [None, None, "x"]


def test_conform_orders_fills_and_casts_safely():
    schema = unify(
        [pa.schema([("a", pa.int32()), ("b", pa.string())]), pa.schema([("c", pa.float32()), ("a", pa.int64())])],
        ["f1", "f2"],
    )
    assert schema.names == ["a", "b", "c"]
    table = conform(pa.table({"c": pa.array([1.5], pa.float32()), "a": pa.array([7], pa.int64())}), schema)
    assert table.schema.equals(schema) and table.to_pylist() == [{"a": 7, "b": None, "c": 1.5}]
    same = pa.table({"a": pa.array([1], pa.int64()), "b": ["x"], "c": pa.array([2.0], pa.float32())})
    assert conform(same, schema.remove_metadata()) is same or conform(same, schema).equals(same)
    big = pa.schema([("a", pa.float64())])
    with pytest.raises(ValueError, match="column 'a' is int64 here but is read as double in all files"):
        conform(pa.table({"a": pa.array([2**53 + 1], pa.int64())}), big)  # not exactly representable


def test_a_column_the_file_has_but_the_read_left_out_is_an_error_not_nulls():
    """conform() fills the columns a file lacks with nulls; one the file has must come back from
    the read (pyarrow's ORC reader took a dotted name as a struct path and returned another column)."""
    _check_columns_read(pa.table({"id": [1], "meta": [{"lang": "x"}]}), ["id", "meta"], 3)
    _check_columns_read(pa.table({"id": [1]}), None, 3)
    with pytest.raises(ValueError, match=r"unit 3: the file has columns \['meta.lang'\] but reading them returned columns \['id', 'meta'\]"):
        _check_columns_read(pa.table({"id": [1], "meta": [{"lang": "x"}]}), ["id", "meta.lang"], 3)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_value_that_does_not_fit_the_widened_type_names_column_and_file(tmp_path, workers, on_error):
    """int64 in one file and float32 in another are read as float64; 2**60 + 1 does not fit. The
    file is readable, so this is a schema error naming the column and file, not a damaged file
    that on_error="skip" would silently leave out."""
    os.makedirs(tmp_path / "d")
    pq.write_table(pa.table({"x": pa.array([2**60 + 1] + list(range(9)), pa.int64())}), tmp_path / "d" / "a.parquet")
    pq.write_table(pa.table({"x": pa.array([0.5] * 10, pa.float32())}), tmp_path / "d" / "b.parquet")
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path / "d"), batch_size=5, num_workers=workers, on_error=on_error)
    with pytest.raises(ValueError, match=r"a\.parquet: column 'x' is int64 here but is read as double in all files") as error:
        list(loader)
    assert not isinstance(error.value, DataReadError) and "damaged" not in str(error.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_string_that_is_not_utf8_names_the_column_and_counts_no_batch(tmp_path, workers):
    """pyarrow writes and reads such a file; the error comes where a batch's strings are built."""
    good = pa.array(["a", "b"])
    bad = pa.Array.from_buffers(pa.string(), 2, [None, pa.py_buffer(np.array([0, 2, 3], np.int32)), pa.py_buffer(b"\xff\xfeA")])
    os.makedirs(tmp_path / "data")
    pq.write_table(pa.table({"s": good, "id": np.array([0, 1])}), tmp_path / "data" / "a.parquet")
    pq.write_table(pa.table({"s": bad, "id": np.array([2, 3])}), tmp_path / "data" / "b.parquet")
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path / "data"), batch_size=2, num_workers=workers)
    received = []
    with pytest.raises(ValueError, match=r"column 's' of rows read from .*b\.parquet \(epoch 0\) holds a string that is not valid UTF-8"):
        for batch in loader:
            received.append(batch["id"].tolist())
    assert received == [[0, 1]]
    assert dataset.state_dict()["batches_delivered"] == 1
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path / "data"), batch_size=2, num_workers=workers, columns=["id"])
    assert [batch["id"].tolist() for batch in loader] == [[0, 1], [2, 3]]


def test_a_string_that_is_not_utf8_names_the_column_in_a_stateful_dataloader_worker(tmp_path):
    from torchdata.stateful_dataloader import StatefulDataLoader

    bad = pa.Array.from_buffers(pa.string(), 2, [None, pa.py_buffer(np.array([0, 2, 3], np.int32)), pa.py_buffer(b"\xff\xfeA")])
    os.makedirs(tmp_path / "data")
    pq.write_table(pa.table({"s": bad, "id": np.array([2, 3])}), tmp_path / "data" / "b.parquet")
    dataset = StructuredDataset(str(tmp_path / "data"), batch_size=2, num_workers=2)
    with pytest.raises(ValueError, match=r"column 's' of rows read from .*b\.parquet \(epoch 0\) holds a string that is not valid UTF-8"):
        list(StatefulDataLoader(dataset, batch_size=None, num_workers=2))
