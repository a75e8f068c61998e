"""ORC: stripes are the units, with exact row counts from the file's footer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import pyarrow as pa
from pyarrow import orc

from ..errors import UnsupportedFileError
from ..plan.splits import FileLayout
from ..storage.paths import is_remote
from . import FORMATS
from ._legacy_calendar import HybridCalendarReader, date_leaves
from ._orc_tail import OrcTail, _fields, read_tail, stream_ranges
from .io import RangeFile, open_input

_ORC_TAIL_MIN = 16 * 1024  # what the ORC reader fetches first when opening a file


def _selectable(columns: list[str] | None) -> bool:
    """Whether ``read_stripe(columns=...)`` reads exactly these top-level columns: pyarrow takes a
    dotted name as a path into a struct (``"meta.lang"`` reads the struct column ``meta`` when the
    file has one)."""
    return columns is not None and not any("." in name for name in columns)


def _read_stripe(file: orc.ORCFile, unit: int, columns: list[str] | None) -> pa.Table:
    if columns is None or _selectable(columns):
        return pa.Table.from_batches([file.read_stripe(unit, columns=columns)])
    return pa.Table.from_batches([file.read_stripe(unit)]).select(columns)  # a dotted name: every column, then by name


class _OrcReader:
    def __init__(self, source: Any):
        self._source = source
        self._file = orc.ORCFile(source)

    @property
    def schema(self) -> pa.Schema:
        return self._file.schema

    def hybrid_calendar(self) -> bool:
        """Whether the file counts dates in the hybrid calendar (``OrcTail.hybrid_calendar``)."""
        if self._file.writer != "ORC_JAVA":
            return False
        self._source.seek(0, 2)
        return read_tail(self._source, self._source.tell()).hybrid_calendar

    def read_unit(self, unit: int, columns: list[str] | None) -> pa.Table:
        return _read_stripe(self._file, unit, columns)


class LocalOrcFooter(NamedTuple):
    """What planning keeps of a local ORC file's tail (pyarrow reads the tail again when a worker
    opens the file)."""

    null_counts: dict[str, int]


class RemoteOrcFooter(NamedTuple):
    """What a worker needs to read a remote ORC file without asking for its tail again."""

    tail_start: int
    tail: bytes  # the file's last bytes: postscript, footer and metadata
    layout: OrcTail


class _RemoteOrcReader:
    """Reads a stripe's columns with two rounds of requests: its footer, then the streams of the
    columns asked for, concurrently (one request for the whole stripe when all are asked for)."""

    def __init__(self, store: Any, path: str, footer: RemoteOrcFooter):
        self._footer = footer
        self._source = RangeFile(store, path)
        self._source.add(footer.tail_start, footer.tail)
        self._file: orc.ORCFile | None = None

    def read_unit(self, unit: int, columns: list[str] | None) -> pa.Table:
        stripe = self._footer.layout.stripes[unit]
        some = columns if columns is not None and _selectable(columns) and not set(self._footer.layout.column_ids) <= set(columns) else None
        if some is not None and stripe.footer_length:  # some columns: their streams alone
            self._source.fetch([(stripe.footer_start, stripe.offset + stripe.length)])
            footer = bytes(self._source.read_range(stripe.footer_start, stripe.offset + stripe.length))
            self._source.fetch(stream_ranges(stripe, footer, self._footer.layout, some))
        else:
            self._source.fetch([(stripe.offset, stripe.offset + stripe.length)])
        try:
            if self._file is None:
                self._file = orc.ORCFile(self._source)
            return _read_stripe(self._file, unit, columns)
        finally:
            self._source.keep_only([self._footer.tail_start])  # decoded: drop the stripe's bytes


def _remote_footer(source: RangeFile, size: int, layout: OrcTail) -> RemoteOrcFooter:
    """The file's tail as one block: a worker opens the file from it without a request."""
    last = source.read_range(size - 1, size)[0]
    postscript = dict(_fields(bytes(source.read_range(size - 1 - last, size - 1))))
    need = last + 1 + int(postscript.get(1, 0)) + int(postscript.get(5, 0))
    start = max(0, size - max(_ORC_TAIL_MIN, need))
    return RemoteOrcFooter(start, bytes(source.read_range(start, size)), layout)


class OrcFormat:
    """ORC files: stripes are the units (``FileFormat``)."""

    name = "orc"
    suffixes = FORMATS["orc"].suffixes
    streams_units = False  # its readers decode a stripe whole

    def read_footer(self, fs: Any, path: str, size: int, url: str) -> tuple[FileLayout, Any]:
        """The stripes' rows and bytes, and for a remote file a ``RemoteOrcFooter`` (for a local
        one only its null counts: pyarrow reads its tail again when the file is opened)."""
        with open_input(fs, path) as source:
            tail = read_tail(source, size)
            footer = _remote_footer(source, size, tail) if is_remote(fs) else LocalOrcFooter(tail.null_counts)
        stripes = tail.stripes
        layout = FileLayout(url, size, tuple(s.rows for s in stripes), tuple(s.length for s in stripes))
        return layout, footer

    def schema(self, fs: Any, path: str, footer: Any) -> pa.Schema:
        """The Arrow schema pyarrow reads from the file's tail: the one a remote footer carries,
        else read from the file."""
        if isinstance(footer, RemoteOrcFooter):  # a remote file's tail, fetched at planning
            try:
                return orc.ORCFile(pa.BufferReader(footer.tail)).schema
            except (OSError, pa.ArrowException):
                pass
        with open_input(fs, path) as source:
            try:
                return orc.ORCFile(source).schema
            except pa.ArrowNotImplementedError as error:
                if "top-level struct" not in str(error):
                    raise
                raise UnsupportedFileError(
                    "its root type is not a struct (rows of named columns), and pyarrow reads only ORC files whose root is one"
                ) from error

    def null_counts(self, footer: Any, names: Sequence[str]) -> dict[str, int]:
        """Nulls per top-level column among ``names``, where the file's statistics say."""
        counts = footer.layout.null_counts if isinstance(footer, RemoteOrcFooter) else footer.null_counts
        return {name: counts[name] for name in names if name in counts}

    def nulls_by_column(self, footer: Any) -> dict[str, int]:
        """``null_counts`` of every top-level column (kept at planning when the footer is not)."""
        return dict(footer.layout.null_counts if isinstance(footer, RemoteOrcFooter) else footer.null_counts)

    def open(self, fs: Any, path: str, footer: Any, use_threads: bool) -> _OrcReader | _RemoteOrcReader | HybridCalendarReader:
        """A reader of the file's stripes (fetching only the projected streams, for a remote file);
        the dates of ORC's Java writer (Spark, Hive), in the hybrid calendar, converted as read."""
        reader: _OrcReader | _RemoteOrcReader
        if is_remote(fs):
            reader = _RemoteOrcReader(fs, path, footer)
            schema = self.schema(fs, path, footer) if footer.layout.hybrid_calendar else None
        else:
            local = reader = _OrcReader(open_input(fs, path))
            schema = local.schema if local.hybrid_calendar() else None
        dates = date_leaves(schema) if schema is not None else frozenset()
        return HybridCalendarReader(reader, dates) if dates else reader


ORC = OrcFormat()
