"""Read row ranges of a stream: open files, decode units, assemble (and permute) windows.

With ``skip_errors`` a unit that cannot be read is left out instead of raising: the
rows read then come with the offsets they have in the requested range, and the
splits that lost rows with the error, so that progress and reports stay exact.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from ..catalog.build import Catalog
from ..errors import DataReadError, FileChangedError, RemoteReadError, WideningError
from ..lru import Lru
from ..plan.columns import unit_rows_at
from ..plan.lanes import Segment, StreamBook
from ..plan.streams import Piece, Stream
from ..storage.paths import check_unchanged, is_local, is_remote
from .conform import iter_conformed, read_conformed
from .filtering import iter_filtered, read_filtered
from .prefetch import decode_ahead, pieces_between, units_to_decode
from .windows import Rows, StreamedPiece, Window, one_chunk

_OPEN_FILES = 16
_CACHED_WINDOWS = 2
_GATHER_SEGMENTS = 16  # a task of more segments than this reads each stream's span once (read_segments)
_KEPT_UNIT_ROWS = 64  # a unit this small stays decoded after its piece is read (see _piece)
_CACHED_UNITS = 2  # at least; a mixture's window reads part of a unit of each source, and keeps those


class StreamReader:
    """Reads rows of streams with column projection; keeps the current window decoded."""

    def __init__(
        self, catalog: Catalog, columns: list[str] | None, use_threads: bool, skip_errors: bool = False, stream_rows: int = 0, windows: int = _CACHED_WINDOWS
    ):
        self._catalog = catalog
        self._columns = columns
        self._use_threads = use_threads
        self._skip_errors = skip_errors
        self._stream_rows = stream_rows  # > 0: decode unshuffled Parquet pieces in batches of this many rows
        self._files: Lru[int, Any] = Lru(_OPEN_FILES)
        self._windows: Lru[tuple, Window | StreamedPiece] = Lru(windows)  # at most one per stream
        self._units: Lru[tuple[int, int], pa.Table] = Lru(_CACHED_UNITS)  # decoded units read only in part
        self._units_epoch = -1  # the epoch the kept units were read in
        self._stream_ids: dict[int, tuple[Stream, _StreamId]] = {}  # id(stream) -> its window-cache key
        self._ahead: dict[tuple[int, int], pa.Table | Exception] = {}  # units decoded ahead for the read in progress (prefetch.py)

    def read_segments(self, book: StreamBook, segments: tuple[Segment, ...]) -> Rows:
        """The rows of consecutive stream segments, concatenated."""
        if len(segments) > _GATHER_SEGMENTS and not self._skip_errors:
            gathered = self._gathered(book, segments)
            if gathered is not None:
                return gathered
        return self._join([(self.read(book.stream(s.key), s.start, s.stop), s.num_rows) for s in segments], None)

    def _gathered(self, book: StreamBook, segments: tuple[Segment, ...]) -> Rows | None:
        """Many small segments that interleave a few streams (canonical lanes): each stream's span
        read once, then one take puts the rows in segment order (None when the spans hold more
        than twice the segments' rows)."""
        spans: dict[Any, list[int]] = {}
        for s in segments:
            span = spans.setdefault(s.key, [s.start, s.stop])
            span[0], span[1] = min(span[0], s.start), max(span[1], s.stop)
        if sum(hi - lo for lo, hi in spans.values()) > 2 * sum(s.num_rows for s in segments):
            return None
        tables, base, offset = [], {}, 0
        for key, (lo, hi) in spans.items():
            tables.append(self.read(book.stream(key), lo, hi).table)
            base[key] = offset - lo
            offset += hi - lo
        index = np.concatenate([np.arange(s.start, s.stop, dtype=np.int64) + base[s.key] for s in segments])
        return Rows(self._concat(tables, None).take(pa.array(index)).combine_chunks())

    def read(self, stream: Stream, start: int, stop: int) -> Rows:
        """Rows [start, stop) of the stream, in stream order."""
        parts, row = [], start
        self._decode_ahead(stream, start, stop)
        try:
            while row < stop:
                index = stream.window_of(row)
                window = self._window(stream, index)
                offset = row - int(stream.window_rows[index])
                take = min(stop - row, int(stream.window_rows[index + 1]) - row)
                parts.append((window.rows(offset, take), take))
                row += take
        finally:
            self._ahead.clear()
        return self._join(parts, stream)

    def _decode_ahead(self, stream: Stream, start: int, stop: int) -> None:
        """Decode the small object-store units that the windows of rows [start, stop) need, concurrently."""
        if not is_remote(self._catalog.fs):  # (every read asks: local files leave at once)
            return
        ident = self._stream_id(stream)
        pieces = pieces_between(stream, start, stop, lambda window, of: (ident, window) in self._windows or self._streamed_large(stream, of))
        wanted = units_to_decode(self._catalog, pieces, lambda key: key in self._units)
        if wanted:
            self._ahead = decode_ahead(self._catalog, self._columns, wanted, self._opened)

    def describe_split(self, split: int, epoch: int) -> str:
        return self._catalog.splits_at(epoch)[split].describe()

    def _join(self, parts: list[tuple[Rows, int]], stream: Stream | None) -> Rows:
        if len(parts) == 1:
            return parts[0][0]
        skipped: dict[int, str] = {}
        present, base, exact = [], 0, True
        for rows, length in parts:
            skipped.update(rows.skipped)
            exact = exact and rows.present is None
            present.append(base + (rows.present if rows.present is not None else np.arange(rows.table.num_rows)))
            base += length
        tables = [rows.table for rows, _ in parts if rows.table.num_rows]
        table = self._concat(tables, stream) if len(tables) > 1 else (tables[0] if tables else parts[0][0].table)
        return Rows(table, None if exact else np.concatenate(present), skipped)

    def _window(self, stream: Stream, index: int) -> Window | StreamedPiece:
        key = (self._stream_id(stream), index)
        window = self._windows.find(key)
        if window is not None:
            return window
        for old in [k for k in self._windows.keys() if k[0] == key[0]]:
            self._windows.pop(old)  # a stream is read in order: free its previous window before decoding this one
        pieces = stream.window_pieces_of(index)
        if self._streams(stream, pieces):
            streamed = StreamedPiece(lambda first: self._piece_batches(pieces[0], first, stream.key[1]), pieces[0].num_rows)
            self._windows.put(key, streamed)
            return streamed
        self._units.capacity = max(_CACHED_UNITS, len({(p.file, p.unit) for p in pieces if p.num_rows}))
        tables, skipped = [], {}
        for piece in pieces:
            try:
                tables.append(self._piece(piece, stream.key[1]))
            except DataReadError as error:
                if not self._skip_errors:
                    raise
                tables.append(None)
                skipped[piece.split] = str(error)
        window = self._assemble(stream, index, pieces, tables, skipped)
        self._windows.put(key, window)
        return window

    def _stream_id(self, stream: Stream) -> _StreamId:
        found = self._stream_ids.get(id(stream))
        if found is None or found[0] is not stream:
            if len(self._stream_ids) > 64:
                self._stream_ids.clear()
            found = self._stream_ids[id(stream)] = (stream, _StreamId(stream))  # the stream is held: its id stays its own
        return found[1]

    def _streamed_large(self, stream: Stream, pieces: tuple[Piece, ...]) -> bool:
        """Whether the window is streamed and its unit holds more than one decode batch's rows
        (decoded ahead, it would be held whole instead of a batch at a time)."""
        return self._streams(stream, pieces) and unit_rows_at(self._catalog.layouts, pieces[0].file, pieces[0].unit) > self._stream_rows

    def _streams(self, stream: Stream, pieces: tuple[Piece, ...]) -> bool:
        """Whether a window is read batch by batch: one piece, rows in file order, errors raised
        (a skipped piece must be left out whole), and a format that can (Parquet, on local disk or an object store)."""
        if not self._stream_rows or self._skip_errors or stream.shuffle or len(pieces) != 1 or (pieces[0].file, pieces[0].unit) in self._ahead:
            return False
        fs = self._catalog.fs
        return getattr(self._catalog.format, "streams_units", False) and (is_local(fs) or is_remote(fs))

    def _piece_batches(self, piece: Piece, first: int, epoch: int) -> Iterator[pa.Table]:
        """The piece's rows from its row ``first`` on, in decoded batches; errors name the file and split."""
        try:
            row = piece.start + first
            iterate = iter_conformed if self._catalog.row_filter is None else iter_filtered
            batches = iterate(self._open(piece.file), piece.unit, self._columns, self._catalog, piece.file, self._stream_rows, row)
            unit_rows = unit_rows_at(self._catalog.layouts, piece.file, piece.unit)
            for table in batches:
                stop = min(piece.stop - row, table.num_rows)
                row += table.num_rows
                if stop > 0:
                    yield table.slice(0, stop)
                if row >= piece.stop and piece.stop < unit_rows:
                    return  # the rest of the unit is not this piece's (else: run on, to the row count check)
        except Exception as error:  # noqa: BLE001 - re-raised naming file and split
            raise self._read_error(piece, error, epoch) from error

    def _assemble(self, stream: Stream, index: int, pieces, tables: list[pa.Table | None], skipped: dict[int, str]) -> Window:
        """The window of ``tables`` (one per piece, None: skipped); ``tables`` is emptied, so the
        pieces are held only here while they are combined."""
        valid_pieces = [t is not None for t in tables]
        read = [t for t in tables if t is not None]
        tables.clear()
        held = [self._concat(read, stream) if len(read) > 1 else read[0]] if read else [pa.table({})]
        read.clear()
        permutation = stream.window_permutation(index)
        if not skipped:
            # rows stay decoded in piece order and each read takes its rows from them: a window of
            # several pieces (a mixture's sources, a shuffled window) is made one Arrow chunk first,
            # a copy at memcpy speed that makes every later take one plain take (see gather)
            return Window(one_chunk(held) if permutation is not None else held.pop(), None, skipped, permutation)
        table = held.pop()
        valid = np.concatenate([np.full(p.num_rows, ok) for p, ok in zip(pieces, valid_pieces)])
        position = np.cumsum(valid) - 1  # planned row -> row of `table`
        order = permutation if permutation is not None else np.arange(len(valid))
        valid_out = valid[order]
        return Window(table.take(position[order[valid_out]]) if any(valid_pieces) else table, valid_out, skipped)

    def _piece(self, piece: Piece, epoch: int) -> pa.Table:
        if epoch != self._units_epoch:  # a new epoch reads its units again, through _open's check of their files
            self._units.clear()
            self._units_epoch = epoch
        key = (piece.file, piece.unit)
        table = self._units.find(key)
        if table is None:
            table = self._ahead.pop(key, None)
            if isinstance(table, Exception):
                raise self._read_error(piece, table, epoch) from table
            if table is None:
                try:
                    read = read_conformed if self._catalog.row_filter is None else read_filtered
                    table = read(self._open(piece.file), piece.unit, self._columns, self._catalog, piece.file)
                except Exception as error:  # noqa: BLE001 - re-raised naming file and split
                    raise self._read_error(piece, error, epoch) from error
            # a mixture's windows read a unit part by part, and a small source upsampled reads its units once per copy: kept
            if piece.num_rows < table.num_rows or table.num_rows <= _KEPT_UNIT_ROWS:
                self._units.put(key, table)
        return table.slice(piece.start, piece.stop - piece.start)

    def _read_error(self, piece: Piece, error: Exception, epoch: int) -> Exception:
        """The error to raise for ``error`` while reading ``piece``: a DataReadError naming the file
        and split (``on_error="skip"`` leaves such rows out), or, for a readable value that does
        not fit the unified schema, a WideningError naming the file (never skipped)."""
        self._files.pop(piece.file)
        entry = self._catalog.files[piece.file]
        if isinstance(error, WideningError):
            return WideningError(f"{entry.url}: {error}")
        detail = " ".join(str(error).split()).rstrip(".")  # pyarrow's messages may span lines
        message = f"cannot read {entry.url} (split {self.describe_split(piece.split, epoch)}, unit {piece.unit}): {detail}"
        if "out of range for nanosecond resolution" in detail:  # pyarrow reads ORC timestamps in ns only: the file is fine
            return DataReadError(
                f"{message}. The file holds a timestamp that nanoseconds cannot hold (they reach from 1677-09-21 to "
                "2262-04-11), and pyarrow reads ORC timestamps in nanoseconds: leave the column out with columns=[...]"
            )
        if not isinstance(error, (RemoteReadError, FileChangedError)):  # not an outage or a rewrite
            message += ". If the file is damaged, replace or remove it"
            if not self._skip_errors:  # (with it, these rows are being left out and reported)
                message += ", or pass on_error='skip' to leave out rows that cannot be read"
        return DataReadError(message)

    def _open(self, file: int) -> Any:
        """A reader of ``file``, its file checked against the planned version at every read: a
        reader kept open across epochs (a persistent worker's, the main process's) too."""
        check_unchanged(self._catalog.fs_of(file), self._catalog.files[file])
        return self._files.get(file, lambda: self._opened(file))

    def _opened(self, file: int) -> Any:
        """A new reader of ``file`` (decode-ahead's reads are remote: their ranges are pinned to the planned version)."""
        entry = self._catalog.files[file]
        return self._catalog.format_of(file).open(self._catalog.fs_of(file), entry.fs_path, self._catalog.footers[file], self._use_threads)

    def _concat(self, tables: list[pa.Table], stream: Stream | None) -> pa.Table:
        try:
            return pa.concat_tables(tables)
        except pa.ArrowInvalid as error:
            pieces = stream.pieces if stream is not None else ()
            names = sorted({self._catalog.files[p.file].url for p in pieces})
            raise ValueError(f"files with different schemas cannot be read together: {error}. Files of this stream: {names[:5]}") from error


class _StreamId:
    """A stream's identity in the window cache: its key and split list, hashed once (the split
    list of a worker of 100,000 files is a tuple of 50,000 indices, costly to hash per window)."""

    __slots__ = ("key", "splits", "_hash")

    def __init__(self, stream: Stream):
        self.key, self.splits = stream.key, stream.splits
        self._hash = hash((stream.key, stream.splits))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _StreamId) and self._hash == other._hash and self.key == other.key
            and (self.splits is other.splits or self.splits == other.splits)
        )  # fmt: skip
