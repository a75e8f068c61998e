"""Arrow IPC files (.arrow, .ipc, .feather v2) in the file or the stream format: record batches
are the units, with row counts from the batches' metadata (planning maps a local file into memory
and reads no column). A stream has no footer: planning walks its messages for each batch's
offset (``_arrow_stream``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import pyarrow as pa

from ..errors import UnsupportedFileError
from ..plan.splits import FileLayout
from ..storage.paths import is_local
from . import FORMATS
from ._arrow_stream import StreamIndex, StreamReader, read_options, release_fetched, scan_stream
from .io import open_input

#: what a file read as Arrow IPC may be instead, by its first bytes, and what to do about it
_OTHER_KINDS = (
    (b"FEA1", "a Feather v1 file", "convert it with pyarrow.feather.write_feather(table, path)"),
    (b"PAR1", "a Parquet file", "read it with format='parquet'"),
    (b"ORC", "an ORC file", "read it with format='orc'"),
)
_SCAN_READAHEAD = 8 << 20  # a remote stream's planning scan fetches it in blocks of this size


def _planning_source(fs: Any, path: str) -> Any:
    """Planning reads a local file memory-mapped: the batches' metadata, not their columns."""
    return pa.memory_map(path, "r") if is_local(fs) else open_input(fs, path, _SCAN_READAHEAD)


def _refuse_other_kinds(source: Any, error: Exception) -> None:
    """For a file pyarrow does not open as an IPC file: raise what it is instead, or ``error``
    for a damaged IPC file (it starts with the file format's magic); return for a stream. Leaves
    ``source`` at its start."""
    source.seek(0)
    head = bytes(source.read(8))
    source.seek(0)
    if head.startswith(b"ARROW1"):
        raise error
    for magic, kind, fix in _OTHER_KINDS:
        if head.startswith(magic):
            raise UnsupportedFileError(f"it is {kind}, not Arrow IPC (the file or stream format, or Feather v2): {fix}") from error


class _FileReader:
    """An IPC file's batches, read with pyarrow's file reader of the columns asked for (a reader
    of all columns would read every column's bytes to select some)."""

    def __init__(self, source: Any):
        self._source = source
        self._readers: dict[tuple[int, ...] | None, pa.ipc.RecordBatchFileReader] = {}

    def get_batch(self, number: int, fields: tuple[int, ...] | None) -> pa.RecordBatch:
        reader = self._readers.get(fields)
        if reader is None:
            reader = self._readers[fields] = pa.ipc.open_file(self._source, options=read_options(fields))
        batch = reader.get_batch(number)
        release_fetched(self._source)
        return batch


class _ArrowReader:
    def __init__(self, reader: _FileReader | StreamReader, schema: pa.Schema):
        self._reader = reader
        self._schema = schema

    def read_unit(self, unit: int, columns: list[str] | None) -> pa.Table:
        fields = None if columns is None else tuple(sorted(self._schema.get_field_index(name) for name in columns))
        batch = self._reader.get_batch(unit, fields)
        if columns is not None:
            batch = batch.select(columns)
        _check_batch(batch)
        return pa.Table.from_batches([batch])


def _check_batch(batch: pa.RecordBatch) -> None:
    """``_check_buffers`` of each column, where the batch as a whole does not validate."""
    try:
        batch.validate(full=True)
    except pa.ArrowInvalid:
        for index in range(batch.num_columns):
            try:
                column = batch.column(index)
            except KeyError:  # a type pyarrow has no Python array for (intervals): fixed-width, its sizes checked as read
                continue
            _check_buffers(column, batch.schema.field(index).name)


#: what full validation says of values that only break a rule of their type, which pyarrow reads
#: as they are (Arrow's own integration files hold such decimals, date64 values and times)
_VALUE_RULES = ("does not fit in precision", "does not represent a whole number of days", "is not within the acceptable range")


def _check_buffers(array: pa.Array, name: str) -> None:
    """Validate ``array`` whole: damaged offsets or dictionary indices would be followed out of its
    buffers, a crash instead of an error. A value against its type's rule (a decimal wider than
    its precision, a date64 that is no whole day) passes; full validation stops at the first
    fault, so a nested column with one is checked child by child."""
    try:
        array.validate(full=True)
        return
    except pa.ArrowInvalid as error:
        fault = error
    kind = array.type
    if pa.types.is_decimal(kind) or pa.types.is_date64(kind) or pa.types.is_time(kind):
        if any(rule in str(fault) for rule in _VALUE_RULES):
            return
    elif pa.types.is_struct(kind):
        array.validate()  # (the struct's own buffers; its children below)
        for index in range(kind.num_fields):
            _check_buffers(array.field(index), f"{name}.{kind.field(index).name}")
        return
    elif _is_list(kind) and "child array" in str(fault):
        _check_buffers(array.values, f"{name} (values)")  # (offsets passed: the fault is in the values)
        return
    raise pa.ArrowInvalid(f"column {name!r}: {fault}") from None


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind) or pa.types.is_map(kind)


class ArrowFooter(NamedTuple):
    """What planning keeps of an Arrow IPC file: its schema and the nulls of each top-level
    column, summed from the record batches' metadata (no data is read for them); for a stream,
    where its messages are (None for the file format)."""

    schema: pa.Schema
    null_counts: dict[str, int]
    stream_index: StreamIndex | None = None


class ArrowIpcFormat:
    """Arrow IPC files: record batches are the units (``FileFormat``)."""

    name = "arrow"
    suffixes = FORMATS["arrow"].suffixes
    streams_units = False

    def read_footer(self, fs: Any, path: str, size: int, url: str) -> tuple[FileLayout, ArrowFooter]:
        """Rows and bytes of every record batch (a remote file's batches are read for them), the
        schema and the nulls per column."""
        stream_index = None
        with _planning_source(fs, path) as source:
            try:
                reader = pa.ipc.open_file(source)
            except pa.ArrowInvalid as error:
                _refuse_other_kinds(source, error)
                reader = None
            if reader is None:
                schema, batches, stream_index = scan_stream(source, url, lambda: _planning_source(fs, path))
            else:
                schema, batches = reader.schema, [reader.get_batch(i) for i in range(reader.num_record_batches)]
            layout = FileLayout(url, size, tuple(b.num_rows for b in batches), tuple(b.get_total_buffer_size() for b in batches))
            nulls = {}
            for i, name in enumerate(schema.names):
                try:
                    nulls[name] = sum(b.column(i).null_count for b in batches)
                except (KeyError, NotImplementedError, pa.ArrowNotImplementedError):  # a type pyarrow has no Python array for (intervals)
                    continue  # its nulls are not known here; the column is refused when it is selected
        return layout, ArrowFooter(schema, nulls, stream_index)

    def schema(self, fs: Any, path: str, footer: ArrowFooter) -> pa.Schema:
        return footer.schema

    def null_counts(self, footer: ArrowFooter, names: Sequence[str]) -> dict[str, int]:
        """Nulls per top-level column among ``names``, from the record batches' metadata."""
        return {name: footer.null_counts[name] for name in names if name in footer.null_counts}

    def nulls_by_column(self, footer: ArrowFooter) -> dict[str, int]:
        """``null_counts`` of every top-level column."""
        return dict(footer.null_counts)

    def open(self, fs: Any, path: str, footer: ArrowFooter, use_threads: bool) -> _ArrowReader:
        """A reader of the file's record batches. Batches are read into memory, not memory-mapped:
        rows of a mapped file rewritten in place would change under the loop, and a file cut
        short would end the process with SIGBUS instead of an error naming it."""
        source = open_input(fs, path)
        reader = _FileReader(source) if footer.stream_index is None else StreamReader(source, footer.stream_index)
        return _ArrowReader(reader, footer.schema)


ARROW = ArrowIpcFormat()
