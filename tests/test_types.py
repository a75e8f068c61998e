"""Column types real writers produce and nulls (read/nulls.py, read/nested.py, read/forms.py,
read/column_check.py): what a batch holds for each, and the errors planning raises at once."""

from __future__ import annotations

import datetime
import decimal
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.read.convert import Ragged

pytestmark = pytest.mark.timeout(120)


def _one_batch(path, **kwargs):
    kwargs.setdefault("num_workers", 0)
    loader, dataset = StructuredDataset.create_dataloader(str(path), batch_size=1000, **kwargs)
    (batch,) = list(loader)
    return batch, dataset


def _rows(value):
    if isinstance(value, Ragged):
        return [value.values[value.offsets[i] : value.offsets[i + 1]].tolist() for i in range(len(value.offsets) - 1)]
    return value.tolist()


NULLABLE = pa.table(
    {
        "i": pa.array([1, None, 3], pa.int64()),
        "f": pa.array([1.5, None, 2.5], pa.float32()),
        "b": pa.array([True, None, True]),
        "t": pa.array([datetime.datetime(2024, 1, 1), None, datetime.datetime(2024, 1, 2)], pa.timestamp("ms", tz="UTC")),
        "l": pa.array([[1, 2], None, [3]], pa.list_(pa.int32())),
        "fl": pa.array([[1, 2], None, [3, 4]], pa.list_(pa.int32(), 2)),
        "s": pa.array(["a", None, "c"]),
    }
)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_fill_replaces_nulls_by_type_or_by_fill_values(tmp_path, num_workers):
    pq.write_table(NULLABLE, tmp_path / "n.parquet")
    batch, _ = _one_batch(tmp_path, num_workers=num_workers, nulls="fill", fill_values={"i": -1})
    assert batch["i"].tolist() == [1, -1, 3]
    assert batch["f"][0] == 1.5 and math.isnan(batch["f"][1]) and batch["f"].dtype == torch.float32
    assert batch["b"].tolist() == [True, False, True]
    assert batch["t"][1] == 0
    assert _rows(batch["l"]) == [[1, 2], [], [3]]  # a null list row becomes empty
    assert batch["fl"].tolist() == [[1, 2], [0, 0], [3, 4]]
    assert batch["s"] == ["a", None, "c"]


def test_mask_adds_a_validity_column_per_tensor_column(tmp_path):
    pq.write_table(NULLABLE, tmp_path / "n.parquet")
    batch, dataset = _one_batch(tmp_path, nulls="mask")
    for name in ("i", "f", "b", "t", "l", "fl"):
        assert batch[f"{name}.valid"].tolist() == [True, False, True], name
    assert "s.valid" not in batch
    assert dataset.schema.field("i.valid").type == pa.bool_()
    assert list(batch) == dataset.schema.names


def test_nulls_are_found_at_planning_from_statistics_naming_every_column_and_file(tmp_path):
    pq.write_table(NULLABLE, tmp_path / "a.parquet")
    pq.write_table(NULLABLE.slice(0, 1), tmp_path / "b.parquet")  # no nulls here
    with pytest.raises(ValueError, match="statistics show nulls") as error:
        StructuredDataset(str(tmp_path), num_workers=0)
    message = str(error.value)
    for name in ("'i'", "'f'", "'b'", "'t'"):
        assert f"column {name} has 1 null value(s) in " in message and "a.parquet" in message
    assert "b.parquet" not in message and "nulls='fill'" in message
    StructuredDataset(str(tmp_path), num_workers=0, columns=["s"])  # strings hold None
    pq.write_table(pa.concat_tables([NULLABLE] * 3), tmp_path / "c.parquet")
    with pytest.raises(ValueError, match=r"column 'i' has 4 null value\(s\) in 2 files, 1 in .*a\.parquet \(and 1 more file\)"):
        StructuredDataset(str(tmp_path), num_workers=0)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_nulls_found_when_read_name_the_file_of_the_first(tmp_path, num_workers):
    """Files planned from the plan cache have their nulls found when read; a chunk holds rows of
    many files, and the error names the one with the column's first null."""
    for index in range(12):
        values = [None if index == 7 and row == 3 else float(row) for row in range(10)]
        pq.write_table(pa.table({"x": pa.array(values, pa.float32())}), tmp_path / f"part-{index:02d}.parquet")
    cache = str(tmp_path / "cache")
    with pytest.raises(ValueError, match="statistics show nulls"):
        StructuredDataset(str(tmp_path), num_workers=0, cache_dir=cache)
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), num_workers=num_workers, batch_size=40, cache_dir=cache)
    with pytest.raises(ValueError, match=r"column 'x' has 1 null value\(s\) in rows read from .*, the first in \S*part-07\.parquet; a tensor"):
        list(loader)


def test_fill_values_are_checked():
    with pytest.raises(ValueError, match="nulls must be one of"):
        StructuredDataset("unused", nulls="zero")
    with pytest.raises(ValueError, match="fill_values is used only with"):
        StructuredDataset("unused", fill_values={"i": 1})
    with pytest.raises(ValueError, match="fill_values must map column names to numbers"):
        StructuredDataset("unused", nulls="fill", fill_values={"i": "x"})


def test_fill_values_naming_no_column_is_refused_at_planning(tmp_path):
    pq.write_table(pa.table({"label": pa.array([1, None], pa.int64()), "user": pa.array([{"age": 30}, None])}), tmp_path / "a.parquet")
    with pytest.raises(ValueError, match=r"fill_values names column\(s\) \['lable'\] that the files do not have\. The batch columns are \['label', 'user.age'\]"):
        StructuredDataset(str(tmp_path), nulls="fill", fill_values={"lable": -1}, num_workers=0)
    with pytest.raises(ValueError, match=r"\['user'\] .* filled per leaf: \['user.age'\]"):
        StructuredDataset(str(tmp_path), nulls="mask", fill_values={"user": -1}, num_workers=0)
    batch, _ = _one_batch(tmp_path, nulls="fill", fill_values={"label": -1, "user.age": -2}, columns=["label"])  # a column not selected is fine
    assert batch["label"].tolist() == [1, -1]


def test_decimals_as_float64_or_scaled_int64(tmp_path):
    values = [decimal.Decimal("1.25"), None, decimal.Decimal("-99999999.99")]
    pq.write_table(pa.table({"d": pa.array(values, pa.decimal128(10, 2)), "w": pa.array(values, pa.decimal256(40, 2))}), tmp_path / "d.parquet")
    batch, dataset = _one_batch(tmp_path, nulls="fill")
    assert batch["d"].dtype == torch.float64 and batch["d"][0] == 1.25 and math.isnan(batch["d"][1])
    assert batch["w"][2] == -99999999.99
    batch, _ = _one_batch(tmp_path, nulls="fill", decimals="int64")
    assert batch["d"].tolist() == [125, 0, -9999999999] and batch["w"].tolist() == [125, 0, -9999999999]
    assert dataset.schema.field("d").type == pa.decimal128(10, 2)  # the scale, for the int64 form


def test_decimals_as_float64_are_the_nearest_double(tmp_path):
    texts = ["0.41", "0.07", "3.03", "12.12", "-6.06", "9999999.99", "1.10"]
    values = [decimal.Decimal(t) for t in texts]
    columns = {
        "d32": pa.array(values, pa.decimal32(9, 2)),
        "d128": pa.array(values, pa.decimal128(38, 5)),
        "d256": pa.array(values, pa.decimal256(50, 2)),
        "big": pa.array([decimal.Decimal(10**30) + v for v in values], pa.decimal128(38, 2)),  # beyond int64: the nearest double, or one unit off
    }
    pq.write_table(pa.table(columns), tmp_path / "d.parquet")
    batch, _ = _one_batch(tmp_path)
    for name in ("d32", "d128", "d256"):
        assert batch[name].tolist() == [float(t) for t in texts], name
    assert [abs(got - float(decimal.Decimal(10**30) + v)) <= 2**50 for got, v in zip(batch["big"].tolist(), values)] == [True] * len(values)


def test_a_decimal_beyond_int64_names_the_column(tmp_path):
    pq.write_table(pa.table({"d": pa.array([decimal.Decimal(10**30)], pa.decimal128(38, 0))}), tmp_path / "d.parquet")
    with pytest.raises(Exception, match=r"column 'd' .* does not fit int64"):
        _one_batch(tmp_path, decimals="int64")


STRUCTS = pa.table(
    {
        "id": [0, 1, 2],
        "st": pa.array([{"a": 1, "b": {"c": "x"}}, None, {"a": 3, "b": {"c": None}}], pa.struct([("a", pa.int64()), ("b", pa.struct([("c", pa.string())]))])),
        "m": pa.array([[("k", 1)], None, [("j", 2), ("k", 3)]], pa.map_(pa.string(), pa.int64())),
    }
)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_struct_leaves_and_map_keys_values_are_columns(tmp_path, num_workers):
    pq.write_table(STRUCTS, tmp_path / "s.parquet")
    batch, dataset = _one_batch(tmp_path, num_workers=num_workers, nulls="fill")
    assert list(batch) == ["id", "st.a", "st.b.c", "m.keys", "m.values"] == dataset.schema.names
    assert batch["st.a"].tolist() == [1, 0, 3]  # a null struct row is null in its leaves
    assert batch["st.b.c"] == ["x", None, None]
    assert batch["m.keys"] == [["k"], None, ["j", "k"]]  # lists of strings: Python lists
    assert _rows(batch["m.values"]) == [[1], [], [2, 3]]
    batch, _ = _one_batch(tmp_path, nulls="fill", columns=["st"])
    assert list(batch) == ["st.a", "st.b.c"]
    batch, dataset = _one_batch(tmp_path, nulls="fill", columns=["st.b", "id"])
    assert list(batch) == ["st.b.c", "id"]
    with pytest.raises(ValueError, match=r"columns \['st.z'\] are not in the data; its columns are \['id', 'st.a'"):
        StructuredDataset(str(tmp_path), num_workers=0, columns=["st.z"])


def test_python_forms_and_timestamp_schema(tmp_path):
    table = pa.table(
        {
            "fsb": pa.array([b"ab", b"cd"], pa.binary(2)),
            "none": pa.nulls(2),
            "nested": pa.array([[[1], [2, 3]], []], pa.list_(pa.list_(pa.int64()))),
            "t": pa.array([0, 1], pa.timestamp("us", tz="Europe/Paris")),
        }
    )
    pq.write_table(table, tmp_path / "p.parquet")
    batch, dataset = _one_batch(tmp_path)
    assert batch["fsb"] == [b"ab", b"cd"] and batch["none"] == [None, None]
    assert batch["nested"] == [[[1], [2, 3]], []]
    assert batch["t"].tolist() == [0, 1] and dataset.schema.field("t").type == pa.timestamp("us", tz="Europe/Paris")


def test_unification_looks_only_at_selected_columns(tmp_path):
    pq.write_table(pa.table({"id": [1], "v": pa.array([[1, 2]], pa.list_(pa.int64(), 2)), "x": [1]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [2], "v": pa.array([[3, 4]], pa.list_(pa.int64())), "x": ["s"]}), tmp_path / "b.parquet")
    with pytest.raises(ValueError, match=r"column 'x' is int64 in .*a.parquet but string in .*b.parquet"):
        StructuredDataset(str(tmp_path), num_workers=0)
    batch, _ = _one_batch(tmp_path, columns=["id", "v"])  # fixed_size_list[2] and list of length-2 rows unify
    assert batch["v"].tolist() == [[1, 2], [3, 4]]


def test_a_list_row_of_another_length_names_the_file(tmp_path):
    pq.write_table(pa.table({"v": pa.array([[1, 2]], pa.list_(pa.int64(), 2))}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"v": pa.array([[3, 4, 5]], pa.list_(pa.int64()))}), tmp_path / "b.parquet")
    with pytest.raises(ValueError, match=r"b\.parquet"):
        _one_batch(tmp_path)


def test_a_missing_numeric_column_is_filled_with_nulls_fill(tmp_path):
    pq.write_table(pa.table({"id": [1, 2], "v": [1.0, 2.0]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [3]}), tmp_path / "b.parquet")
    with pytest.raises(ValueError, match=r"column 'v' \(double\) is missing from .*b.parquet"):
        StructuredDataset(str(tmp_path), num_workers=0)
    batch, _ = _one_batch(tmp_path, nulls="mask")
    assert batch["v"][:2].tolist() == [1.0, 2.0] and math.isnan(batch["v"][2]) and batch["v.valid"].tolist() == [True, True, False]


def test_every_column_without_a_batch_form_is_listed_in_one_error_with_its_files():
    """One error names them all (a file with 29 such columns took 30 attempts before)."""
    from types import SimpleNamespace

    from torch_dataloader_utils.read import column_check, nested
    from torch_dataloader_utils.read.forms import batch_form

    union = pa.sparse_union([pa.field("x", pa.int32())])
    schema = pa.schema([("id", pa.int64()), ("u1", union), ("u2", pa.list_(union)), ("iv", pa.month_day_nano_interval())])
    files = [SimpleNamespace(url="/d/a.orc"), SimpleNamespace(url="/d/b.orc")]
    layouts = [SimpleNamespace(num_rows=1), SimpleNamespace(num_rows=1)]
    catalog = SimpleNamespace(files=files, layouts=layouts, missing_columns=[(), ("u2",)])
    every = nested.batch_columns(schema)
    with pytest.raises(TypeError) as error:
        column_check.check_forms(catalog, every, every)
    message = str(error.value)
    assert message.startswith("3 columns have no batch form")
    assert "column 'u1' (sparse_union<x: int32=0>): it has no tensor form; in /d/a.orc (and 1 more file)" in message
    assert "column 'u2' (list<item: sparse_union<x: int32=0>>): its sparse_union<x: int32=0> values are not supported; in /d/a.orc\n" in message
    assert "leave them out with columns=['id']" in message
    assert batch_form(pa.struct([("a", pa.int8())])) == "python" and batch_form(pa.decimal128(4, 2)) == "tensor"


def test_spellings_of_utc_unify_and_other_zones_are_refused(tmp_path):
    pq.write_table(pa.table({"t": pa.array([0, 1], pa.timestamp("us", tz="UTC"))}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"t": pa.array([2000], pa.timestamp("ns", tz="+00:00"))}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"t": pa.array([3000], pa.timestamp("ns", tz="Etc/UTC"))}), tmp_path / "c.parquet")
    batch, dataset = _one_batch(tmp_path)
    assert dataset.schema.field("t").type == pa.timestamp("ns", tz="UTC")
    assert batch["t"].tolist() == [0, 1000, 2000, 3000]
    pq.write_table(pa.table({"t": pa.array([5], pa.timestamp("ns", tz="Europe/Paris"))}), tmp_path / "d.parquet")
    with pytest.raises(ValueError, match="d.parquet"):
        StructuredDataset(str(tmp_path))


def test_a_top_level_column_named_like_a_leaf_is_refused_unless_one_is_left_out(tmp_path):
    pq.write_table(pa.table({"id": [0, 1], "st.a": [10, 11], "st": pa.array([{"a": 1}, {"a": 2}])}), tmp_path / "s.parquet")
    with pytest.raises(ValueError, match=r"two columns of the batches would be named 'st.a': the top-level column 'st.a' and a leaf of the column 'st'"):
        StructuredDataset(str(tmp_path), num_workers=0)
    batch, _ = _one_batch(tmp_path, columns=["id", "st.a"])  # the top-level column, as docs/types.md says
    assert batch["st.a"].tolist() == [10, 11]
    map_dir = tmp_path / "m"
    map_dir.mkdir()
    pq.write_table(pa.table({"m": pa.array([[("k", 1)], []], pa.map_(pa.string(), pa.int64())), "m.keys": [5, 6]}), map_dir / "m.parquet")
    with pytest.raises(ValueError, match=r"named 'm.keys': a leaf of the column 'm' and the top-level column 'm.keys'"):
        StructuredDataset(str(map_dir), num_workers=0)


def test_extension_columns_arrive_as_what_they_store(tmp_path):
    """UUID, JSON (as pyarrow writes Parquet's logical types), bool8 and fixed_shape_tensor: the
    storage's batch form, the same as a writer that stores the plain type (files of both unify)."""
    import uuid

    ids = [uuid.UUID(int=i).bytes for i in range(4)]
    storage = {
        "u": pa.array(ids, pa.binary(16)),
        "j": pa.array(['{"a": 1}', "[]", "2", "null"]),
        "b": pa.array([1, 0, 1, None], pa.int8()),
        "t": pa.array([[i, i, i, i] for i in range(4)], pa.list_(pa.float32(), 4)),
    }
    kinds = {"u": pa.uuid(), "j": pa.json_(), "b": pa.bool8(), "t": pa.fixed_shape_tensor(pa.float32(), [2, 2])}
    extension = {name: pa.ExtensionArray.from_storage(kinds[name], array) for name, array in storage.items()}
    pq.write_table(pa.table({"id": range(4), **extension}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": range(4, 6), **{k: v[:2] for k, v in storage.items() if k != "b"}, "b": pa.array([True, False])}), tmp_path / "b.parquet")
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path), num_workers=0, batch_size=6, nulls="mask")
    (batch,) = list(loader)
    assert batch["u"] == ids + ids[:2] and batch["j"] == ['{"a": 1}', "[]", "2", "null", '{"a": 1}', "[]"]
    assert batch["b"].dtype == torch.bool and batch["b.valid"].tolist() == [True, True, True, False, True, True]
    assert batch["t"].shape == (6, 4) and batch["t"][3].tolist() == [3.0] * 4
    assert dataset[0]["u"] == ids[0]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_run_end_encoded_columns_arrive_decoded(tmp_path, num_workers):
    """Arrow IPC keeps run-end encoding; batches hold the values (shuffled, by random access, resumed)."""
    import pyarrow.compute as pc
    import pyarrow.feather as feather

    from torch_dataloader_utils.testing import assert_resumes_exactly

    table = pa.table({"id": pa.array(range(60), pa.int64()), "x": pc.run_end_encode(pa.array([i // 10 for i in range(60)], pa.float64()))})
    feather.write_feather(table, str(tmp_path / "a.arrow"), chunksize=20, compression="uncompressed")

    def make():
        return StructuredDataset.create_dataloader(str(tmp_path), format="arrow", batch_size=7, num_workers=num_workers, shuffle=True, shuffle_seed=1)

    reference = assert_resumes_exactly(make, epochs=1, points=[(0, 3)], batch_key=lambda b: tuple(b["id"].tolist()))
    assert sorted(i for batch in reference.batches[0] for i in batch) == list(range(60))
    _, dataset = make()
    assert dataset[[35, 2]]["x"].tolist() == [3.0, 0.0]
