"""Read row ranges of a stream: open files, decode units, assemble (and permute) windows."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pyarrow as pa

from .catalog import Catalog
from .errors import DataReadError
from .lanes import Segment, StreamBook
from .streams import Piece, Stream

_OPEN_FILES = 16
_CACHED_WINDOWS = 2


class StreamReader:
    """Reads rows of streams with column projection; keeps the current window decoded."""

    def __init__(self, catalog: Catalog, columns: list[str] | None, use_threads: bool):
        self._catalog = catalog
        self._columns = columns
        self._use_threads = use_threads
        self._files: OrderedDict[int, Any] = OrderedDict()
        self._windows: OrderedDict[tuple, pa.Table] = OrderedDict()

    def read_segments(self, book: StreamBook, segments: tuple[Segment, ...]) -> pa.Table:
        """The rows of consecutive stream segments, concatenated."""
        parts = [self.read(book.stream(s.key), s.start, s.stop) for s in segments]
        return parts[0] if len(parts) == 1 else self._concat(parts, None)

    def read(self, stream: Stream, start: int, stop: int) -> pa.Table:
        """Rows [start, stop) of the stream, in stream order."""
        parts = []
        row = start
        while row < stop:
            window = stream.window_of(row)
            table = self._window(stream, window)
            offset = row - int(stream.window_rows[window])
            take = min(stop - row, table.num_rows - offset)
            parts.append(table.slice(offset, take))
            row += take
        return parts[0] if len(parts) == 1 else self._concat(parts, stream)

    def describe_split(self, split: int) -> str:
        return self._catalog.splits[split].describe()

    def _window(self, stream: Stream, window: int) -> pa.Table:
        key = (stream.key, stream.splits, window)
        table = self._windows.get(key)
        if table is not None:
            self._windows.move_to_end(key)
            return table
        pieces = stream.pieces[int(stream.window_pieces[window]) : int(stream.window_pieces[window + 1])]
        tables = [self._piece(piece) for piece in pieces]
        table = tables[0] if len(tables) == 1 else self._concat(tables, stream)
        permutation = stream.window_permutation(window)
        if permutation is not None:
            table = table.take(permutation)
        self._windows[key] = table
        while len(self._windows) > _CACHED_WINDOWS:
            self._windows.popitem(last=False)
        return table

    def _piece(self, piece: Piece) -> pa.Table:
        entry = self._catalog.files[piece.file]
        try:
            table = self._open(piece.file).read_unit(piece.unit, self._columns)
        except Exception as error:  # noqa: BLE001 - re-raised naming file and split
            self._files.pop(piece.file, None)
            raise DataReadError(
                f"cannot read {entry.url} (split {self.describe_split(piece.split)}, unit {piece.unit}): {error}"
            ) from error
        return table.slice(piece.start, piece.stop - piece.start)

    def _open(self, file: int) -> Any:
        reader = self._files.get(file)
        if reader is None:
            entry = self._catalog.files[file]
            reader = self._catalog.format.open(self._catalog.fs, entry.fs_path, self._catalog.footers[file], self._use_threads)
            self._files[file] = reader
            while len(self._files) > _OPEN_FILES:
                self._files.popitem(last=False)
        else:
            self._files.move_to_end(file)
        return reader

    def _concat(self, tables: list[pa.Table], stream: Stream | None) -> pa.Table:
        try:
            return pa.concat_tables(tables)
        except pa.ArrowInvalid as error:
            pieces = stream.pieces if stream is not None else ()
            names = sorted({self._catalog.files[p.file].url for p in pieces})
            raise ValueError(f"files with different schemas cannot be read together: {error}. Files of this stream: {names[:5]}") from error
