"""Decoded windows of a stream, and the rows a read takes from them: a window held whole (in
output order, or with the permutation a read takes its rows by), or a piece streamed in batches."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from ..errors import DataReadError

_RELEASE_BYTES = 4 << 20  # a column whose pieces are worth handing back once it is combined


@dataclass
class Rows:
    """Rows read from a range. ``present`` holds each row's offset in the range when some
    rows were skipped (None: every row is there, in order); ``skipped`` maps split -> error."""

    table: pa.Table
    present: np.ndarray | None = None
    skipped: dict[int, str] = field(default_factory=dict)


@dataclass
class Window:
    table: pa.Table  # rows that could be read, in output order (unless `order` is set)
    valid: np.ndarray | None  # per output position: was the row read (None: all were)
    skipped: dict[int, str]
    order: np.ndarray | None = None  # output position -> row of `table` (rows not yet permuted)

    def rows(self, offset: int, take: int) -> Rows:
        """Output rows [offset, offset + take)."""
        if self.order is not None:
            return Rows(gather(self.table, self.order[offset : offset + take]), None, self.skipped)
        if self.valid is None:
            return Rows(self.table.slice(offset, take), None, self.skipped)
        valid = self.valid[offset : offset + take]
        first = int(np.count_nonzero(self.valid[:offset]))
        return Rows(self.table.slice(first, int(np.count_nonzero(valid))), np.flatnonzero(valid), self.skipped)


class StreamedPiece:
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


def one_chunk(held: list[pa.Table]) -> pa.Table:
    """The one table of ``held`` with one chunk per column; ``held`` is emptied. Columns are
    combined one at a time, each one's pieces freed before the next, and their memory handed back
    to the system, so the copy needs about one column's memory beyond the window's (pyarrow's
    allocator would keep the pieces while the whole combined window is allocated beside them). A
    column that cannot be one chunk (strings of more than 2 GiB in one window) stays in chunks,
    and ``gather`` takes from each chunk."""
    table = held.pop()
    if all(column.num_chunks <= 1 for column in table.columns):
        return table
    schema, columns = table.schema, list(table.columns)
    del table
    for i in range(len(columns)):
        column = columns[i]
        try:
            columns[i] = pa.chunked_array([column.combine_chunks()], type=column.type)
        except (pa.ArrowInvalid, pa.ArrowCapacityError, pa.ArrowNotImplementedError):  # e.g. offsets that do not fit one chunk
            continue
        large = column.nbytes >= _RELEASE_BYTES
        del column
        if large:
            pa.default_memory_pool().release_unused()
    return pa.Table.from_arrays(columns, schema=schema)


def gather(table: pa.Table, rows: np.ndarray) -> pa.Table:
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
