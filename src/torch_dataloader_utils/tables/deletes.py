"""Rows a table drops from its data files, found at planning so that every unit's row count is exact:
Iceberg position deletes, Delta deletion vectors, and rows a row filter does not match.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .defaults import fill_defaults, with_defaults
from .files import TableFile, column_names, named_as_table, viewed_as

#: Iceberg's reserved field ids of a position delete file's columns
DELETE_FILE_PATH_ID = 2147483546
DELETE_POS_ID = 2147483545


def merge_dropped(*positions: np.ndarray) -> np.ndarray:
    """Sorted unique positions of all the arrays (a sort and a neighbour compare: much faster than
    ``np.unique``'s hashing on the already sorted arrays this mostly gets)."""
    parts = [np.asarray(p, dtype=np.int64) for p in positions if len(p)]
    if not parts:
        return np.zeros(0, dtype=np.int64)
    merged = np.sort(np.concatenate(parts) if len(parts) > 1 else parts[0])
    distinct = np.empty(len(merged), dtype=bool)
    distinct[0] = True
    np.not_equal(merged[1:], merged[:-1], out=distinct[1:])
    return merged if distinct.all() else merged[distinct]


def _storage_path(fs: Any, path: str) -> str:
    return fs._strip_protocol(path)


class PositionDeletes:
    """Position delete files read once each (one may name rows of many data files)."""

    def __init__(self, fs: Any):
        self._fs = fs
        self._read: dict[str, dict[str, np.ndarray]] = {}

    def _positions_by_file(self, delete_path: str) -> dict[str, np.ndarray]:
        found = self._read.get(delete_path)
        if found is None:
            with self._fs.open(_storage_path(self._fs, delete_path), "rb") as handle:
                table = pq.read_table(handle)
            by_id = {int((f.metadata or {}).get(b"PARQUET:field_id", -1)): f.name for f in table.schema}
            path_column = by_id.get(DELETE_FILE_PATH_ID, "file_path")
            pos_column = by_id.get(DELETE_POS_ID, "pos")
            if path_column not in table.column_names or pos_column not in table.column_names:
                raise ValueError(f"{delete_path} is not an Iceberg position delete file: its columns are {table.column_names}")
            paths = table.column(path_column).to_numpy(zero_copy_only=False)
            positions = table.column(pos_column).to_numpy(zero_copy_only=False).astype(np.int64)
            found = {str(name): positions[paths == name] for name in np.unique(paths)}
            self._read[delete_path] = found
        return found

    def of(self, data_path: str, delete_paths: Iterable[str]) -> np.ndarray:
        """Sorted unique positions of ``data_path`` that the delete files delete."""
        return merge_dropped(*(self._positions_by_file(d).get(data_path, np.zeros(0, dtype=np.int64)) for d in delete_paths))


def filter_columns(expression: pc.Expression, table_schema: pa.Schema) -> list[str]:
    """The table's columns a pyarrow expression may read: those its text names (pyarrow exposes no
    accessor for an expression's fields; reading one column too many costs only time)."""
    text = str(expression)
    return [name for name in table_schema.names if name in text]


def unmatched_rows(fs: Any, file: TableFile, expression: pc.Expression, table_schema: pa.Schema) -> np.ndarray:
    """Positions of ``file``'s rows that ``expression`` does not keep (false or null). Only the
    columns it names are read, as the table names them; a column the file lacks is nulls, a
    partition column its constant (Iceberg: a partition value the file does not store)."""
    columns = filter_columns(expression, table_schema)
    with fs.open(_storage_path(fs, file.path), "rb") as handle:
        parquet = pq.ParquetFile(handle)
        names = column_names(parquet.schema_arrow, file, set(table_schema.names))
        physical = {table: raw for raw, table in names.items()}
        read = parquet.read(columns=[physical[c] for c in columns if c in physical])
        rows = parquet.metadata.num_rows
    arrays = {"__tdu_row": pa.array(np.arange(rows, dtype=np.int64))}
    for name in columns:
        kind = table_schema.field(name).type
        if name in physical:
            column = read.column(physical[name])
            if file.field_names is not None:  # struct fields renamed since the file was written
                column = viewed_as(column, named_as_table(column.type, file, (physical[name],)))
            with_fields, added = with_defaults(column.type, kind, (name,), file.defaults)
            if added:
                column = fill_defaults(column, with_fields, added, (name,))
            arrays[name] = column.cast(kind)
        elif (value := file.value_if_absent(name)) is not None:
            arrays[name] = pa.repeat(value, rows).cast(kind)
        else:
            arrays[name] = pa.nulls(rows, kind)
    try:
        kept = pa.table(arrays).filter(expression).column("__tdu_row").to_numpy()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError) as error:
        raise ValueError(f"the row filter {expression} cannot be evaluated on {file.path}: {error}; the table's columns are {table_schema.names}") from error
    keep = np.zeros(rows, dtype=bool)
    keep[kept] = True
    return np.flatnonzero(~keep).astype(np.int64)
