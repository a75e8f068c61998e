"""Apply the dataset's unified schema (catalog/schema.py) to every piece read: project,
add missing columns as nulls, widen types safely, and check what a unit returned."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterator, NamedTuple, Sequence

import pyarrow as pa

from ..catalog.schema import without_views
from ..errors import FileChangedError, RemoteReadError, WideningError
from ..plan.columns import unit_rows_at


@lru_cache(maxsize=64)
def _projected(schema: pa.Schema, columns: tuple[str, ...] | None) -> pa.Schema:
    return project(schema, columns)


def project(schema: pa.Schema, columns: Sequence[str] | None) -> pa.Schema:
    """The unified schema restricted to ``columns`` (in that order); ValueError for an unknown column."""
    if columns is None:
        return schema
    unknown = [c for c in columns if schema.get_field_index(c) < 0]
    if unknown:
        raise ValueError(f"columns {unknown} are in none of the files; the columns are {schema.names}")
    return pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with exactly the columns of ``schema``, in its order and types; missing ones as nulls.

    Casts are safe: a value the target type cannot hold exactly raises ``WideningError``.
    """
    if table.schema.equals(schema, check_metadata=False):
        return table
    arrays = []
    for field in schema:
        index = table.schema.get_field_index(field.name)
        if index < 0:
            arrays.append(pa.nulls(table.num_rows, field.type))
            continue
        column = table.column(index)
        if pa.types.is_run_end_encoded(column.type):  # pyarrow casts no run-end encoded column
            import pyarrow.compute as pc  # (here: importing it costs every worker memory, see test_memory.py)

            column = pc.run_end_decode(column)
        if pa.types.is_dictionary(column.type) and not pa.types.is_dictionary(field.type):
            column = _decoded(column)
        arrays.append(column if column.type == field.type else _widened(column, field))
    return pa.Table.from_arrays(arrays, schema=schema)


def _decoded(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A dictionary column as its values; view values (Polars' Categorical, dictionary<string_view>)
    become large first, as pyarrow has no kernel to take views out of a dictionary."""
    kind = column.type
    values = without_views(kind.value_type)
    if values != kind.value_type:
        column = column.cast(pa.dictionary(kind.index_type, values, kind.ordered))
    return column.cast(values)


def _widened(column: pa.ChunkedArray, field: pa.Field) -> pa.ChunkedArray:
    try:
        return column.cast(field.type, safe=True)
    except pa.ArrowInvalid as error:
        if _holds_nanoseconds(field.type):
            raise WideningError(
                f"column {field.name!r} holds a timestamp that nanoseconds cannot hold (they reach from 1677-09-21 to "
                f"2262-04-11; {error}), and it is read as {field.type}: some file stores it in nanoseconds, in ORC, or "
                "as Parquet INT96 (the legacy type of Spark, Hive and Impala, which pyarrow reads as nanoseconds). Leave "
                "the column out with columns=[...], or store it in microseconds (Spark: spark.sql.parquet."
                "outputTimestampType=TIMESTAMP_MICROS)"
            ) from error
        raise WideningError(
            f"column {field.name!r} is {column.type} here but is read as {field.type} in all files (the files' types "
            f"differ), and a value does not fit: {error}. Cast the column to one type in the data, or leave it out "
            "with columns=[...]"
        ) from error


def _holds_nanoseconds(kind: pa.DataType) -> bool:
    """Whether ``kind`` is, or holds inside a struct, list or map, a timestamp in nanoseconds."""
    if pa.types.is_timestamp(kind):
        return kind.unit == "ns"
    return any(_holds_nanoseconds(kind.field(i).type) for i in range(kind.num_fields))


class _UnitRead(NamedTuple):
    wanted: list[str] | None  # columns to decode (those the file has)
    rows: int  # the unit's rows at planning
    target: pa.Schema | None  # the unified schema, projected
    nulls: pa.Table | None  # the whole unit, when the file has none of the columns


def _unit_read(unit: int, columns: Sequence[str] | None, catalog: Any, file: int) -> _UnitRead:
    missing = catalog.missing_columns[file] if catalog.missing_columns else ()
    wanted = None if columns is None else [c for c in columns if c not in missing]
    rows = unit_rows_at(catalog.layouts, file, unit)
    target = None if catalog.schema is None else _projected(catalog.schema, None if columns is None else tuple(columns))
    nulls = None
    if wanted == [] and target is not None and len(target) > 0:
        nulls = pa.Table.from_arrays([pa.nulls(rows, field.type) for field in target], schema=target)
    return _UnitRead(wanted, rows, target, nulls)


def _check_columns_read(table: pa.Table, wanted: list[str] | None, unit: int) -> None:
    """Every column asked for came back: conform() would otherwise fill an absent one with nulls."""
    absent = [name for name in wanted or () if table.schema.get_field_index(name) < 0]
    if absent:
        raise ValueError(
            f"unit {unit}: the file has columns {absent} but reading them returned columns {table.column_names}. "
            "Please report this with the file's schema; rename the columns or leave them out with columns=[...]"
        )


def _changed(unit: int, seen: str, rows: int, reader: Any = None) -> FileChangedError:
    hint = getattr(reader, "miscount_hint", "")  # text files: the planning scan may count records otherwise
    return FileChangedError(
        f"unit {unit} has {seen} rows but had {rows} when planned: the file changed after planning{hint}. Create the "
        "loader again; with cache_dir, remove its plans/ directory first if the file kept its size and modification time"
    )


def _miscount(reader: Any, unit: int, wanted: list[str] | None, seen: str, rows: int) -> Exception:
    """The error for a streamed unit that gave another row count than its footer: pyarrow's own
    reason when reading the unit whole fails (a damaged file: a column of another length than
    the others), else the file changed after planning (its version was checked when opened, so
    this is a rewrite in place that kept size and time, or a fault of the reader)."""
    try:
        table = reader.read_unit(unit, wanted)
    except (FileChangedError, RemoteReadError) as error:  # the store says what changed or failed
        return error
    except (OSError, pa.ArrowException) as error:
        return ValueError(f"unit {unit} decodes to {seen} rows where its footer says {rows}: {str(error).rstrip('.')}")
    if table.num_rows == rows:
        return ValueError(f"unit {unit} decodes to {seen} rows in batches but {rows} whole; please report this with the file")
    return _changed(unit, str(table.num_rows), rows, reader)


def iter_conformed(
    reader: Any, unit: int, columns: Sequence[str] | None, catalog: Any, file: int, batch_rows: int, first_row: int = 0
) -> Iterator[pa.Table]:
    """``read_conformed``'s rows from ``first_row`` on, in consecutive tables of about ``batch_rows``
    rows, decoded as they are asked for (``reader`` must have ``iter_unit``); the row count is
    checked at the end."""
    plan = _unit_read(unit, columns, catalog, file)
    if plan.nulls is not None:
        yield plan.nulls.slice(first_row)
        return
    seen = first_row
    for table in reader.iter_unit(unit, plan.wanted, batch_rows, first_row):
        seen += table.num_rows
        if seen > plan.rows:
            raise _miscount(reader, unit, plan.wanted, f"more than {plan.rows}", plan.rows)
        _check_columns_read(table, plan.wanted, unit)
        yield table if plan.target is None else conform(table, plan.target)
    if seen != plan.rows:
        raise _miscount(reader, unit, plan.wanted, str(seen), plan.rows)


class UnitRows:
    """Row ranges of one unit, in increasing order, conformed: ``take(start, stop)`` yields the
    rows [start, stop) in tables of about ``batch_rows`` rows. The unit is decoded in one stream
    from the first range's start (seeking there where the reader can), and the rows between
    ranges are decoded and dropped unless the reader can seek past them (``seek_from``); nothing
    after the last range taken is decoded but the rest of its batch, so the unit's row count is
    not checked."""

    def __init__(self, reader: Any, unit: int, columns: Sequence[str] | None, catalog: Any, file: int, batch_rows: int) -> None:
        self._reader, self._unit, self._batch_rows = reader, unit, batch_rows
        self._plan = _unit_read(unit, columns, catalog, file)
        self._batches: Iterator[pa.Table] | None = None
        self._held: pa.Table | None = None  # decoded rows from ``_row`` on, not yet taken
        self._row = 0

    def take(self, start: int, stop: int) -> Iterator[pa.Table]:
        plan = self._plan
        if plan.nulls is not None:
            yield plan.nulls.slice(start, stop - start)
            return
        self._start_at(start, stop)
        while self._row < stop:
            table = self._held if self._held is not None else next(self._batches, None)  # type: ignore[arg-type]
            self._held = None
            if table is None:
                raise _changed(self._unit, f"{self._row} (fewer than {stop})", plan.rows, self._reader)
            if self._row + table.num_rows <= start:
                self._row += table.num_rows
                continue
            if self._row < start:
                table, self._row = table.slice(start - self._row), start
            if self._row + table.num_rows > stop:
                table, self._held = table.slice(0, stop - self._row), table.slice(stop - self._row)
            self._row += table.num_rows
            _check_columns_read(table, plan.wanted, self._unit)
            yield table if plan.target is None else conform(table, plan.target)

    def _decode_rows(self, start: int, stop: int) -> int:
        """Rows per decoded batch of a stream that starts at ``start`` for a range to ``stop``:
        the reader decodes whole batches, so the first one does not reach past the range (which
        may be followed by rows to skip)."""
        return max(1, min(self._batch_rows, stop - start))

    def _start_at(self, start: int, stop: int) -> None:
        if self._batches is None:
            self._batches, self._row = self._reader.iter_unit(self._unit, self._plan.wanted, self._decode_rows(start, stop), start), start
        elif start > self._row + (self._held.num_rows if self._held is not None else 0):
            seek = getattr(self._reader, "seek_from", None)
            jumped = seek(self._unit, self._plan.wanted, self._decode_rows(start, stop), start, start - self._row) if seek is not None else None
            if jumped is not None:
                self._batches, self._row, self._held = jumped, start, None


def read_conformed(reader: Any, unit: int, columns: Sequence[str] | None, catalog: Any, file: int) -> pa.Table:
    """Read one unit of ``catalog`` file ``file`` and conform it to the unified schema (projected).

    A unit that lacks every requested column is not read: its rows are nulls. A unit whose row
    count differs from its footer's (the file changed after planning) raises FileChangedError.
    """
    plan = _unit_read(unit, columns, catalog, file)
    if plan.nulls is not None:
        return plan.nulls
    table = reader.read_unit(unit, plan.wanted)
    if table.num_rows != plan.rows:
        raise _changed(unit, str(table.num_rows), plan.rows, reader)
    _check_columns_read(table, plan.wanted, unit)
    return table if plan.target is None else conform(table, plan.target)


def read_rows_conformed(reader: Any, unit: int, columns: Sequence[str] | None, catalog: Any, file: int, start: int, stop: int) -> tuple[int, pa.Table] | None:
    """At least rows [start, stop) of a unit, conformed as ``read_conformed``'s, from
    ``reader.read_rows`` (Parquet: only the pages that hold them): (the first row, the rows);
    None when the reader cannot read them so."""
    plan = _unit_read(unit, columns, catalog, file)
    if plan.nulls is not None:
        return start, plan.nulls.slice(start, stop - start)
    decoded = reader.read_rows(unit, plan.wanted, start, stop)
    if decoded is None:
        return None
    if decoded.unit_rows != plan.rows:
        raise _changed(unit, str(decoded.unit_rows), plan.rows, reader)
    _check_columns_read(decoded.table, plan.wanted, unit)
    return decoded.first, decoded.table if plan.target is None else conform(decoded.table, plan.target)
