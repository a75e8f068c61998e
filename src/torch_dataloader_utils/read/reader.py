"""Read row ranges of a stream: open files, decode units, assemble (and permute) windows.

With ``skip_errors`` a unit that cannot be read is left out instead of raising: the
rows read then come with the offsets they have in the requested range, and the
splits that lost rows with the error, so that progress and reports stay exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

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

_OPEN_FILES = 16
_CACHED_WINDOWS = 2
_GATHER_SEGMENTS = 16  # a task of more segments than this reads each stream's span once (read_segments)
_KEPT_UNIT_ROWS = 64  # a unit this small stays decoded after its piece is read (see _piece)
_CACHED_UNITS = 2  # at least; a mixture's window reads part of a unit of each source, and keeps those


@dataclass
class Rows:
    """Rows read from a range. ``present`` holds each row's offset in the range when some
    rows were skipped (None: every row is there, in order); ``skipped`` maps split -> error."""

    table: pa.Table
    present: np.ndarray | None = None
    skipped: dict[int, str] = field(default_factory=dict)


@dataclass
class _Window:
    table: pa.Table  # rows that could be read, in output order (unless `order` is set)
    valid: np.ndarray | None  # per output position: was the row read (None: all were)
    skipped: dict[int, str]
    order: np.ndarray | None = None  # output position -> row of `table` (rows not yet permuted)

    def rows(self, offset: int, take: int) -> Rows:
        """Output rows [offset, offset + take)."""
        if self.order is not None:
            return Rows(_gather(self.table, self.order[offset : offset + take]), None, self.skipped)
        if self.valid is None:
            return Rows(self.table.slice(offset, take), None, self.skipped)
        valid = self.valid[offset : offset + take]
        first = int(np.count_nonzero(self.valid[:offset]))
        return Rows(self.table.slice(first, int(np.count_nonzero(valid))), np.flatnonzero(valid), self.skipped)


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
        self._windows: Lru[tuple, _Window | _StreamedPiece] = Lru(windows)  # at most one per stream
        self._units: Lru[tuple[int, int], pa.Table] = Lru(_CACHED_UNITS)  # decoded units read only in part
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

    def _window(self, stream: Stream, index: int) -> _Window | _StreamedPiece:
        key = (self._stream_id(stream), index)
        window = self._windows.find(key)
        if window is not None:
            return window
        for old in [k for k in self._windows.keys() if k[0] == key[0]]:
            self._windows.pop(old)  # a stream is read in order: free its previous window before decoding this one
        pieces = stream.window_pieces_of(index)
        if self._streams(stream, pieces):
            streamed = _StreamedPiece(lambda first: self._piece_batches(pieces[0], first, stream.key[1]), pieces[0].num_rows)
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

    def _assemble(self, stream: Stream, index: int, pieces, tables: list[pa.Table | None], skipped: dict[int, str]) -> _Window:
        read = [t for t in tables if t is not None]
        table = (self._concat(read, stream) if len(read) > 1 else read[0]) if read else pa.table({})
        permutation = stream.window_permutation(index)
        if not skipped:
            # rows stay decoded in piece order and each read takes its rows from them: a window of
            # several pieces (a mixture's sources, a shuffled window) is made one Arrow chunk first,
            # a copy at memcpy speed that makes every later take one plain take (see _gather)
            return _Window(_one_chunk(table) if permutation is not None else table, None, skipped, permutation)
        valid = np.concatenate([np.full(p.num_rows, t is not None) for p, t in zip(pieces, tables)])
        position = np.cumsum(valid) - 1  # planned row -> row of `table`
        order = permutation if permutation is not None else np.arange(len(valid))
        valid_out = valid[order]
        return _Window(table.take(position[order[valid_out]]) if read else table, valid_out, skipped)

    def _piece(self, piece: Piece, epoch: int) -> pa.Table:
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
        """A reader of ``file``: one kept from an earlier read (a persistent worker's, or the main
        process's, across epochs) is checked against the planned version again, as a new one is."""
        kept = self._files.find(file)
        if kept is None:
            return self._files.get(file, lambda: self._opened(file))
        check_unchanged(self._catalog.fs_of(file), self._catalog.files[file])
        return kept

    def _opened(self, file: int) -> Any:
        """A new reader of ``file`` (checked against the planned version first)."""
        entry = self._catalog.files[file]
        fs = self._catalog.fs_of(file)
        check_unchanged(fs, entry)
        return self._catalog.format_of(file).open(fs, entry.fs_path, self._catalog.footers[file], self._use_threads)

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


class _StreamedPiece:
    """An unshuffled one-piece window decoded batch by batch as reads reach it: the first rows
    of a row group are ready before the rest is decoded, and a worker holds about one chunk of
    it instead of the whole decoded row group. Reads go forward; the first read may start
    anywhere (a resume: decoding starts there, see ``iter_conformed``), and a read behind the
    batches held (a new pass after an interruption) starts decoding again."""

    def __init__(self, batches: Callable[[int], Iterator[pa.Table]], num_rows: int):
        self._start = batches  # window row -> the window's rows from there on
        self._num_rows = num_rows
        self._restart()

    def _restart(self) -> None:
        self._batches: Iterator[pa.Table] | None = None
        self._held: list[pa.Table] = []
        self._first = 0  # window row of the first held row
        self._end = 0  # window row after the last held row

    def rows(self, offset: int, take: int) -> Rows:
        """Output rows [offset, offset + take)."""
        if offset < self._first:
            self._restart()
        try:
            self._fill(offset, offset + take)
        except Exception:
            self._restart()  # a retry (a new pass) decodes again instead of finding a dead iterator
            raise
        self._drop_before(offset)
        held = self._held[0] if len(self._held) == 1 else pa.concat_tables(self._held)
        return Rows(held.slice(offset - self._first, take))

    def _fill(self, offset: int, stop: int) -> None:
        """Decode up to window row ``stop``; batches wholly before ``offset`` are dropped as they
        come, so their memory is reused by the next batch."""
        if self._batches is None:
            self._batches = self._start(offset)
            self._first = self._end = offset
        while self._end < stop:
            table = next(self._batches, None)
            if table is None:
                raise DataReadError(f"internal error: a streamed piece ended at row {self._end}, before row {stop}")
            self._held.append(table)
            self._end += table.num_rows
            self._drop_before(offset)
        if stop == self._num_rows and next(self._batches, None) is not None:  # ends the decoding (and its checks)
            raise DataReadError(f"internal error: a streamed piece has more than its {self._num_rows} rows")

    def _drop_before(self, offset: int) -> None:
        while self._held and self._first + self._held[0].num_rows <= offset:
            self._first += self._held.pop(0).num_rows


def _one_chunk(table: pa.Table) -> pa.Table:
    """The table in one chunk per column; as it is when that cannot be (a string column of more
    than 2 GiB in one window), and then ``_gather`` takes from each chunk."""
    if all(column.num_chunks <= 1 for column in table.columns):
        return table
    try:
        return table.combine_chunks()
    except (pa.ArrowInvalid, pa.ArrowCapacityError, pa.ArrowNotImplementedError):  # e.g. offsets that do not fit one chunk
        return table


def _gather(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """``table.take(rows)``; for a table of many chunks one take per chunk (older pyarrow
    concatenates a chunked column whole to take from it, per call)."""
    batches = table.to_batches()
    if len(batches) <= 1:
        return table.take(rows)
    bounds = np.cumsum([0] + [b.num_rows for b in batches])
    owner = np.searchsorted(bounds, rows, side="right") - 1
    if len(batches) <= np.iinfo(np.int16).max:
        owner = owner.astype(np.int16)  # a stable sort of 16-bit integers is a radix sort
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=len(batches))
    ends = np.cumsum(counts)
    local = rows[order] - bounds[owner[order]]
    parts = [_rows_of(batches[b], local[ends[b] - counts[b] : ends[b]]) for b in np.flatnonzero(counts)]
    grouped = pa.Table.from_batches(parts, schema=table.schema)
    inverse = np.empty(len(rows), dtype=np.int64)
    inverse[order] = np.arange(len(rows))
    return grouped.take(inverse)


def _rows_of(batch: pa.RecordBatch, rows: np.ndarray) -> pa.RecordBatch:
    """``batch.take(rows)``; a slice (no copy) when the rows are one ascending run, as a
    mixture's unshuffled window asks of each source."""
    if len(rows) and int(rows[-1]) - int(rows[0]) == len(rows) - 1 and (len(rows) < 2 or bool(np.all(np.diff(rows) == 1))):
        return batch.slice(int(rows[0]), len(rows))
    return batch.take(pa.array(rows))
