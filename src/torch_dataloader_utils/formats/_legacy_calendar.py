"""Private: dates and timestamps stored in the hybrid Julian/Gregorian calendar, as Spark before 3.0
(and Spark's LEGACY rebase mode) writes them to Parquet and ORC's Java writer (Spark, Hive) to
ORC: a day before 1582-10-15 counted as the Julian calendar counts it. Spark and Hive convert
them when reading, pyarrow does not: 1000-01-01 would come out as 1000-01-06. This module
converts them to the proleptic Gregorian calendar Arrow counts in, the date kept as written.

A timestamp's day is converted in UTC. Spark converts in the writer's time zone, which gives
another result only for times within the zone's offset of a day where the two calendars' distance
changes (once a century before 1582).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from ._parquet_leaves import ELEMENT, KEY, VALUE, Path, leaf_paths

#: 1582-10-15, the first day of the Gregorian calendar, in days since 1970-01-01: both calendars agree from it on
GREGORIAN_START = -141427
_JULIAN_DAY_OF_EPOCH = 2440588  # the Julian day number of 1970-01-01
_PER_DAY = {"s": 86_400, "ms": 86_400_000, "us": 86_400_000_000, "ns": 86_400_000_000_000}

SPARK_VERSION = b"org.apache.spark.version"
SPARK_LEGACY_DATETIME = b"org.apache.spark.legacyDateTime"  # dates and INT64 timestamps written in the hybrid calendar
SPARK_LEGACY_INT96 = b"org.apache.spark.legacyINT96"  # INT96 timestamps written so


def proleptic_days(days: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of the hybrid calendar -> of the proleptic Gregorian calendar (the
    same year, month and day); days from 1582-10-15 on are the same in both."""
    early = days < GREGORIAN_START
    if not early.any():
        return days
    out = days.astype(np.int64)
    c = out[early] + _JULIAN_DAY_OF_EPOCH + 32082  # Julian day number -> Julian calendar date
    d = (4 * c + 3) // 1461
    e = c - (1461 * d) // 4
    m = (5 * e + 2) // 153
    day = e - (153 * m + 2) // 5 + 1
    month = m + 3 - 12 * (m // 10)
    year = d - 4800 + m // 10
    year = year - (month <= 2)  # the date -> proleptic Gregorian days (civil-from-days, inverted)
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + np.where(month > 2, -3, 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    out[early] = era * 146097 + day_of_era - 719468
    return out


def _rebased(array: pa.Array) -> pa.Array:
    kind = array.type
    per_day = 1 if pa.types.is_date32(kind) else _PER_DAY[kind.unit]
    storage = pa.int32() if pa.types.is_date32(kind) else pa.int64()
    values = array.view(storage).to_numpy(zero_copy_only=False) if not array.null_count else array.view(storage).fill_null(0).to_numpy()
    if not len(values) or values.min() >= GREGORIAN_START * per_day:
        return array
    days = values.astype(np.int64) // per_day
    moved = proleptic_days(days) * per_day + (values.astype(np.int64) - days * per_day)
    mask = array.is_null().to_numpy(zero_copy_only=False) if array.null_count else None
    return pa.array(moved.astype(storage.to_pandas_dtype()), storage, mask=mask).view(kind)


def _is_date_or_time(kind: pa.DataType) -> bool:
    return pa.types.is_date32(kind) or pa.types.is_timestamp(kind)


def _rebased_column(array: pa.Array, path: Path, leaves: frozenset[Path], above: frozenset[Path]) -> pa.Array:
    """``array`` (the column at ``path``) with its leaves among ``leaves`` converted; ``above``
    holds every path with a leaf to convert below it, so untouched branches are kept as they are."""
    kind = array.type
    if isinstance(array, pa.ExtensionArray):  # (leaf_paths looks through it too)
        return pa.ExtensionArray.from_storage(kind, _rebased_column(array.storage, path, leaves, above))
    if path in leaves and _is_date_or_time(kind):
        return _rebased(array)
    if path not in above:
        return array
    nulls = array.is_null() if array.null_count else None
    if pa.types.is_struct(kind):
        children = [_rebased_column(child, (*path, field.name), leaves, above) for child, field in zip(array.flatten(), kind)]
        return pa.StructArray.from_arrays(children, fields=list(kind), mask=nulls)
    if pa.types.is_fixed_size_list(kind):
        size = kind.list_size  # (flatten() leaves out the values of null lists)
        values = array.values.slice(array.offset * size, len(array) * size)
        return pa.FixedSizeListArray.from_arrays(_rebased_column(values, (*path, ELEMENT), leaves, above), type=kind, mask=nulls)
    if array.offset or array.offsets[0].as_py():  # pyarrow builds lists with nulls only from offsets that start at 0
        array = pa.concat_arrays([array])
    if pa.types.is_map(kind):
        keys = _rebased_column(array.keys, (*path, KEY), leaves, above)
        items = _rebased_column(array.items, (*path, VALUE), leaves, above)
        return pa.MapArray.from_arrays(array.offsets, keys, items, type=kind, mask=nulls)
    values = _rebased_column(array.values, (*path, ELEMENT), leaves, above)
    return type(array).from_arrays(array.offsets, values, type=kind, mask=nulls)


def rebase(table: pa.Table, leaves: frozenset[Path]) -> pa.Table:
    """``table`` with the dates and timestamps at ``leaves`` (top-level or nested) in the proleptic calendar."""
    above = frozenset(leaf[:depth] for leaf in leaves for depth in range(1, len(leaf)))
    for name in {leaf[0] for leaf in leaves}:
        index = table.schema.get_field_index(name)
        if index >= 0:
            column = table.column(index)
            chunks = [_rebased_column(chunk, (name,), leaves, above) for chunk in column.chunks]
            table = table.set_column(index, table.schema.field(index), pa.chunked_array(chunks, column.type))
    return table


def spark_hybrid_columns(footer: Any) -> frozenset[Path]:
    """The date and timestamp leaves of a Parquet file (``footer``: its ``FileMetaData``) that
    Spark wrote in the hybrid calendar, top-level and nested, by Spark's own rule: every date and
    timestamp of a file from Spark before 3.0; from a later Spark, dates and INT64 timestamps when
    the footer says ``legacyDateTime``, INT96 ones when it says ``legacyINT96``. Timestamps
    without a time zone (``TIMESTAMP_NTZ``) Spark never converts."""
    metadata = footer.metadata or {}
    version = metadata.get(SPARK_VERSION)
    if version is None:
        return frozenset()
    old = version.decode(errors="replace").split(".")[0] in ("1", "2")
    dates_and_int64 = old or SPARK_LEGACY_DATETIME in metadata
    int96 = old or SPARK_LEGACY_INT96 in metadata
    leaves = [leaf for field in footer.schema.to_arrow_schema() for leaf in leaf_paths(field.type, (field.name,))]
    if len(leaves) != footer.num_columns:  # not laid out as pyarrow reads it: nothing to match the leaves by
        return frozenset()
    paths = set()
    for index, (path, kind) in enumerate(leaves):
        if not _is_date_or_time(kind):
            continue
        column = footer.schema.column(index)
        logical = json.loads(column.logical_type.to_json()) if column.logical_type is not None else {}
        zoned = logical.get("Type") == "Date" or (logical.get("Type") == "Timestamp" and logical.get("isAdjustedToUTC", True))
        if (column.physical_type == "INT96" and int96) or (column.physical_type != "INT96" and zoned and dates_and_int64):
            paths.add(path)
    return frozenset(paths)


def date_leaves(schema: pa.Schema) -> frozenset[Path]:
    """Every date leaf of ``schema``, top-level and nested (an ORC file's, in the hybrid calendar)."""
    return frozenset(path for field in schema for path, kind in leaf_paths(field.type, (field.name,)) if pa.types.is_date32(kind))


class HybridCalendarReader:
    """A unit reader whose dates and timestamps at ``columns`` (leaf paths) are converted (``rebase``) as read."""

    def __init__(self, reader: Any, columns: frozenset[Path]):
        self._reader = reader
        self._columns = columns

    def read_unit(self, unit: int, columns: list[str] | None) -> pa.Table:
        return rebase(self._reader.read_unit(unit, columns), self._columns)

    def iter_unit(self, unit: int, columns: list[str] | None, batch_rows: int, first_row: int = 0) -> Iterator[pa.Table]:
        return (rebase(table, self._columns) for table in self._reader.iter_unit(unit, columns, batch_rows, first_row))

    def seek_from(self, unit: int, columns: list[str] | None, batch_rows: int, row: int, skipped: int) -> Iterator[pa.Table] | None:
        tables = self._reader.seek_from(unit, columns, batch_rows, row, skipped)
        return None if tables is None else (rebase(table, self._columns) for table in tables)

    def read_rows(self, unit: int, columns: list[str] | None, start: int, stop: int) -> Any:
        decoded = self._reader.read_rows(unit, columns, start, stop)
        return None if decoded is None else decoded._replace(table=rebase(decoded.table, self._columns))
