"""formats/_legacy_calendar.py: dates and timestamps Spark and ORC's Java writer store in the
hybrid Julian/Gregorian calendar are delivered as written, as Spark reads them back (files
Spark wrote: tests/fixtures/spark)."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.errors import WideningError
from torch_dataloader_utils.formats._legacy_calendar import GREGORIAN_START, proleptic_days
from torch_dataloader_utils.testing import assert_resumes_exactly

SPARK = Path(__file__).parent / "fixtures" / "spark"
EPOCH = dt.date(1970, 1, 1)
WRITTEN = {1: dt.date(1000, 1, 1), 2: dt.date(1582, 10, 4), 3: dt.date(1582, 10, 15), 4: dt.date(1, 1, 1), 5: dt.date(1900, 1, 1), 6: dt.date(2024, 5, 1)}
TIMES = {1: dt.time(12), 2: dt.time(0), 3: dt.time(0), 4: dt.time(0), 5: dt.time(0, 0, 1), 6: dt.time(10)}


def _julian_days(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a Julian calendar date (through its Julian day number)."""
    a = (14 - month) // 12
    y, m = year + 4800 - a, month + 12 * a - 3
    return day + (153 * m + 2) // 5 + 365 * y + y // 4 - 32083 - 2440588


def test_hybrid_days_become_the_same_date_in_the_proleptic_calendar():
    rng = random.Random(0)
    dates = [(rng.randint(1, 1582), rng.randint(1, 12), rng.randint(1, 28)) for _ in range(3000)]
    dates = [d for d in dates if d < (1582, 10, 5)]
    got = proleptic_days(np.array([_julian_days(*d) for d in dates], dtype=np.int64))
    assert got.tolist() == [(dt.date(*d) - EPOCH).days for d in dates]
    assert proleptic_days(np.array([_julian_days(1500, 2, 29)]))[0] == (dt.date(1500, 3, 1) - EPOCH).days  # as Spark moves it
    later = np.arange(GREGORIAN_START, GREGORIAN_START + 200_000, dtype=np.int64)
    assert (proleptic_days(later) == later).all()


def _read(name: str, **kwargs) -> dict:
    loader, dataset = StructuredDataset.create_dataloader(str(SPARK / name), format=None, batch_size=10, num_workers=0, output_format="dict", **kwargs)
    (batch,) = list(loader)
    return dict(zip(batch["id"], zip(*(batch[c] for c in batch if c != "id"))))


@pytest.mark.parametrize("name", ["rebase_LEGACY_TIMESTAMP_MICROS.parquet", "rebase_CORRECTED_TIMESTAMP_MICROS.parquet", "rebase_orc.orc"])
def test_spark_dates_read_as_spark_wrote_them(name):
    rows = _read(name, columns=["id", "date"])
    assert {i: date for i, (date,) in rows.items()} == WRITTEN


@pytest.mark.parametrize("name", ["rebase_LEGACY_TIMESTAMP_MICROS.parquet", "rebase_CORRECTED_TIMESTAMP_MICROS.parquet"])
def test_spark_timestamps_in_microseconds_read_as_written(name):
    rows = _read(name, columns=["id", "ts"])
    expected = {i: dt.datetime.combine(date, TIMES[i], dt.timezone.utc) for i, date in WRITTEN.items()}
    assert {i: ts for i, (ts,) in rows.items()} == expected


def test_int96_timestamps_before_1677_are_refused_as_nanoseconds_cannot_hold_them():
    with pytest.raises(WideningError, match="nanoseconds cannot hold"):
        _read("rebase_LEGACY_INT96.parquet", columns=["id", "ts"])
    assert {i: date for i, (date,) in _read("rebase_LEGACY_INT96.parquet", columns=["id", "date"]).items()} == WRITTEN


@pytest.mark.parametrize("name", ["rebase_LEGACY_TIMESTAMP_MICROS.parquet", "rebase_orc.orc"])
def test_random_access_and_a_resume_deliver_the_written_dates(tmp_path, name):
    for copy in range(3):
        (tmp_path / f"{copy}-{name}").write_bytes((SPARK / name).read_bytes())

    def make():
        return StructuredDataset.create_dataloader(str(tmp_path), format=None, batch_size=4, num_workers=2, shuffle=True, columns=["id", "date"])

    loader, dataset = make()
    assert {int(dataset[i]["id"]): int(dataset[i]["date"]) for i in range(len(WRITTEN))} == {i: (d - EPOCH).days for i, d in WRITTEN.items()}
    delivered = sorted((int(i), int(d)) for batch in loader for i, d in zip(batch["id"], batch["date"]))
    assert delivered == sorted((i, (d - EPOCH).days) for i, d in WRITTEN.items() for _ in range(3))
    assert_resumes_exactly(make, epochs=1, batch_key=lambda batch: tuple(batch["date"].tolist()))


def test_files_of_other_writers_are_not_converted(tmp_path):
    import pyarrow.orc as orc
    import pyarrow.parquet as pq

    table = pa.table({"id": [1], "date": pa.array([(dt.date(1000, 1, 1) - EPOCH).days], pa.date32())})
    pq.write_table(table, tmp_path / "a.parquet")
    orc.write_table(table, tmp_path / "b.orc")
    for name in ("a.parquet", "b.orc"):
        loader, _ = StructuredDataset.create_dataloader(str(tmp_path / name), format=None, batch_size=4, num_workers=0, output_format="dict")
        assert next(iter(loader))["date"] == [dt.date(1000, 1, 1)]


def test_every_value_of_a_legacy_file_equals_sparks_own_read_timestamp_ntz_unconverted():
    """Random dates and timestamps from 0001 to 1600, with nulls; Spark converts `timestamp` and
    `date` but never `timestamp_ntz` (it stores it proleptic)."""
    import json

    expected = json.loads((SPARK / "spark_legacy_ntz.read_by_spark.json").read_text())["rows"]
    loader, _ = StructuredDataset.create_dataloader(str(SPARK / "spark_legacy_ntz.parquet"), batch_size=1000, num_workers=0, output_format="arrow")
    (batch,) = list(loader)
    columns = [batch.column(name).cast(pa.int64()) if name != "d" else batch.column(name).cast(pa.int32()).cast(pa.int64()) for name in ("id", "d", "ts", "ntz")]
    got = sorted(zip(*(column.to_pylist() for column in columns)), key=lambda row: row[0])
    assert [list(row) for row in got] == expected and len(expected) == 667


@pytest.mark.parametrize("name", ["rebase_LEGACY_TIMESTAMP_MICROS.parquet"])
def test_filters_on_a_converted_date_column_see_the_written_dates(tmp_path, name):
    """The files' statistics bound the stored days (0001-01-01 stored as a day before year 1, which
    Python's date cannot hold): filters read the converted values instead of trusting them."""
    loader, dataset = StructuredDataset.create_dataloader(str(SPARK / name), format=None, batch_size=10, num_workers=0,
                                                          output_format="dict", columns=["id", "date"], filters=[("date", ">=", dt.date(1000, 1, 3))])  # fmt: skip
    (batch,) = list(loader)
    assert len(dataset) == 4 and sorted(batch["date"]) == sorted(d for d in WRITTEN.values() if d >= dt.date(1000, 1, 3))


def test_a_top_level_column_with_a_dot_in_its_name_is_converted(tmp_path):
    import pyarrow.parquet as pq

    julian = _julian_days(1000, 1, 1)  # as Spark 2 stored 1000-01-01
    table = pa.table({"plain": pa.array([julian], pa.date32()), "a.b": pa.array([julian], pa.date32())})
    pq.write_table(table.replace_schema_metadata({"org.apache.spark.version": "2.4.8"}), tmp_path / "spark2.parquet")
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path / "spark2.parquet"), batch_size=4, num_workers=0, output_format="dict")
    assert next(iter(loader)) == {"plain": [dt.date(1000, 1, 1)], "a.b": [dt.date(1000, 1, 1)]}


def test_orc_stripe_statistics_of_hybrid_dates_do_not_decide_a_filter():
    """Stored 1000-01-06 to 1000-01-15: the statistics said every row matched d >= 1000-01-04."""
    loader, dataset = StructuredDataset.create_dataloader(str(SPARK / "orc_dates_1000.orc"), format="orc", batch_size=20, num_workers=0,
                                                          output_format="dict", filters=[("d", ">=", dt.date(1000, 1, 4))])  # fmt: skip
    (batch,) = list(loader)
    assert len(dataset) == 7 and batch["id"] == [3, 4, 5, 6, 7, 8, 9] and batch["d"][0] == dt.date(1000, 1, 4)


NESTED = ["nested_LEGACY_TIMESTAMP_MICROS.parquet", "nested_LEGACY_INT96.parquet", "nested_CORRECTED_TIMESTAMP_MICROS.parquet", "nested.orc"]
SKIPPED_DAYS = {f"1582-10-{day:02d}" for day in range(5, 15)}  # Spark's JSON prints the ten days the hybrid calendar lacks as 1582-10-15


def _as_spark_prints(value):
    if isinstance(value, dt.datetime):
        value = value.astimezone(dt.timezone.utc)
        return f"{value.year:04d}-{value.month:02d}-{value.day:02d}T{value:%H:%M:%S}.000Z"
    if isinstance(value, dt.date):
        text = f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
        return "1582-10-15" if text in SKIPPED_DAYS else text
    if isinstance(value, dict):
        return {key: _as_spark_prints(item) for key, item in value.items() if item is not None}  # Spark's JSON leaves nulls out
    if isinstance(value, list):
        return [_as_spark_prints(item) for item in value]
    return value


def _spark_leaves(row: dict) -> dict:
    """A row of Spark's JSON as the loader's dict batches name its leaves (structs by dotted names, maps as keys and values)."""
    out = {}
    for name, value in row.items():
        if name == "st":
            out.update({"st.d": value.get("d"), "st.ts": value.get("ts"), "st.inner.d2": value["inner"].get("d2")})
        elif name in ("dm", "km"):
            out.update({f"{name}.keys": list(value), f"{name}.values": list(value.values())})
        else:
            out[name] = value
    return out


@pytest.mark.parametrize("name", NESTED)
def test_dates_and_timestamps_inside_structs_lists_and_maps_read_as_spark_reads_them(name):
    """Spark converts a legacy file's nested dates and timestamps too (a struct's fields, a list's
    elements, a map's keys and values, lists of lists and of structs): every value equals Spark's
    own read. INT96 and ORC timestamps before 1677 cannot be read in nanoseconds, so they are left out."""
    import json

    spark_rows = json.loads((SPARK / "nested.read_by_spark.json").read_text())[name]
    unreadable = ("st", "tl") if "INT96" in name or name.endswith(".orc") else ()
    columns = [column for column in spark_rows[0] if column not in unreadable]
    loader, _ = StructuredDataset.create_dataloader(str(SPARK / name), format=None, batch_size=10, num_workers=0, output_format="dict", columns=columns)
    (batch,) = list(loader)
    got = [{column: values[row] for column, values in batch.items()} for row in range(len(batch["id"]))]
    for ours, spark in zip(sorted(got, key=lambda row: row["id"]), spark_rows, strict=True):
        ours["km.keys"] = [str((key - EPOCH).days) for key in ours["km.keys"]]  # Spark's JSON prints a date key as its day
        assert _as_spark_prints(ours) == _as_spark_prints(_spark_leaves({c: v for c, v in spark.items() if c not in unreadable}))


@pytest.mark.parametrize("name", ["nested_LEGACY_TIMESTAMP_MICROS.parquet", "nested.orc"])
def test_nested_dates_through_workers_a_projection_random_access_and_a_resume(tmp_path, name):
    for copy in range(3):
        (tmp_path / f"{copy}-{name}").write_bytes((SPARK / name).read_bytes())

    def make():
        return StructuredDataset.create_dataloader(str(tmp_path), format=None, batch_size=4, num_workers=2, shuffle=True, columns=["id", "sl", "km", "dl"], output_format="dict")

    loader, dataset = make()
    one_file, _ = StructuredDataset.create_dataloader(str(SPARK / name), format=None, batch_size=10, num_workers=0, columns=["id", "sl", "km", "dl"], output_format="dict")
    (written,) = list(one_file)
    by_id = {written["id"][row]: {column: values[row] for column, values in written.items()} for row in range(len(written["id"]))}
    assert by_id[4]["sl"] == [{"d": dt.date(1, 1, 1), "n": 4}] and by_id[4]["km.keys"] == [dt.date(1, 1, 1)] and by_id[1]["dl"][:2] == [dt.date(1000, 1, 1), dt.date(1000, 1, 2)]
    for index in (3, 10, -1):  # rows sliced out of their chunk: each keeps its own list and map entries
        row = dataset[index]
        assert row == {column: by_id[row["id"]][column] for column in row}
    delivered = sorted(row for batch in loader for row in zip(batch["id"], map(tuple, batch["dl"]), map(tuple, batch["km.keys"])))
    assert delivered == sorted((i, tuple(r["dl"]), tuple(r["km.keys"])) for i, r in by_id.items() for _ in range(3))
    assert_resumes_exactly(make, epochs=1, batch_key=lambda batch: (tuple(batch["id"]), tuple(map(tuple, batch["dl"])), tuple(map(tuple, batch["km.keys"]))))


def test_a_slice_of_nested_columns_is_converted_row_for_row():
    from torch_dataloader_utils.formats._legacy_calendar import ELEMENT, KEY, VALUE, rebase

    julian = _julian_days(1000, 1, 1)
    days = pa.array([julian, julian + 1, None, julian + 2], pa.date32())
    struct = pa.StructArray.from_arrays([days, pa.array([1, 2, 3, 4])], names=["d", "n"], mask=pa.array([False, False, True, False]))
    table = pa.table({
        "s": struct,
        "l": pa.array([[julian], [julian + 1, julian + 2], None, []], pa.list_(pa.date32())),
        "m": pa.array([[(julian, julian)], [(julian + 1, julian + 2)], [], None], pa.map_(pa.date32(), pa.date32())),
        "f": pa.array([[julian, julian], [julian + 1, None], None, [julian + 2, julian + 2]], pa.list_(pa.date32(), 2)),
    }).slice(1, 3)  # fmt: skip
    leaves = frozenset({("s", "d"), ("l", ELEMENT), ("m", KEY), ("m", VALUE), ("f", ELEMENT)})
    day = lambda n: dt.date(1000, 1, 1 + n)  # noqa: E731
    assert rebase(table, leaves).to_pylist() == [
        {"s": {"d": day(1), "n": 2}, "l": [day(1), day(2)], "m": [(day(1), day(2))], "f": [day(1), None]},
        {"s": None, "l": None, "m": [], "f": None},
        {"s": {"d": day(2), "n": 4}, "l": [], "m": None, "f": [day(2), day(2)]},
    ]


def test_a_struct_of_dates_inside_an_extension_type_is_converted():
    from torch_dataloader_utils.formats._legacy_calendar import leaf_paths, rebase

    class Wrapped(pa.ExtensionType):
        def __init__(self, storage):
            super().__init__(storage, "test.wrapped")

        def __arrow_ext_serialize__(self):
            return b""

        @classmethod
        def __arrow_ext_deserialize__(cls, storage_type, serialized):
            return cls(storage_type)

    julian = _julian_days(1000, 1, 1)
    storage = pa.StructArray.from_arrays([pa.array([julian, None], pa.date32())], names=["d"])
    kind = Wrapped(storage.type)
    table = pa.table({"w": pa.ExtensionArray.from_storage(kind, storage)})
    leaves = frozenset(path for path, _ in leaf_paths(kind, ("w",)))
    converted = rebase(table, leaves).column("w").chunk(0)
    assert converted.type == kind and converted.storage.to_pylist() == [{"d": dt.date(1000, 1, 1)}, {"d": None}]


def test_a_nested_int96_timestamp_before_1677_is_refused_naming_nanoseconds():
    with pytest.raises(WideningError, match="column 'st' holds a timestamp that nanoseconds cannot hold"):
        _read("nested_LEGACY_INT96.parquet", columns=["id", "st"])
