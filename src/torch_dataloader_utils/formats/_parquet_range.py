"""Private: rows [start, stop) of a Parquet row group, decoding only the pages that hold them.

Random access reads short runs of rows (a slice, one row) from row groups of tens of thousands.
pyarrow decodes a row group only from its first page (apache/arrow#45284), and the seek of
``_parquet_seek`` only from the page holding the first wanted row to the row group's end, in
batches, through a Python file. Here, with the column chunks' page indexes (offset, size and
first row of every page), each projected column keeps only its pages that overlap
[start, stop) (with its dictionary page when they use it), and the columns whose kept pages
start at the same row go to pyarrow as one Parquet file of one row group of those pages, which
ends at ``stop`` (pyarrow decodes the rows a footer gives and leaves the rest of the last page):
for a local file, the file itself under a footer that points at the kept pages where they are
(``_parquet_splice.in_place_footer``) when they are one range of it; else the pages copied
into memory under a footer of their own (``spliced_bytes``). Such files of columns that start
at different rows are decoded on threads (``threads``). The decoded rows of all columns cover
[start, stop); ``read_range`` returns the rows every column has (``first`` on), so that a
caller may cache the neighbours that came along.

Each chunk's page index is decoded once and kept in the reader's ``PageIndexes``
(``_parquet_index_cache``, which filter pruning shares), with the headers of the pages read. A
zstd dictionary page of many values is kept decompressed from its third use on
(``_parquet_dictionary``). A cut that does not start at the chunk's first page is checked
like ``_parquet_pages.check_cut``: the headers of the kept pages and of one side of them must
count the rows the page index gives. A column whose pages count values, not rows (V1 pages of
a variable-length list), starts at its first page, so that no row can shift. pyarrow must
decode exactly the rows asked for. Anything else (no page index, a struct or map column,
an encrypted file, a page index that does not match the pages: ``ThriftError``) returns None:
the caller reads another way.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from . import _parquet_seek as seek
from ._parquet_dictionary import ZSTD, stored_dictionary_page
from ._parquet_footer import (
    CHUNK_CRYPTO,
    CHUNK_ENCRYPTED_META,
    CHUNK_INDEXES,
    CHUNK_META,
    FILE_ENCRYPTION_ALGORITHM,
    GROUP_COLUMNS,
    GROUP_NUM_ROWS,
    INT96_DECODE_UNIT,
    META_CODEC,
    META_COMPRESSED,
    META_DATA_OFFSET,
    META_DICT_OFFSET,
    META_NUM_VALUES,
    row_group,
)
from ._parquet_index_cache import ChunkPages, PageIndexes, index_range
from ._parquet_pages import HEADER_READ, Cut, Page, data_page
from ._parquet_seek import _leaves, _values_per_row
from ._parquet_splice import in_place_footer, spliced_bytes
from ._thrift_compact import Struct, ThriftError

Fetch = Callable[[list[tuple[int, int]]], None]


def worth_reading_rows(footer: pq.FileMetaData, unit: int, columns: list[str] | None, start: int, stop: int) -> bool:
    """Whether ``read_range`` should try: every projected column is one leaf with a page index,
    and the column bytes outside [start, stop) cost more to decode than the footer and the page
    headers cost to read in Python (estimated as ``_parquet_seek.worth_seeking`` does)."""
    leaves = seek.leaf_columns(footer, columns)
    if not leaves:
        return False
    group = footer.row_group(unit)
    chunks = [group.column(leaf) for leaf in leaves.values()]
    outside = sum(chunk.total_compressed_size for chunk in chunks) * (group.num_rows - (stop - start)) // max(1, group.num_rows)
    cost = seek.footer_cost(footer) + len(chunks) * 2 * seek.HEADER_COST
    return cost <= outside and all(chunk.has_offset_index for chunk in chunks)


class _Column(NamedTuple):
    """What one projected column reads: its chunk's index, its leaf's level values per row, and
    where its bytes are."""

    name: str
    leaf: int
    chunk: Struct
    start: int  # of the chunk (its dictionary page, if any)
    data: int  # its first data page
    end: int
    num_values: int
    per_row: int | None
    codec: int


class Decoded(NamedTuple):
    """Rows [first, first + table.num_rows) of a row group of ``unit_rows`` rows, all projected
    columns."""

    first: int
    table: pa.Table
    unit_rows: int


def read_range(
    source: Any,
    footer: pq.FileMetaData,
    schema: pa.Schema,
    thrift: Struct,
    unit: int,
    columns: list[str] | None,
    start: int,
    stop: int,
    indexes: PageIndexes,
    fetch: Fetch | None = None,
    threads: bool = False,
) -> Decoded | None:
    """The rows of row group ``unit`` that all projected columns decode when each reads only its
    pages overlapping [start, stop) (``schema``: the file's Arrow schema); None when the file
    cannot be read so (see the module's docstring). ``fetch(ranges)``, if given, is called with
    the byte ranges about to be read (the page indexes not kept yet, then the pages), for a
    source that holds only what it fetched. ``threads``: the columns that start at different
    rows are decoded on threads of their own."""
    if thrift.get(FILE_ENCRYPTION_ALGORITHM) is not None:
        return None
    leaves = _leaves(schema, columns, footer.num_columns)
    if not leaves:
        return None
    group = row_group(thrift, unit)
    group_rows = group.integer(GROUP_NUM_ROWS)
    if not 0 <= start < stop <= group_rows:
        return None  # (a file changed since planning: the caller's read says how)
    chunks = group.structs(GROUP_COLUMNS)
    wanted = []
    for name, leaf in leaves.items():
        chunk = chunks[leaf]
        if chunk.get(CHUNK_CRYPTO) is not None or chunk.get(CHUNK_ENCRYPTED_META) is not None:
            return None
        if chunk.get(CHUNK_INDEXES[0]) is None or not chunk.get(CHUNK_INDEXES[1]):
            return None
        meta = chunk.struct(CHUNK_META)
        data = meta.integer(META_DATA_OFFSET)
        first = min(meta.integer(META_DICT_OFFSET, data) or data, data)
        per_row = _values_per_row(footer, unit, leaf, schema.field(name).type)
        end = first + meta.integer(META_COMPRESSED)
        wanted.append(_Column(name, leaf, chunk, first, data, end, meta.integer(META_NUM_VALUES), per_row, meta.integer(META_CODEC, 0)))
    _load_indexes(source, unit, wanted, group_rows, indexes, fetch)
    spans = {column.name: _span(indexes.get((unit, column.leaf)), column, start, stop, group_rows) for column in wanted}  # type: ignore[arg-type]
    if fetch is not None:
        fetch([r for column in wanted for r in _ranges(column, spans[column.name], indexes.get((unit, column.leaf)))])  # type: ignore[arg-type]
    cuts = {column.name: _cut(source, indexes.get((unit, column.leaf)), column, spans[column.name], group_rows) for column in wanted}  # type: ignore[arg-type]
    first, table = _decode(source, thrift, schema, unit, wanted, cuts, list(leaves), stop, threads, indexes)
    return Decoded(first, table, group_rows)


def _load_indexes(source: Any, unit: int, wanted: list[_Column], group_rows: int, indexes: PageIndexes, fetch: Fetch | None) -> None:
    """Decode the page indexes of ``wanted`` not kept yet (fetched first, in one call)."""
    missing = [column for column in wanted if indexes.get((unit, column.leaf)) is None]
    if fetch is not None and missing:
        fetch([(offset, offset + length) for offset, length in (index_range(column.chunk) for column in missing)])
    for column in missing:
        indexes.load(source, (unit, column.leaf), column.chunk, group_rows, column.name)


class _Span(NamedTuple):
    """The pages ``first``..``last`` (inclusive) a column keeps."""

    first: int
    last: int


def _span(chunk: ChunkPages, column: _Column, start: int, stop: int, group_rows: int) -> _Span:
    """The pages overlapping [start, stop); from the first page for a column whose headers count
    values, not rows (the start could not be checked). Of pages that start at the same row, all
    but the last are empty (pyarrow writes such pages)."""
    first = bisect.bisect_right(chunk.firsts, start) - 1
    last = bisect.bisect_left(chunk.firsts, stop) - 1
    return _Span(0 if column.per_row is None else first, last)


def _ranges(column: _Column, span: _Span, chunk: ChunkPages) -> list[tuple[int, int]]:
    """What ``_cut`` reads of a column: its dictionary page, the kept pages and the first bytes
    of the headers of the side it counts."""
    locations = chunk.locations
    kept_start, last = locations[span.first][0], locations[span.last]
    ranges = [(column.start, column.data), (kept_start, last[0] + last[1])]
    side, _ = _side(chunk, span)
    ranges += [(locations[page][0], locations[page][0] + min(locations[page][1], HEADER_READ)) for page in side if chunk.counts[page] is None]
    return ranges


def _side(chunk: ChunkPages, span: _Span) -> tuple[range, bool]:
    """The pages whose headers check where the kept pages start, and whether they are those
    before them: those before or those after, whichever has fewer not counted yet (none when
    the kept pages start at the first page)."""
    before, after = range(span.first), range(span.last + 1, len(chunk.locations))
    if span.first == 0:
        return before, True
    unknown = lambda pages: sum(chunk.counts[page] is None for page in pages)  # noqa: E731
    return (before, True) if unknown(before) <= unknown(after) else (after, False)


def _cut(source: Any, chunk: ChunkPages, column: _Column, span: _Span, group_rows: int) -> tuple[Cut, int]:
    """The column's cut for ``span``, checked, and its rows."""
    locations = chunk.locations
    values, dictionary = 0, False
    for page in range(span.first, span.last + 1):
        header = chunk.headers[page]
        if header is None:
            offset, size, _ = locations[page]
            header = data_page(source, offset, size)
            chunk.counts[page] = _rows(header, column.per_row)
            chunk.headers[page] = header
        values += header.values
        dictionary = dictionary or header.dictionary
    first_row = chunk.firsts[span.first]
    end_row = chunk.firsts[span.last + 1] if span.last + 1 < len(locations) else group_rows
    if column.per_row is not None:  # (else from the first page: rows cannot shift, pyarrow counts the rest)
        _check(source, chunk, span, first_row, end_row, group_rows, column.per_row)
    kept_start, kept_end = locations[span.first][0], locations[span.last][0] + locations[span.last][1]
    cut = Cut((column.start, column.data - column.start if dictionary else 0), (kept_start, kept_end - kept_start), first_row, values)
    return cut, end_row - first_row


def _rows(header: Page, per_row: int | None) -> int | None:
    if header.rows is not None:
        return header.rows
    if per_row is None:
        return None
    if header.values % per_row:
        raise ThriftError(f"a page holds {header.values} values, not a whole number of rows of {per_row}")
    return header.values // per_row


def _check(source: Any, chunk: ChunkPages, span: _Span, first_row: int, end_row: int, group_rows: int, per_row: int) -> None:
    """The kept pages hold the rows the index gives them, and so do the pages on one side."""
    kept = chunk.counts[span.first : span.last + 1]
    if None in kept or sum(kept) != end_row - first_row:  # type: ignore[arg-type]
        raise ThriftError(f"the pages hold {kept} rows where the page index says {end_row - first_row}")
    side, before = _side(chunk, span)
    for page in side:
        if chunk.counts[page] is None:
            offset, size, _ = chunk.locations[page]
            chunk.counts[page] = _rows(data_page(source, offset, size), per_row)
    counted = [chunk.counts[page] for page in side]
    expected = first_row if before else group_rows - end_row
    if None in counted or sum(counted) != expected:  # type: ignore[arg-type]
        raise ThriftError(f"the pages hold {counted} rows where the page index says {expected}")


def _read(source: Any, offset: int, size: int) -> Any:
    if not size:
        return b""
    # a local file read with os.pread: pyarrow's read_at allocates from its memory pool, which
    # for a fresh megabyte costs several times the copy from the page cache
    data = os.pread(source.fileno(), size, offset) if isinstance(source, pa.OSFile) else source.read_at(size, offset)
    if len(data) != size:
        raise ThriftError(f"{size} bytes at offset {offset} run past the end of the file")
    return data


_Cuts = dict[str, tuple[Cut, int]]


def _in_place(cut: Cut) -> bool:
    """Whether the cut's bytes are one range of the file: no dictionary page, or the dictionary
    page right before its pages."""
    return not cut.dictionary[1] or cut.dictionary[0] + cut.dictionary[1] == cut.pages[0]


def _decode(
    source: Any,
    thrift: Struct,
    schema: pa.Schema,
    unit: int,
    wanted: list[_Column],
    cuts: _Cuts,
    names: list[str],
    stop: int,
    threads: bool,
    indexes: PageIndexes,
) -> tuple[int, pa.Table]:
    """Decode the cuts up to row ``stop``, those starting at the same row as one file each, and
    keep the rows all have. (pyarrow decodes the rows a file's footer says it has, and no more of
    the pages that hold more.) With ``threads``, each file but the last is decoded on a thread
    (pyarrow lets go of the GIL) while this one prepares the next (its footer: Python)."""
    by_first: dict[int, list[_Column]] = {}
    for column in wanted:
        by_first.setdefault(cuts[column.name][0].first_row, []).append(column)
    first = max(by_first)
    # the largest first (by kept bytes), so that its decoding starts while the others are prepared
    groups = sorted(by_first.items(), key=lambda item: -sum(cuts[c.name][0].dictionary[1] + cuts[c.name][0].pages[1] for c in item[1]))

    def decode(file: pq.ParquetFile, group_names: list[str], rows: int, first_row: int) -> pa.Table:
        table = file.read(columns=group_names, use_threads=False)
        if table.num_rows != rows:
            raise ThriftError(f"the pages of {group_names} decode to {table.num_rows} rows where the page index says {rows}")
        return table.slice(first - first_row)

    futures, tables = [], []
    for index, (first_row, group) in enumerate(groups):
        job = (*_prepared(source, thrift, schema, unit, group, cuts, stop - first_row, indexes), first_row)
        if threads and index < len(groups) - 1:  # (this thread decodes the last)
            futures.append(_pool().submit(decode, *job))
        else:
            tables.append(decode(*job))
    tables += [future.result() for future in futures]
    decoded = {name: table.column(name) for table in tables for name in table.column_names}
    fields = [schema.field(name) for name in names]
    return first, pa.Table.from_arrays([decoded[name] for name in names], schema=pa.schema(fields, metadata=schema.metadata))


def _prepared(
    source: Any, thrift: Struct, schema: pa.Schema, unit: int, group: list[_Column], cuts: _Cuts, rows: int, indexes: PageIndexes
) -> tuple[pq.ParquetFile, list[str], int]:
    """One file of the cuts of ``group`` (columns that start at the same row) ending after ``rows``
    rows: (the file, its columns, ``rows``). A zstd dictionary
    page of many values goes in with its values stored, decompressed once (``_parquet_dictionary``)."""
    group.sort(key=lambda column: column.leaf)
    names = [c.name for c in group]
    stored = {c.leaf: _stored_dictionary(source, indexes, unit, c, cuts[c.name][0]) for c in group}
    if isinstance(source, pa.NativeFile) and not any(stored.values()) and all(_in_place(cuts[c.name][0]) for c in group):
        # pyarrow reads the kept pages from the file itself, under a footer of their own
        metadata = in_place_footer(thrift, schema, unit, {c.leaf: (c.name, cuts[c.name][0]) for c in group}, rows)
        return pq.ParquetFile(source, metadata=metadata, pre_buffer=False, coerce_int96_timestamp_unit=INT96_DECODE_UNIT), names, rows
    held = {}
    for c in group:
        cut, dictionary = cuts[c.name][0], stored[c.leaf]
        if dictionary is None:
            dictionary = _read(source, *cut.dictionary)
        else:
            cut = dataclasses.replace(cut, dictionary=(cut.dictionary[0], len(dictionary)))
        held[c.leaf] = (c.name, cut, dictionary, _read(source, *cut.pages))
    data = spliced_bytes(thrift, schema, unit, held, rows)
    return pq.ParquetFile(pa.BufferReader(data), pre_buffer=False, coerce_int96_timestamp_unit=INT96_DECODE_UNIT), names, rows


def _stored_dictionary(source: Any, indexes: PageIndexes, unit: int, column: _Column, cut: Cut) -> bytes | None:
    """The cut's zstd dictionary page with its values stored, kept per chunk; None for a cut
    without one or a page that is better read as it is."""
    if column.codec != ZSTD or not cut.dictionary[1]:
        return None

    def make() -> bytes | None:
        try:
            return stored_dictionary_page(_read(source, *cut.dictionary))
        except (ThriftError, pa.ArrowException):  # (pyarrow's read of the page as it is says what is wrong)
            return None

    return indexes.dictionary((unit, column.leaf), make)


_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="tdu-parquet-range")
    return _POOL


def _forget_pool() -> None:
    """In a forked child (a DataLoader worker): the parent's pool threads do not run there, and
    work handed to its copy would wait for them for ever."""
    global _POOL
    _POOL = None


os.register_at_fork(after_in_child=_forget_pool)
