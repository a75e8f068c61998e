"""A table's data files read as the table sees them: rows its snapshot deleted (or a row filter
dropped) left out, columns named as the table's schema names them, and partition values a file
does not store added.

``TableFileFormat`` wraps a plain format (``formats/``): the units stay the file's row groups or
stripes, but each unit's row count is the count of rows the table keeps, so the planner, the
splits and an exact resume work on those rows as on a plain file's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ..catalog.schema import without_views
from ..formats import FileFormat, UnitReader
from ..plan.splits import FileLayout
from .defaults import fill_defaults, with_defaults
from .nested import stored_path, with_children

FIELD_ID = b"PARQUET:field_id"


@dataclass
class TableFile:
    """What a table adds to one data file: the rows it drops (sorted positions in the file), how its
    stored fields are matched to the table's (by field id; None: by name) and constant columns
    (Delta partitions)."""

    path: str  # as the table names it (delete files and messages use this)
    dropped: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # field id -> the field's name in the schema read with, for every field (a top-level column's, a
    # struct field's: renames inside structs are followed too). Iceberg's ids; Delta column mapping's
    field_names: Mapping[int, str] | None = None
    constants: dict[str, pa.Scalar] = field(default_factory=dict)
    # Iceberg: the table's name mapping (a stored name -> field id) for columns written without field ids
    mapped_ids: Mapping[str, int] | None = None
    # Iceberg: identity partition values, for a file that does not store its partition columns (imported files)
    partition_values: dict[str, pa.Scalar] = field(default_factory=dict)
    # Delta column mapping mode "name": a stored field's path (``stored_path``) of physical names ->
    # its field id; fields are matched by these names, the files' own field ids are not used
    physical_ids: Mapping[tuple[str, ...], int] | None = None
    # Iceberg: initial defaults by the field's path of table names, for rows written before the field (tables/defaults.py)
    defaults: Mapping[tuple[str, ...], pa.Scalar] = field(default_factory=dict)

    def value_if_absent(self, name: str) -> pa.Scalar | None:
        """Column ``name``'s value in every row when the file does not store it: a constant, an
        identity partition value or the column's default; None: nulls."""
        for values in (self.constants, self.partition_values):
            if name in values:
                return values[name]
        return self.defaults.get((name,))

    def stored_id(self, item: pa.Field, path: tuple[str, ...]) -> int | None:
        """The field id of the stored field ``item`` at ``path`` (``stored_path``), None if unknown."""
        if self.physical_ids is not None:
            return self.physical_ids.get(path)
        raw = (item.metadata or {}).get(FIELD_ID)
        if raw is not None:
            return int(raw)
        return self.mapped_ids.get(item.name) if self.mapped_ids is not None and len(path) == 1 else None


def named_as_table(kind: pa.DataType, file: TableFile, path: tuple[str, ...]) -> pa.DataType:
    """``kind``, the stored type of the field at ``path``, with every struct field whose id the table
    knows named as the table names it, and no field metadata (neither changes the memory layout, so
    arrays of ``kind`` can be viewed as the result)."""
    names = file.field_names or {}

    def child(item: pa.Field, index: int) -> pa.Field:
        inner = stored_path(path, kind, index)
        ident = file.stored_id(item, inner) if pa.types.is_struct(kind) else None  # (a list's or map's fields keep their names)
        name = names.get(ident, item.name) if ident is not None else item.name
        return pa.field(name, named_as_table(item.type, file, inner), item.nullable)  # (the writer's field ids left out)

    return with_children(kind, child)


def viewed_as(column: pa.ChunkedArray, kind: pa.DataType) -> pa.ChunkedArray:
    """``column`` as ``kind``, a type of the same layout (``named_as_table``), without a copy."""
    return pa.chunked_array([chunk.view(kind) for chunk in column.chunks], kind)


def column_names(schema: pa.Schema, file: TableFile, table_names: set[str]) -> dict[str, str]:
    """The file's column -> the table's name for it; columns the table does not have are left out."""
    ids = file.field_names
    by_id = ids is not None and (file.physical_ids is not None or file.mapped_ids is not None)
    names = {}
    for column in schema:
        ident = None if ids is None else file.stored_id(column, (column.name,))
        if ids is not None and ident is not None:
            name = ids.get(ident)
        elif by_id:
            name = None
        else:  # a file written without field ids and no name mapping (Iceberg: added files; Delta without column mapping): by name
            name = column.name if column.name in table_names else None
        if name is not None and name not in file.constants:
            names[column.name] = name
    return names


@dataclass
class TableFooter:
    """The wrapped format's footer, and what the table changes about the file."""

    footer: Any
    file: TableFile
    names: dict[str, str]  # file column -> table column
    unit_starts: np.ndarray  # first row of each unit in the file (and the file's row count last)
    schema: pa.Schema  # the file's schema as the table names it (constants included)
    constants: dict[str, pa.Scalar]  # columns added with one value: the file's constants, and partition values it does not store
    renamed_inside: dict[str, pa.DataType] = field(default_factory=dict)  # table column -> its type with struct fields renamed
    cast_to: dict[str, pa.DataType] = field(default_factory=dict)  # table column -> the table's timestamp type, where the file's differs
    # table column -> (its type with struct fields added for their defaults, those fields' values)
    filled: dict[str, tuple[pa.DataType, dict[tuple[str, ...], pa.Scalar]]] = field(default_factory=dict)


class TableFileFormat:
    """A ``FileFormat`` over a plain one for a table's data files (``files`` by the path the
    filesystem uses)."""

    def __init__(self, base: FileFormat, files: dict[str, TableFile], table_schema: pa.Schema):
        self.base = base
        self.name = base.name
        self.suffixes = base.suffixes
        self.streams_units = base.streams_units
        self.files = files
        self.table_schema = table_schema

    def read_footer(self, fs: Any, path: str, size: int, url: str) -> tuple[FileLayout, Any]:
        """The units' rows after the table's drops, and a ``TableFooter``."""
        layout, footer = self.base.read_footer(fs, path, size, url)
        file = self.files[path]
        starts = np.concatenate([[0], np.cumsum(layout.unit_rows, dtype=np.int64)])
        if len(file.dropped) and file.dropped[-1] >= starts[-1]:
            raise ValueError(f"{file.path}: the table deletes row {int(file.dropped[-1])} but the file has {int(starts[-1])} rows")
        dropped = np.diff(np.searchsorted(file.dropped, starts))
        kept = tuple(int(rows - gone) for rows, gone in zip(layout.unit_rows, dropped))
        base_schema = self.base.schema(fs, path, footer)
        names = column_names(base_schema, file, set(self.table_schema.names))
        columns = []
        renamed_inside: dict[str, pa.DataType] = {}
        cast_to: dict[str, pa.DataType] = {}
        filled: dict[str, tuple[pa.DataType, dict[tuple[str, ...], pa.Scalar]]] = {}
        for stored in (c for c in base_schema if c.name in names):
            name = names[stored.name]
            kind = stored.type if file.field_names is None else named_as_table(stored.type, file, (stored.name,))
            if not kind.equals(stored.type, check_metadata=True):
                renamed_inside[name] = kind
            logged = self._logged_type(name)
            if logged is not None and pa.types.is_timestamp(kind) and pa.types.is_timestamp(logged) and kind != logged:
                kind = cast_to[name] = logged  # writers store one timestamp type otherwise (Spark: INT96, nanoseconds)
            if file.defaults:
                with_fields, added = with_defaults(kind, logged, (name,), file.defaults)
                if added:
                    kind, filled[name] = with_fields, (with_fields, added)
            columns.append(pa.field(name, kind))
        stored = set(names.values())
        absent = (name for name in self.table_schema.names if name not in stored)
        constants = {name: value for name in absent if (value := file.value_if_absent(name)) is not None}
        constants.update(file.constants)
        columns += [pa.field(name, self._type(name, value)) for name, value in constants.items()]
        table_footer = TableFooter(footer, file, names, starts, pa.schema(columns), constants, renamed_inside, cast_to, filled)
        return FileLayout(layout.path, layout.size, kept, layout.unit_bytes), table_footer

    def _logged_type(self, name: str) -> pa.DataType | None:
        index = self.table_schema.get_field_index(name)
        return self.table_schema.field(index).type if index >= 0 else None

    def _type(self, name: str, value: pa.Scalar) -> pa.DataType:
        logged = self._logged_type(name)
        return value.type if logged is None or isinstance(logged, pa.BaseExtensionType) else logged  # (files store a uuid's bytes)

    def schema(self, fs: Any, path: str, footer: TableFooter) -> pa.Schema:
        """The file's schema as the table names it."""
        return footer.schema

    def null_counts(self, footer: TableFooter, names: Sequence[str]) -> dict[str, int]:
        """Nulls per column among ``names`` where planning knows them: every kept row of a null
        constant (a null partition value); a stored column's statistics when the file drops no row."""
        file = footer.file
        kept = int(footer.unit_starts[-1]) - len(file.dropped)
        counts = {name: kept for name in names if name in footer.constants and not footer.constants[name].is_valid}
        base_counts = getattr(self.base, "null_counts", None)
        if base_counts is not None and not len(file.dropped):
            physical = {table: raw for raw, table in footer.names.items()}
            stored = base_counts(footer.footer, [physical[name] for name in names if name in physical])
            counts.update({footer.names[raw]: count for raw, count in stored.items()})
        return counts

    def stored_row(self, footer: TableFooter, row: int) -> int:
        """The file's own number of the ``row``-th row the table keeps (its drops counted back in)."""
        return physical_row(footer.file.dropped, row)

    def open(self, fs: Any, path: str, footer: TableFooter, use_threads: bool) -> TableFileReader:
        return TableFileReader(self.base.open(fs, path, footer.footer, use_threads), footer)


class TableFileReader:
    """Reads units of a table's data file: drops applied, columns renamed, constants added."""

    def __init__(self, reader: UnitReader, footer: TableFooter):
        self._reader = reader
        self._footer = footer
        self._physical = {table: raw for raw, table in footer.names.items()}

    def _unit_dropped(self, unit: int) -> np.ndarray:
        """Positions dropped in ``unit``, relative to its first row."""
        starts, dropped = self._footer.unit_starts, self._footer.file.dropped
        lo, hi = np.searchsorted(dropped, [starts[unit], starts[unit + 1]])
        return dropped[lo:hi] - starts[unit]

    def _wanted(self, columns: list[str] | None) -> list[str]:
        names = list(self._footer.schema.names) if columns is None else columns
        return [self._physical[name] for name in names if name in self._physical]

    def _finish(self, table: pa.Table, columns: list[str] | None) -> pa.Table:
        table = table.rename_columns([self._footer.names[name] for name in table.column_names])
        for name, kind in self._footer.renamed_inside.items():
            index = table.schema.get_field_index(name)
            if index >= 0:
                table = table.set_column(index, pa.field(name, kind), viewed_as(table.column(index), kind))
        for name, kind in self._footer.cast_to.items():
            index = table.schema.get_field_index(name)
            if index >= 0:
                table = table.set_column(index, pa.field(name, kind), table.column(index).cast(kind))
        for name, (kind, added) in self._footer.filled.items():
            index = table.schema.get_field_index(name)
            if index >= 0:
                table = table.set_column(index, pa.field(name, kind), fill_defaults(table.column(index), kind, added, (name,)))
        for name, value in self._footer.constants.items():
            if columns is None or name in columns:
                column = self._footer.schema.field(name)
                table = table.append_column(column, pa.repeat(value, table.num_rows).cast(column.type))
        order = self._footer.schema.names if columns is None else columns
        return table.select([name for name in order if name in table.column_names])

    def read_unit(self, unit: int, columns: list[str] | None) -> pa.Table:
        table = self._reader.read_unit(unit, self._wanted(columns))
        gone = self._unit_dropped(unit)
        if len(gone):
            table = _without_rows(table, gone)
        return self._finish(table, columns)

    def iter_unit(self, unit: int, columns: list[str] | None, batch_rows: int, first_row: int = 0) -> Iterator[pa.Table]:
        """The unit's kept rows from kept row ``first_row`` on, decoded in batches (see ``StreamingUnitReader``)."""
        gone = self._unit_dropped(unit)
        row = physical_row(gone, first_row)
        for table in self._reader.iter_unit(unit, self._wanted(columns), batch_rows, row):  # type: ignore[attr-defined]
            lo, hi = np.searchsorted(gone, [row, row + table.num_rows])
            if hi > lo:
                table = _without_rows(table, gone[lo:hi] - row)
            row += table.num_rows + int(hi - lo)
            if table.num_rows:
                yield self._finish(table, columns)


def physical_row(gone: np.ndarray, kept_row: int) -> int:
    """The row holding kept row ``kept_row`` (``gone``: the rows dropped, sorted; of a unit or a file)."""
    row = kept_row
    while True:  # each round adds the rows dropped before the candidate; it stops at a kept row
        candidate = kept_row + int(np.searchsorted(gone, row, side="right"))
        if candidate == row:
            return row
        row = candidate


def _without_rows(table: pa.Table, gone: np.ndarray) -> pa.Table:
    """``table`` without its rows ``gone``. View columns (delta-rs writes ``string_view`` when it
    rewrites a file) become large first, as batches have them: pyarrow cannot filter views."""
    for index, column in enumerate(table.schema):
        kind = without_views(column.type)
        if kind != column.type and not pa.types.is_dictionary(kind):
            table = table.set_column(index, column.with_type(kind), table.column(index).cast(kind))
    keep = np.ones(table.num_rows, dtype=bool)
    keep[gone] = False
    return table.filter(pa.array(keep))
