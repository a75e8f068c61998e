"""Arrow IPC files (.arrow, .ipc, .feather v2) in the file or the stream format: record batches
are the units, with row counts from the batches' metadata (planning maps a local file into memory
and reads no column). A stream has no footer: planning walks its messages for each batch's
offset."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import pyarrow as pa

from ..errors import UnsupportedFileError
from ..plan.splits import FileLayout
from ..storage.paths import is_local
from . import FORMATS
from ._arrow_stream import StreamIndex, StreamReader, scan_stream
from .io import open_input


def _planning_source(fs: Any, path: str) -> Any:
    """Planning reads a local file memory-mapped: the batches' metadata, not their columns."""
    return pa.memory_map(path, "r") if is_local(fs) else open_input(fs, path)


def _open(fs: Any, path: str, source: Any) -> pa.ipc.RecordBatchFileReader | None:
    """The file's reader, or None for an Arrow IPC stream (read by ``scan_stream``)."""
    try:
        return pa.ipc.open_file(source)
    except pa.ArrowInvalid as error:
        kind = _other_arrow_kind(fs, path)
        if kind is None:
            raise
        if kind == _STREAM:
            return None
        if kind in ("a Parquet file", "an ORC file"):
            raise UnsupportedFileError(f"it is {kind}, not Arrow IPC: read it with format='{kind.split()[1].lower()}'") from error
        raise UnsupportedFileError(
            f"it is {kind}, which is not read (only the Arrow IPC file and stream formats, Feather v2, are): convert it with "
            "pyarrow.feather.write_feather(table, path)"
        ) from error


_STREAM = "an Arrow IPC stream"


def _other_arrow_kind(fs: Any, path: str) -> str | None:
    """What an Arrow file that pyarrow does not open as an IPC file is, from its first bytes:
    None for a damaged IPC file (it starts with the file format's magic)."""
    with fs.open(path, "rb") as file:
        head = file.read(8)
    if head.startswith(b"ARROW1"):
        return None
    for magic, kind in ((b"FEA1", "a Feather v1 file"), (b"PAR1", "a Parquet file"), (b"ORC", "an ORC file")):
        if head.startswith(magic):
            return kind
    return _STREAM  # (a stream's first message: a continuation marker and its length; before Arrow 0.15 the length alone)


class _FileReader:
    """An IPC file's batches, read with pyarrow's file reader of the columns asked for (a reader
    of all columns would read every column's bytes to select some)."""

    def __init__(self, source: Any):
        self._source = source
        self._readers: dict[tuple[int, ...] | None, pa.ipc.RecordBatchFileReader] = {}

    def get_batch(self, number: int, fields: tuple[int, ...] | None) -> pa.RecordBatch:
        reader = self._readers.get(fields)
        if reader is None:
            options = pa.ipc.IpcReadOptions(included_fields=list(fields)) if fields is not None else None
            reader = self._readers[fields] = pa.ipc.open_file(self._source, options=options)
        return reader.get_batch(number)


class _ArrowReader:
    def __init__(self, reader: _FileReader | StreamReader, schema: pa.Schema):
        self._reader = reader
        self._schema = schema

    def read_unit(self, unit: int, columns: list[str] | None) -> pa.Table:
        fields = None if columns is None else tuple(sorted(self._schema.get_field_index(name) for name in columns))
        batch = self._reader.get_batch(unit, fields)
        if columns is not None:
            batch = batch.select(columns)
        _check_buffers(batch)
        return pa.Table.from_batches([batch])


#: what full validation says of values that only break a rule of their type, which pyarrow reads
#: as they are (Arrow's own integration files hold such decimals, date64 values and times)
_VALUE_RULES = ("does not fit in precision", "does not represent a whole number of days", "is not within the acceptable range")


def _check_buffers(batch: pa.RecordBatch) -> None:
    """Validate ``batch`` whole: damaged offsets or dictionary indices would be followed out of its
    buffers, a crash instead of an error. A column whose only fault is a value against its type's
    rule (a decimal wider than its precision, a date64 that is no whole day) passes."""
    try:
        batch.validate(full=True)
    except pa.ArrowInvalid:
        for index in range(batch.num_columns):
            try:
                batch.column(index).validate(full=True)
            except pa.ArrowInvalid as error:
                if not any(rule in str(error) for rule in _VALUE_RULES):
                    raise pa.ArrowInvalid(f"column {batch.schema.field(index).name!r}: {error}") from None


class ArrowFooter(NamedTuple):
    """What planning keeps of an Arrow IPC file: its schema and the nulls of each top-level
    column, summed from the record batches' metadata (no data is read for them); for a stream,
    where its messages are (None for the file format)."""

    schema: pa.Schema
    null_counts: dict[str, int]
    stream: StreamIndex | None = None


class ArrowIpcFormat:
    """Arrow IPC files: record batches are the units (``FileFormat``)."""

    name = "arrow"
    suffixes = FORMATS["arrow"].suffixes
    streams_units = False

    def read_footer(self, fs: Any, path: str, size: int, url: str) -> tuple[FileLayout, ArrowFooter]:
        """Rows and bytes of every record batch (a remote file's batches are read for them), the
        schema and the nulls per column."""
        reader = _open(fs, path, _planning_source(fs, path))
        stream = None
        if reader is None:
            schema, batches, stream = scan_stream(_planning_source(fs, path), url)
        else:
            schema, batches = reader.schema, [reader.get_batch(i) for i in range(reader.num_record_batches)]
        layout = FileLayout(url, size, tuple(b.num_rows for b in batches), tuple(b.get_total_buffer_size() for b in batches))
        nulls = {}
        for i, name in enumerate(schema.names):
            try:
                nulls[name] = sum(b.column(i).null_count for b in batches)
            except (KeyError, NotImplementedError, pa.ArrowNotImplementedError):  # a type pyarrow has no Python array for (intervals)
                continue  # its nulls are not known here; the column is refused when it is selected
        return layout, ArrowFooter(schema, nulls, stream)

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
        if footer.stream is not None:
            return _ArrowReader(StreamReader(source, footer.stream), footer.schema)
        if _open(fs, path, source) is None:
            raise UnsupportedFileError("it was an Arrow IPC file at planning and is a stream now: the file changed")
        return _ArrowReader(_FileReader(source), footer.schema)


ARROW = ArrowIpcFormat()
