"""Chunks: the rows of one chunk task, read and converted in whatever process runs the task.

A chunk is many batches of one lane; the main process slices it into batches (views), so
one transfer between processes carries many batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import get_worker_info

from ..catalog.build import Catalog
from ..plan.lanes import Lane, StreamBook
from ..plan.schedule import ChunkTask
from .convert import Where, replace_leaves, table_to_columns, table_to_joined
from .nested import BatchColumn, flatten
from .nulls import DEFAULT_POLICY, ColumnPolicy, NullValuesError, null_error, valid_mask
from .output_formats import BatchOutput, batch_bounds, prepare_batches
from .packed_batches import PACKED_FORMATS, Packed, pack_batches, unpack
from .reader import StreamReader
from .slicing import BatchSlicer
from .windows import Rows

#: Where chunks are copied into recycled buffers (the shared buffers of DataLoader workers, the
#: local ones of reader threads and num_workers=0) and pyarrow's own threads do not decode,
#: streamed Parquet pieces decode in batches of this many rows and a chunk joins several: the
#: decoder's buffers then stay small and are reused instead of being faulted in anew. With
#: pyarrow's threads (num_workers=0), the decode batch is the chunk: they decode its columns in
#: parallel.
WORKER_DECODE_ROWS = 1 << 12


@dataclass
class Chunk:
    """Converted rows [start, stop) of one lane, sent from a worker to the main process."""

    lane: int
    start: int
    stop: int
    columns: dict[str, Any]
    present: np.ndarray | None = None  # offsets (from start) of the rows read, when some were skipped
    skipped: dict[int, str] = field(default_factory=dict)  # split -> error, with on_error="skip"
    ready: Callable[[], None] | None = None  # called before the first batch is handed out (a device copy's wait)
    prepared: list[Any] | None = None  # finished batches (output_format / transform), instead of columns to slice

    @property
    def num_read(self) -> int:
        return self.stop - self.start if self.present is None else len(self.present)

    def pin_memory(self) -> Chunk:
        """The chunk with its tensors in pinned memory (the DataLoader's pin_memory=True calls
        this in its pinning thread); its batches are then views of pinned memory."""
        columns = {name: replace_leaves(value, torch.Tensor, torch.Tensor.pin_memory) for name, value in self.columns.items()}
        return Chunk(self.lane, self.start, self.stop, columns, self.present, self.skipped, prepared=self.prepared)

    def _prepared(self, index: int) -> Any:
        batch = self.prepared[index]  # type: ignore[index]
        return unpack(batch, self.columns) if isinstance(batch, Packed) else batch

    def batches(self, size: int, where: Where | None = None) -> Iterator[tuple[dict[str, Any], int]]:
        """(batch, lane row after it); the last batch also passes any skipped rows at the end.
        ``where`` describes the chunk's rows for an error message."""
        read = self.num_read
        slicer = BatchSlicer(self.columns, size, where) if self.prepared is None else None
        for index, (offset, stop) in enumerate(batch_bounds(read, size)):
            if stop == read:
                end = self.stop
            else:
                end = self.start + (stop if self.present is None else int(self.present[stop - 1]) + 1)
            yield (slicer.batch(index, stop - offset) if slicer is not None else self._prepared(index)), end


#: a chunk of more Arrow chunks than this, averaging fewer rows than SMALL_PIECE_ROWS, is combined first
MANY_PIECES = 8
SMALL_PIECE_ROWS = 4096


def fewer_chunks(table: pa.Table) -> pa.Table:
    """The table in one Arrow chunk per column when it holds many small ones (a chunk of tiny
    files): converting costs per Arrow chunk and column, about 30 us, more than copying 100 rows."""
    pieces = table.column(0).num_chunks if table.num_columns else 0
    if pieces <= MANY_PIECES or table.num_rows >= pieces * SMALL_PIECE_ROWS or any(pa.types.is_dictionary(t) for t in table.schema.types):
        return table
    return table.combine_chunks()


class ChunkReader:
    """Reads chunk tasks of a plan. Picklable: DataLoader workers each get a copy, which opens
    its files on first use."""

    def __init__(
        self,
        catalog: Catalog,
        book: StreamBook,
        columns: list[str] | None,
        skip_errors: bool,
        chunk_rows: int,
        output: BatchOutput | None = None,
        selected: list[BatchColumn] | None = None,
        policy: ColumnPolicy = DEFAULT_POLICY,
    ):
        self.catalog = catalog
        self.output = output  # batches in another form, or transformed: finished where the chunk is read
        self.selected = selected  # the batch columns, when they are not ``columns`` as read (nested.py)
        self.policy = policy
        self.book = book
        self.columns = columns
        self.skip_errors = skip_errors
        self.chunk_rows = chunk_rows
        self.use_threads: bool | None = None  # pyarrow's own threads; None: in the main process only
        self._reader: StreamReader | None = None
        self.generation = 0  # counts replan(): copies of an older generation (workers, threads) read another plan

    def replan(self, catalog: Catalog, book: StreamBook, columns: list[str] | None, selected: list[BatchColumn] | None) -> None:
        """Read another plan from now on (a table dataset's other snapshot, with its columns)."""
        self.catalog, self.book, self._reader = catalog, book, None
        self.columns, self.selected = columns, selected
        self.generation += 1

    def reset(self) -> None:
        """Forget open files and decoded windows (the next read opens them anew)."""
        self._reader = None

    def read(self, task: ChunkTask, joined: bool = False) -> Chunk:
        """Read and convert one chunk; with ``joined``, tensors are left as ``convert.Joined`` for
        the caller to build in a recycled buffer (a worker's shared one, or this process's)."""
        if task.stop <= task.start:
            return Chunk(task.lane, task.start, task.stop, {})
        in_main = get_worker_info() is None
        if self._reader is None:
            use_threads = in_main if self.use_threads is None else self.use_threads
            # pyarrow's threads decode a large batch's columns in parallel
            decode_rows = min(self.chunk_rows, WORKER_DECODE_ROWS) if joined and not use_threads else self.chunk_rows
            self._reader = StreamReader(self.catalog, self.columns, use_threads, self.skip_errors, decode_rows, self.book.reader_windows)
        try:
            rows = self._reader.read_segments(self.book, task.segments)
        except BaseException:
            # Its open streams may stop mid-piece (a generator an exception went through is finished,
            # e.g. after a KeyboardInterrupt in the main process): the next read starts afresh.
            self._reader = None
            raise
        where = lambda: self.describe(task)  # noqa: E731 - asked only for an error message
        table = fewer_chunks(rows.table)
        table = table if self.selected is None else flatten(table, self.selected)
        try:
            return self._converted(task, rows, table, where, in_main, joined)
        except NullValuesError as error:  # named more closely: the chunk's rows may come from many files
            raise self._at_first_null(error, task, rows, table).with_traceback(error.__traceback__) from None

    def _converted(self, task: ChunkTask, rows: Rows, table: pa.Table, where: Where, in_main: bool, joined: bool) -> Chunk:
        """The chunk of ``table`` (the task's rows read) in the loader's form."""
        if self.output is not None and self.output.prepared:
            batch_of = lambda start, stop: self._describe_batch(task, rows.present, start, stop)  # noqa: E731 - for an error message
            shared = joined and self.output.transform is None and self.output.format in PACKED_FORMATS
            prepared = prepare_batches(table, self.output, where, in_main or shared, batch_of, self.policy)
            carried: dict[str, Any] = {}
            if shared:  # the batches' bytes travel in the worker's shared buffers (packed_batches.py)
                carried, prepared = pack_batches(prepared, self.output.format)
            return Chunk(task.lane, task.start, task.stop, carried, rows.present, rows.skipped, prepared=prepared)
        if joined:
            columns = table_to_joined(table, where, self.policy)
        else:  # in a worker of a plain or Stateful DataLoader, torch copies the batch into shared memory anyway
            columns = table_to_columns(table, where, copy=in_main, policy=self.policy)
        return Chunk(task.lane, task.start, task.stop, columns, rows.present, rows.skipped)

    def _at_first_null(self, error: NullValuesError, task: ChunkTask, rows: Rows, table: pa.Table) -> NullValuesError:
        """``error`` naming the file that holds the column's first null row of the chunk."""
        if error.column is None or error.column not in table.column_names:
            return error
        first = int(np.argmax(~valid_mask(table.column(error.column).combine_chunks())))
        row = first if rows.present is None else int(rows.present[first])
        files = self.book.files_of(Lane(task.segments).slice(row, row + 1))
        if not files:
            return error
        url = self.catalog.files[files[0]].url
        return null_error(error.column, error.count, lambda: f"{self.describe(task)}, the first in {url}")

    def describe(self, task: ChunkTask) -> str:
        """The files a task's rows come from, for error messages."""
        urls = [self.catalog.files[f].url for f in self.book.files_of(task.segments)]
        shown = ", ".join(urls[:3]) + (f" and {len(urls) - 3} more" if len(urls) > 3 else "")
        return f"rows read from {shown} (epoch {task.segments[0].key.epoch})"

    def _describe_batch(self, task: ChunkTask, present: np.ndarray | None, start: int, stop: int) -> str:
        """A batch of a task (rows [start, stop) of those read) by lane rows, batch number, splits and files."""
        first = task.start + (start if present is None else int(present[start]))
        last = task.start + (stop if present is None else int(present[stop - 1]) + 1)
        size = self.output.batch_size if self.output is not None else 1
        lane = "padding rows" if task.lane < 0 else f"lane {task.lane}"
        table = self.catalog.splits_at(task.segments[0].key.epoch)
        held = Lane(task.segments).slice(first - task.start, last - task.start) or task.segments  # the batch's rows alone
        splits = [table[s].describe() for s in self.book.splits_of(held)]
        shown = "; ".join(splits[:3]) + (f" and {len(splits) - 3} more" if len(splits) > 3 else "")
        return f"batch {first // size} of {lane} (its rows [{first}, {last}), epoch {task.segments[0].key.epoch}), from split(s) {shown}"

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_reader"] = None
        return state
