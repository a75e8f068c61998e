"""Parquet: row groups are the units."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..lru import Lru
from ..plan.splits import FileLayout
from ..storage.paths import is_local, is_remote
from . import FORMATS
from ._legacy_calendar import HybridCalendarReader, spark_hybrid_columns
from ._parquet_footer import INT96_DECODE_UNIT, footer_bytes, footer_struct
from ._parquet_index_cache import PageIndexes
from ._parquet_page_index import PageBounds, column_pages, index_locations, worth_reading_bounds
from ._parquet_range import Decoded, read_range, worth_reading_rows
from ._parquet_seek import iter_from_row, offset_index_ranges, worth_seeking
from ._parquet_tail import KeptFooter, footer_tail, local_footer_tail, metadata, parsed_footer, remember_parsed
from ._thrift_compact import Struct, ThriftError
from .io import RangeFile, coalesce, open_input

#: Local column chunks are read through a buffer of this size, a few pages at a time, instead of
#: whole (up to tens of MB per row group and column) before the first row is decoded: the first
#: rows come sooner and a worker holds less memory. Larger buffers read no faster, and this size
#: keeps a worker's memory flattest as an epoch goes on.
READ_BUFFER_BYTES = 64 * 1024
#: A remote read that starts inside a row group downloads only the pages from the one holding its
#: first row when that saves at least this many bytes; it then takes two rounds of requests (the
#: page indexes, then the pages), else one (the whole column chunks with their page indexes).
#: The second round costs a round trip to the object store, and 16 MiB take longer than a round
#: trip to transfer at the bandwidth an object store gives one reader; savings that large come
#: from large row groups (Spark writes 128 MB ones).
REMOTE_CUT_MIN_BYTES = 16 * 1024 * 1024
#: Footers decoded for a seek that a reader keeps, one per row group (see _footer_thrift)
DECODED_FOOTERS = 32

log = logging.getLogger(__name__)


THREADS_MIN_BYTES = 1 << 20  # decoded bytes of a row group below which pyarrow's threads cost more than they give


class _ParquetReader:
    def __init__(self, source: Any, footer: pq.FileMetaData | None, use_threads: bool, buffer_size: int = READ_BUFFER_BYTES):
        self._source = source
        # unit -> the footer decoded with that row group, for parquet_seek: the last few units
        # (random access seeks in several row groups of a file in turn)
        self._thrift: Lru[int, Struct] = Lru(DECODED_FOOTERS)
        # pre_buffer (on by default) keeps the last row group's raw column chunks cached in every
        # open file (megabytes per file); a local read gains nothing from it.
        # buffer_size reads each column chunk's pages as decoding reaches them, not the whole chunk first.
        self._buffer_size = buffer_size
        self._file = pq.ParquetFile(source, metadata=footer, pre_buffer=False, buffer_size=buffer_size, coerce_int96_timestamp_unit=INT96_DECODE_UNIT)
        self._footer: pq.FileMetaData = footer if footer is not None else self._file.metadata
        self._use_threads = use_threads
        self._pages = PageIndexes()  # the page indexes read_rows and column_pages decoded
        self._schema: pa.Schema | None = None

    @property
    def footer(self) -> pq.FileMetaData:
        return self._footer

    def read_unit(self, unit: int, columns: list[str] | None) -> pa.Table:
        return self._file.read_row_group(unit, columns=columns, use_threads=self._threads(unit))

    def _threads(self, unit: int) -> bool:
        """pyarrow's threads for a row group worth them: for a small one, handing its columns to
        threads costs more than decoding them in this one."""
        return self._use_threads and self._footer.row_group(unit).total_byte_size >= THREADS_MIN_BYTES

    def iter_unit(self, unit: int, columns: list[str] | None, batch_rows: int, first_row: int = 0) -> Iterator[pa.Table]:
        """The row group's rows from ``first_row`` on, in tables of about ``batch_rows`` rows, each
        decoded when it is asked for. With a page index, decoding starts at the pages that hold
        ``first_row`` (parquet_seek); without, at the first row, and the rows before are dropped."""
        seeking = self._seek(unit, columns, batch_rows, first_row) if self._wants_seek(unit, columns, first_row) else None
        return seeking if seeking is not None else self._batches_from(unit, columns, batch_rows, first_row)

    def _batches_from(self, unit: int, columns: list[str] | None, batch_rows: int, first_row: int) -> Iterator[pa.Table]:
        """Decoded from the row group's first row; the rows before ``first_row`` are dropped."""
        row = 0
        batches = self._file.iter_batches(batch_size=batch_rows, row_groups=[unit], columns=columns, use_threads=self._threads(unit))
        for batch in batches:
            row += batch.num_rows
            if row > first_row:
                table = pa.Table.from_batches([batch])
                yield table if row - batch.num_rows >= first_row else table.slice(first_row - (row - batch.num_rows))

    def seek_from(self, unit: int, columns: list[str] | None, batch_rows: int, row: int, skipped: int) -> Iterator[pa.Table] | None:
        """Rows ``row``.. decoded from the pages holding ``row``, when seeking there is worth more
        than decoding the ``skipped`` rows before it (estimated as for a read from row
        ``skipped``); else None, and the caller decodes on through them."""
        if not worth_seeking(self._footer, unit, columns, skipped):
            return None
        return self._seek(unit, columns, batch_rows, row)

    def _wants_seek(self, unit: int, columns: list[str] | None, first_row: int) -> bool:
        return first_row > 0 and worth_seeking(self._footer, unit, columns, first_row)

    def _seek(
        self, unit: int, columns: list[str] | None, batch_rows: int, first_row: int, fetch: Callable[[list[tuple[int, int]]], None] | None = None
    ) -> Iterator[pa.Table] | None:
        """The rows from ``first_row`` decoded from the page holding it (parquet_seek), or None."""
        try:
            return iter_from_row(self._source, self._footer, self._footer_thrift(unit), unit, columns, first_row, batch_rows, self._buffer_size, fetch)
        except (ThriftError, pa.ArrowException) as error:
            # a page index or cut file pyarrow does not take: decoding from the first row names
            # any damage that matters to the rows read
            log.debug("decoding row group %d from its first row, not seeking to row %d: %s", unit, first_row, error)
            return None

    def column_pages(self, unit: int, names: list[str], read: list[str] | None = None) -> dict[str, tuple[pa.DataType, list[PageBounds]]]:
        """The page index of the columns ``names`` (those that have one) in row group ``unit``:
        each page's rows and bounds, for pruning pages by a row filter (read/page_ranges.py);
        none where reading it costs more than decoding the ``read`` columns (None: all) could
        save, or from a file that cannot be read at an offset (an fsspec file: nor can it seek)."""
        if not hasattr(self._source, "read_at") or not worth_reading_bounds(self._footer, unit, names, read):
            return {}
        return column_pages(self._source, self._footer, self._footer_thrift(unit), unit, names, self._pages)

    def read_rows(self, unit: int, columns: list[str] | None, start: int, stop: int) -> Decoded | None:
        """At least rows [start, stop) of the row group, each column decoded from its pages that
        hold them alone (``_parquet_range``); None when the file has no page index for them (or
        one that does not match its pages) or when reading the footer and page index in Python
        would cost more than the decoding it saves."""
        return self._read_rows(unit, columns, start, stop, None)

    def _read_rows(self, unit: int, columns: list[str] | None, start: int, stop: int, fetch: Callable[[list[tuple[int, int]]], None] | None) -> Decoded | None:
        if not worth_reading_rows(self._footer, unit, columns, start, stop):
            return None
        if self._schema is None:
            self._schema = self._footer.schema.to_arrow_schema()
        try:
            thrift = self._footer_thrift(unit)
            return read_range(self._source, self._footer, self._schema, thrift, unit, columns, start, stop, self._pages, fetch, self._use_threads)
        except (ThriftError, pa.ArrowException) as error:
            log.debug("reading rows %d..%d of row group %d another way: %s", start, stop, unit, error)
            return None

    def _footer_thrift(self, unit: int) -> Struct:
        thrift = self._thrift.find(unit)
        if thrift is not None:
            return thrift
        if len(self._thrift) and self._footer.num_row_groups <= DECODED_FOOTERS:
            # a second row group: all of them decoded at once, cheaper than each one with the
            # others skipped (a single seek decodes only its own)
            thrift = footer_struct(self._footer, None, self._footer_bytes())
            self._thrift.update((group, thrift) for group in range(self._footer.num_row_groups))
            return thrift  # (row_group says so when it has no row group ``unit``)
        thrift = footer_struct(self._footer, unit, self._footer_bytes())
        self._thrift.put(unit, thrift)
        return thrift

    def _footer_bytes(self) -> bytes | None:
        """The footer's bytes from the file (local files: cheaper than serialising the footer)."""
        return footer_bytes(self._source, self._footer) if isinstance(self._source, pa.NativeFile) else None


def unit_ranges(footer: pq.FileMetaData, unit: int, columns: list[str] | None) -> list[tuple[int, int]]:
    """Coalesced byte ranges of the projected columns' chunks in one row group."""
    group = footer.row_group(unit)
    ranges = []
    for index in range(group.num_columns):
        chunk = group.column(index)
        path = chunk.path_in_schema
        if columns is not None and not any(path == c or path.startswith(c + ".") for c in columns):
            continue
        start = chunk.data_page_offset
        if chunk.has_dictionary_page and chunk.dictionary_page_offset and chunk.dictionary_page_offset < start:
            start = chunk.dictionary_page_offset
        ranges.append((start, start + chunk.total_compressed_size))
    return coalesce(ranges)


class _RemoteParquetReader(_ParquetReader):
    """Fetches only the projected column chunks of a row group, concurrently, then decodes them
    as a local file's. A read that starts inside the row group (a resume) also fetches the
    columns' page indexes, for parquet_seek: with the chunks in one round, or, when that saves
    ``REMOTE_CUT_MIN_BYTES``, first, and then only the pages from the one holding the row."""

    def __init__(self, store: Any, path: str, footer: pq.FileMetaData, use_threads: bool):
        # buffer_size 0: pyarrow reads each column chunk in one call, from the bytes in memory
        super().__init__(RangeFile(store, path), footer, use_threads, buffer_size=0)

    def read_unit(self, unit: int, columns: list[str] | None) -> pa.Table:
        fetched = self._source.fetch(unit_ranges(self._footer, unit, columns))
        try:
            return super().read_unit(unit, columns)
        finally:
            self._source.forget(fetched)  # decoded: the raw bytes are not needed any more

    def iter_unit(self, unit: int, columns: list[str] | None, batch_rows: int, first_row: int = 0) -> Iterator[pa.Table]:
        fetched: list[tuple[int, bytes]] = []

        def fetch(ranges: list[tuple[int, int]]) -> None:
            fetched.extend(self._source.fetch(coalesce(ranges)))

        chunks = unit_ranges(self._footer, unit, columns)
        try:
            if self._wants_seek(unit, columns, first_row):
                indexes = self._index_ranges(unit, columns)
                before_row = sum(end - start for start, end in chunks) * first_row // self._footer.row_group(unit).num_rows
                two_rounds = bool(indexes) and before_row >= REMOTE_CUT_MIN_BYTES
                fetch(indexes if two_rounds else chunks + indexes)
                seeking = self._seek(unit, columns, batch_rows, first_row, fetch if two_rounds else None)
                if seeking is not None:
                    yield from seeking
                    return
                if two_rounds:  # (the cut failed its check after fetching pages: start over with whole chunks)
                    self._source.forget(fetched)
                    fetched.clear()
                    fetch(chunks)
            else:
                fetch(chunks)
            yield from self._batches_from(unit, columns, batch_rows, first_row)
        finally:
            self._source.forget(fetched)

    def seek_from(self, unit: int, columns: list[str] | None, batch_rows: int, row: int, skipped: int) -> Iterator[pa.Table] | None:
        """None: the row group's chunks are fetched whole (``iter_unit``) and decoded on."""
        return None

    def column_pages(self, unit: int, names: list[str], read: list[str] | None = None) -> dict[str, tuple[pa.DataType, list[PageBounds]]]:
        """As a local file's, with the columns' page indexes fetched first in one round."""
        if not worth_reading_bounds(self._footer, unit, names, read):
            return {}
        try:
            thrift = self._footer_thrift(unit)
        except ThriftError:
            return {}
        wanted = [(start, start + length) for start, length in index_locations(thrift, self._footer, unit, names)]
        fetched = self._source.fetch(coalesce(wanted))
        try:
            return super().column_pages(unit, names, read)
        finally:
            self._source.forget(fetched)

    def read_rows(self, unit: int, columns: list[str] | None, start: int, stop: int) -> Decoded | None:
        """``_ParquetReader.read_rows``, fetching the page indexes it does not hold yet, then the
        pages (a round of concurrent requests each)."""
        fetched: list[tuple[int, bytes]] = []
        try:
            return self._read_rows(unit, columns, start, stop, lambda ranges: fetched.extend(self._source.fetch(coalesce(ranges))))
        finally:
            self._source.forget(fetched)

    def _index_ranges(self, unit: int, columns: list[str] | None) -> list[tuple[int, int]]:
        try:
            return offset_index_ranges(self._footer, self._footer_thrift(unit), unit, columns)
        except ThriftError as error:  # (a footer pyarrow read but this module cannot: _seek will not seek)
            log.debug("not fetching row group %d's page index: %s", unit, error)
            return []


def _row_group_bytes(footer: pq.FileMetaData) -> tuple[int, ...]:
    """Compressed bytes of each row group. A column chunk whose type is not its schema column's
    is refused here: pyarrow aborts the process when such a chunk's statistics are read."""
    types = [footer.schema.column(c).physical_type for c in range(footer.num_columns)]
    sizes = []
    for group in range(footer.num_row_groups):
        chunks = footer.row_group(group)
        total = 0
        for c in range(chunks.num_columns):
            chunk = chunks.column(c)
            if chunk.physical_type != types[c]:
                raise ValueError(
                    f"its footer gives the chunk of column {chunk.path_in_schema!r} in row group {group} the type "
                    f"{chunk.physical_type}, where its schema says {types[c]}"
                )
            total += chunk.total_compressed_size
        sizes.append(total)
    return tuple(sizes)


class ParquetFormat:
    """Parquet files: row groups are the units (``FileFormat``)."""

    name = "parquet"
    suffixes = FORMATS["parquet"].suffixes
    streams_units = True  # its readers have iter_unit (row groups decoded in batches)

    def read_footer(self, fs: Any, path: str, size: int, url: str) -> tuple[FileLayout, Any]:
        """The row groups' rows and compressed bytes, and the footer (``pq.FileMetaData``; for a
        remote file a ``KeptFooter``, which ``schema``, ``null_counts`` and ``open`` take too)."""
        if is_local(fs):
            path.encode()  # pyarrow opens files by UTF-8 names: a name that is not raises here, as it would there
            tail = local_footer_tail(path)
        else:
            with open_input(fs, path) as source:
                tail = footer_tail(source, size)
        footer = parsed_footer(tail)
        if is_local(fs):
            return self._layout(url, size, footer), footer
        kept = KeptFooter(tail)
        remember_parsed(kept, footer)
        return self._layout(url, size, footer), kept

    @staticmethod
    def _layout(url: str, size: int, footer: pq.FileMetaData) -> FileLayout:
        rows = tuple(footer.row_group(i).num_rows for i in range(footer.num_row_groups))
        if any(count < 0 for count in rows):
            raise ValueError(f"its footer gives a row group {min(rows)} rows")
        chunks = [footer.row_group(i).num_columns for i in range(footer.num_row_groups)]
        if any(count != footer.num_columns for count in chunks):  # pyarrow aborts the process when asked for the odd chunk
            odd = next(i for i, count in enumerate(chunks) if count != footer.num_columns)
            raise ValueError(f"its footer gives row group {odd} {chunks[odd]} column chunks for the {footer.num_columns} columns of its schema")
        return FileLayout(url, size, rows, _row_group_bytes(footer))

    def schema(self, fs: Any, path: str, footer: Any) -> pa.Schema:
        """The Arrow schema the footer gives."""
        return metadata(footer).schema.to_arrow_schema()

    def null_counts(self, footer: Any, names: Sequence[str]) -> dict[str, int]:
        """Nulls per leaf column (``"a"``, ``"struct.field"``) among ``names``, summed over the row
        groups, where every row group's statistics count them (absent: not known)."""
        footer = metadata(footer)
        index = {footer.schema.column(i).path: i for i in range(footer.num_columns)}
        counts = {name: 0 for name in names if name in index}
        for group in range(footer.num_row_groups):
            chunks = footer.row_group(group)
            for name in list(counts):
                stats = chunks.column(index[name]).statistics
                if stats is None or not stats.has_null_count:
                    del counts[name]  # not known for this row group: found when read
                else:
                    counts[name] += stats.null_count
        return counts

    def nulls_by_column(self, footer: Any) -> dict[str, int]:
        """``null_counts`` of every leaf column (kept at planning when the footer is not), read
        from the column chunks alone: planning calls this for every local file, and going
        through the footer's schema for the names cost twice as much."""
        footer = metadata(footer)
        counts: dict[str, int | None] = {}
        for group in range(footer.num_row_groups):
            chunks = footer.row_group(group)
            for index in range(chunks.num_columns):
                chunk = chunks.column(index)
                stats, name = chunk.statistics, chunk.path_in_schema
                if stats is None or not stats.has_null_count:
                    counts[name] = None  # not known for this row group: found when read
                elif group == 0:
                    counts[name] = stats.null_count
                else:  # (a name row group 0 lacks, as in a file whose row groups differ: not known)
                    known = counts.get(name)
                    counts[name] = None if known is None else known + stats.null_count
        return {name: count for name, count in counts.items() if count is not None}

    def open(self, fs: Any, path: str, footer: Any, use_threads: bool) -> _ParquetReader | HybridCalendarReader:
        """A reader of the file's row groups (fetching only what it decodes, for a remote file);
        dates and timestamps Spark wrote in the hybrid calendar are converted as read."""
        reader: _ParquetReader
        if is_remote(fs):
            reader = _RemoteParquetReader(fs, path, metadata(footer), use_threads)
        else:  # footer None (the catalog keeps none of local files): pyarrow reads it with the file
            reader = _ParquetReader(open_input(fs, path), metadata(footer) if footer is not None else None, use_threads)
        hybrid = spark_hybrid_columns(reader.footer)
        return HybridCalendarReader(reader, hybrid) if hybrid else reader


PARQUET = ParquetFormat()
